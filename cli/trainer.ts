/**
 * `agentfly trainer [--host 127.0.0.1] [--port 8400] [--workers N] [--idle-minutes 60] [--device cpu|cuda]`: serves the
 * learner's forward/backward passes and optimiser steps to runs whose `learner.url` points here, until interrupted (see
 * `actors/TrainerServer.ts`). It needs no model folder: each run sends its model's config and weights. With
 * `AGENTFLY_TRAINER_TOKEN` set (or `--token-file FILE`, one token a line), only requests bearing it are served (the run
 * sends its own); a `--host` beyond loopback without a token is refused at start.
 *
 * @since 0.1.0
 */
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as Auth from "../actors/internal/auth.ts"
import * as TrainerServer from "../actors/TrainerServer.ts"
import { exitOnFailure } from "./train.ts"

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
      Flag.withDescription("Learner threads per trainer (default: the run's learner.workers)"),
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
    )
  },
  Effect.fn("trainer")(function*({ host, port, workers, idleMinutes, device, tokenFile, allowPushUrl }) {
    const file = Option.getOrUndefined(tokenFile)
    const tokens = yield* Auth.forServer({ env: ["AGENTFLY_TRAINER_TOKEN"], file, host })
    const server = yield* TrainerServer.serve({
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
    return yield* Effect.never
  }, Effect.scoped, exitOnFailure)
).pipe(Command.withDescription("Serve the learner's steps to runs elsewhere (learner.url)"))
