/**
 * `agentfly trainer [--host 127.0.0.1] [--port 8400] [--workers N] [--idle-minutes 60] [--device cpu|cuda]`: serves the
 * learner's forward/backward passes and optimiser steps to runs whose `learner.url` points here, until interrupted (see
 * `actors/TrainerServer.ts`). It needs no model folder: each run sends its model's config and weights. With
 * `AGENTFLY_TRAINER_TOKEN` set (or `--token-file FILE`, one token a line), only requests bearing it are served (the run
 * sends its own); a `--host` beyond loopback without a token is refused at start.
 *
 * With `--tinker-model` (a model folder, `NAME=FOLDER`, or a preset `tiny|small|medium`; repeatable) it also serves the
 * Tinker API on the same port under `/api/v1/` (`actors/tinker/TinkerServer.ts`, `docs/tinker.md`): `create_model`
 * names one of these base models. Requests must bear `X-API-Key` with a key of `AGENTFLY_TINKER_API_KEY` or
 * `--tinker-api-key-file` (none: loopback only). `--tinker-state-dir` keeps the request log and checkpoints, so a
 * server started again on it resumes every model and pending future.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as Auth from "../actors/internal/auth.ts"
import * as Models from "../actors/tinker/Models.ts"
import * as TinkerServer from "../actors/tinker/TinkerServer.ts"
import * as TrainerServer from "../actors/TrainerServer.ts"
import type * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import { exitOnFailure } from "./train.ts"

const presetNames: ReadonlyArray<string> = ["tiny", "small", "medium"] satisfies ReadonlyArray<ModelConfig.PresetName>

/** A `--tinker-model` as a base model: a preset's fresh folder (seed 0, under the state directory) or a folder. */
const baseModel = Effect.fnUntraced(function*(spec: string, stateDir: string) {
  const fs = yield* FileSystem.FileSystem
  const eq = spec.indexOf("=")
  const name = eq > 0 ? spec.slice(0, eq) : spec.replace(/\/+$/, "").split("/").pop()!
  const path = eq > 0 ? spec.slice(eq + 1) : spec
  if (presetNames.includes(path)) {
    const dir = `${stateDir}/bases/${path}`
    // The same seed every start: a restarted server's models replay onto the same base.
    if (!(yield* fs.exists(`${dir}/config.json`))) {
      yield* ModelFolder.init(dir, { preset: path as ModelConfig.PresetName, seed: 0 })
    }
    return Models.baseOf(name, yield* ModelFolder.load(dir))
  }
  return Models.baseOf(name, yield* ModelFolder.load(path))
})

