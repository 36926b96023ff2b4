/**
 * `agentfly rollout-worker CONFIG [--host 127.0.0.1] [--port 8300] [--queue redis://… [--concurrency 2]]`: runs a
 * training run's rollouts for its trainer, here or on another machine, until interrupted: listening for the shares
 * its trainer sends (`rollout.workers`, `actors/RolloutWorker.ts`) or, with `--queue`, taking them from the run's
 * Redis queue (`rollout.queue`, `actors/RolloutQueue.ts`). It loads the
 * run's own config and task (the same file the trainer runs, so that its agent key matches), the model folder's
 * tokenizer and template (`model.path`, which must exist), and samples on the run's `engine.servers` (sending
 * `AGENTFLY_SERVE_TOKEN`, if set, as the run does). With `AGENTFLY_WORKER_TOKEN` (or `--token-file`) set, only
 * requests bearing it are served (the trainer sends its own), and every answer is signed with it; without one the
 * worker listens on loopback only (and takes shares only from a queue on loopback).
 *
 * @since 0.1.0
 */
import { Console, Effect, Option } from "effect"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as ChainFormat from "../actors/ChainFormat.ts"
import * as InferenceServers from "../actors/InferenceServers.ts"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as RolloutQueue from "../actors/RolloutQueue.ts"
import * as RolloutWorker from "../actors/RolloutWorker.ts"
import * as RolloutSetup from "../actors/RolloutSetup.ts"
import { runError, type RunError } from "../actors/RunError.ts"
import * as Auth from "../actors/internal/auth.ts"
import * as LocalVersions from "../actors/internal/localVersions.ts"
import * as LoraCarrier from "../actors/internal/loraCarrier.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as TrainConfig from "../src/TrainConfig.ts"
import * as Setup from "./setup.ts"
import { exitOnFailure } from "./train.ts"

const workerError = (message: string) => runError("Workers", message)

/**
 * @category commands
 * @since 0.1.0
 */
export const rolloutWorker = Command.make(
  "rollout-worker",
  {
    config: Argument.String("config").pipe(
      Argument.withDescription("The run's config (the same file its trainer runs)")
    ),
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(
      Flag.withDescription("Port to listen on (0: any free port)"),
      Flag.withDefault(8300),
      Flag.filter((p) => p >= 0 && p <= 65535, (p) => `--port must be in [0, 65535], got ${p}`)
    ),
    queue: Flag.String("queue").pipe(
      Flag.withDescription("Take shares from this Redis queue (the run's rollout.queue) instead of listening"),
      Flag.optional
    ),
    concurrency: Flag.Int("concurrency").pipe(
      Flag.withDescription("With --queue: shares run at once"),
      Flag.withDefault(2),
      Flag.filter((n) => n >= 1 && n <= 256, (n) => `--concurrency must be in [1, 256], got ${n}`)
    ),
    tokenFile: Flag.String("token-file").pipe(
      Flag.withDescription("Accepted tokens, one a line, besides AGENTFLY_WORKER_TOKEN (with --queue: the first)"),
      Flag.optional
    ),
    claimSeconds: Flag.Int("claim-seconds").pipe(
      Flag.withDescription("With --queue: take over a share another worker left untouched this long"),
      Flag.withDefault(30),
      Flag.filter((n) => n >= 1, (n) => `--claim-seconds must be at least 1, got ${n}`)
    )
  },
  Effect.fn("rollout-worker")(function*({ config: file, host, port, queue, concurrency, claimSeconds, tokenFile }) {
    // Tokens first: a worker that would serve strangers stops before it loads anything.
    const tokens = yield* Auth.forServer({
      env: ["AGENTFLY_WORKER_TOKEN"],
      file: Option.getOrUndefined(tokenFile),
      host: Option.isSome(queue) ? "127.0.0.1" : host
    })
    const { task, config: requested } = yield* Setup.load(file)
    const urls = requested.engine.servers
    if (urls === undefined) {
      return yield* workerError(
        `${file} lists no engine.servers: rollout workers sample on the run's inference servers ` +
          "(agentfly serve --accept-weights)"
      )
    }
    const folder = yield* ModelFolder.load(requested.model.path)
    const config = TrainConfig.onModel(requested, folder.config)
    // A task module's environment needs only what a run provides (the resource manager), as in `Train.runConfig`.
    const format = ChainFormat.ofConfig(config, folder)
    const setup = yield* (RolloutSetup.make({ task, config, format }) as Effect.Effect<
      RolloutSetup.RolloutSetup,
      RunError,
      ResourceManager.ResourceManager | Scope.Scope
    >)
    // A worker samples; the run (or its trainer server) pushes the weights: it needs no AGENTFLY_WEIGHTS_TOKEN.
    const servers = yield* InferenceServers.make({
      urls,
      parameters: Qwen2.parameters(folder.config),
      pushes: false,
      // A LoRA run's requests name its newest adapter, as the trainer's own do (else the servers would sample the
      // base), and every answer is checked against the digest the trainer published in that name.
      ...(config.model.lora === undefined ? {} : {
        model: LocalVersions.adapterName,
        carrier: LoraCarrier.follower(LocalVersions.adapterName, {
          token: process.env["AGENTFLY_SERVE_TOKEN"] || process.env["AGENTFLY_WEIGHTS_TOKEN"] || undefined
        })
      }),
      timeoutMs: config.engine.timeoutSeconds === undefined ? undefined : config.engine.timeoutSeconds * 1000
    })
    const key = RolloutWorker.agentKey(task.name, config)
    if (Option.isSome(queue)) {
      yield* Console.log(
        `rollout worker for task ${task.name} (agent key ${key}, run ${RolloutWorker.runId(task.name, config)}) ` +
          `on the queue ${queue.value}, ${concurrency} share(s) ` +
          `at once, sampling on ${urls.length} inference server${urls.length === 1 ? "" : "s"}`
      )
      return yield* RolloutQueue.work(setup, servers, key, {
        url: queue.value,
        concurrency,
        claimSeconds,
        token: tokens[0],
        onShare: (id, rows, claimed) =>
          Console.log(`share ${id}: ${rows} row(s)${claimed ? ", claimed from a worker that stopped" : ""}`)
      })
    }
    const worker = yield* RolloutWorker.serve(setup, servers, { host, port, tokens })
    yield* Console.log(
      `rollout worker for task ${task.name} (agent key ${key}) at ` +
        `${worker.baseUrl}, sampling on ${urls.length} inference server${urls.length === 1 ? "" : "s"}` +
        (tokens.length === 0 ? "" : ", requests must bear AGENTFLY_WORKER_TOKEN")
    )
    return yield* Effect.never
  }, Effect.scoped, Effect.provide(ResourceManager.ResourceManager.layer), exitOnFailure)
).pipe(Command.withDescription("Run a training run's rollouts for its trainer (rollout.workers)"))