/** The Tinker API's handler for the flags given, or none without `--tinker-model`. */
const tinkerHandler = Effect.fnUntraced(function*(options: {
  readonly models: ReadonlyArray<string>
  readonly stateDir: string | undefined
  readonly keyFile: string | undefined
  readonly quota: number | undefined
  readonly snapshotEvery: number
  readonly workers: number | undefined
}) {
  if (options.models.length === 0) return undefined
  const fs = yield* FileSystem.FileSystem
  const stateDir = options.stateDir ?? (yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-tinker-" }))
  yield* fs.makeDirectory(stateDir, { recursive: true })
  const bases = yield* Effect.forEach(options.models, (spec) => baseModel(spec, stateDir))
  const keys = yield* Auth.load(fs, { env: ["AGENTFLY_TINKER_API_KEY"], file: options.keyFile })
  const { quota, snapshotEvery, workers } = options
  const handler = yield* TinkerServer.make({ bases, stateDir, apiKeys: keys, quota, snapshotEvery, workers })
  return { handler, bases, keys, stateDir }
})

/**
 * @category commands
 * @since 0.1.0
 */
export const trainer = Command.make(
  "trainer",
  {
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(
      Flag.withDescription("Port to listen on (0: any free port)"),
      Flag.withDefault(8400),
      Flag.filter((p) => p >= 0 && p <= 65535, (p) => `--port must be in [0, 65535], got ${p}`)
    ),
    workers: Flag.Int("workers").pipe(
      Flag.withDescription("Learner threads per trainer (default: the run's learner.workers; 1 per Tinker model)"),
      Flag.filter((w) => w >= 1 && w <= 64, (w) => `--workers must be in [1, 64], got ${w}`),
      Flag.optional
    ),
    idleMinutes: Flag.Int("idle-minutes").pipe(
      Flag.withDescription("Close a trainer no call reached for this long (a run killed without closing it)"),
      Flag.withDefault(60),
      Flag.filter((m) => m >= 1, (m) => `--idle-minutes must be at least 1, got ${m}`)
    ),
    tokenFile: Flag.String("token-file").pipe(
      Flag.withDescription("A file of bearer tokens (one a line) requests must bear, beside AGENTFLY_TRAINER_TOKEN"),
      Flag.optional
    ),
    allowPushUrl: Flag.String("allow-push-url").pipe(
      Flag.withDescription("An inference-server URL prefix pushes may reach (repeatable; default: any the run names)"),
      Flag.atLeast(0)
    ),
    device: Flag.Literals("device", ["cpu", "cuda"]).pipe(
      Flag.withDescription("onnxruntime's execution provider"),
      Flag.withDefault("cpu" as const)
    ),
    tinkerModel: Flag.String("tinker-model").pipe(
      Flag.withDescription("Serve the Tinker API with this base model: FOLDER, NAME=FOLDER or a preset (repeatable)"),
      Flag.atLeast(0)
    ),
    tinkerStateDir: Flag.String("tinker-state-dir").pipe(
      Flag.withDescription("The Tinker API's request log and checkpoints (default: a temporary directory)"),
      Flag.optional
    ),
    tinkerApiKeyFile: Flag.String("tinker-api-key-file").pipe(
      Flag.withDescription("A file of API keys (one a line) for X-API-Key, beside AGENTFLY_TINKER_API_KEY"),
      Flag.optional
    ),
    tinkerSnapshotEvery: Flag.Int("tinker-snapshot-every").pipe(
      Flag.withDescription("Snapshot a model's state every N sampler publications (0: never); restarts replay from it"),
      Flag.withDefault(20),
      Flag.filter((n) => n >= 0, (n) => `--tinker-snapshot-every must be at least 0, got ${n}`)
    ),
    tinkerQuota: Flag.Int("tinker-quota").pipe(
      Flag.withDescription("Most Tinker futures accepted per API key, 429 past it (a simulated quota, for tests)"),
      Flag.optional
    )
  },
  Effect.fn("trainer")(function*({ host, port, workers, idleMinutes, device, tokenFile, allowPushUrl, ...flags }) {
    const file = Option.getOrUndefined(tokenFile)
    const tokens = yield* Auth.forServer({ env: ["AGENTFLY_TRAINER_TOKEN"], file, host })
    const tinker = yield* tinkerHandler({
      models: flags.tinkerModel,
      stateDir: Option.getOrUndefined(flags.tinkerStateDir),
      keyFile: Option.getOrUndefined(flags.tinkerApiKeyFile),
      quota: Option.getOrUndefined(flags.tinkerQuota),
      snapshotEvery: flags.tinkerSnapshotEvery,
      workers: Option.getOrUndefined(workers)
    })
    const problem = tinker === undefined ? undefined :
      Auth.bindProblem(host, Auth.tokens(tinker.keys), "AGENTFLY_TINKER_API_KEY or --tinker-api-key-file")
    if (problem !== undefined) return yield* Effect.fail(new Error(problem))
    const server = yield* TrainerServer.serve({
      tinker: tinker?.handler,
      host,
      port,
      token: tokens,
      ...(allowPushUrl.length === 0 ? {} : { allowPushUrls: allowPushUrl }),
      workers: Option.getOrUndefined(workers),
      executionProvider: device,
      idleMillis: idleMinutes * 60_000,
      onInit: (name, parameters, threads) =>
        Console.log(`trainer ${name}: ${(parameters / 1e6).toFixed(2)} M parameters, ${threads} worker(s), ${device}`)
    })
    yield* Console.log(
      `agentfly trainer at ${server.baseUrl} (${device})` +
        (tokens.length === 0 ? "" : ", requests must bear a token")
    )
    if (tinker !== undefined) {
      yield* Console.log(
        `Tinker API at http://${host}:${server.port}/api/v1 ` +
          `(base models ${tinker.bases.map((b) => b.name).join(", ")}` +
          `; state in ${tinker.stateDir}${tinker.keys.length === 0 ? "" : "; requests must bear X-API-Key"})`
      )
    }
    return yield* Effect.never
  }, Effect.scoped, exitOnFailure)
).pipe(Command.withDescription("Serve the learner's steps to runs elsewhere (learner.url)"))
