/**
 * `agentfly serve --model-dir DIR [--host 127.0.0.1] [--port 8000]`: serves a model folder over an
 * OpenAI-compatible HTTP API (see `actors/OpenAiServer.ts`) until interrupted.
 *
 * @since 0.1.0
 */
import { Console, Effect } from "effect"
import { Command, Flag } from "effect/cli"
import * as OpenAiServer from "../actors/OpenAiServer.ts"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as ModelFolder from "../src/ModelFolder.ts"

/**
 * @category commands
 * @since 0.1.0
 */
export const serve = Command.make(
  "serve",
  {
    modelDir: Flag.Directory("model-dir", { mustExist: true }).pipe(
      Flag.withDescription("A model folder: config.json, model.safetensors, tokenizer.json, tokenizer_config.json")
    ),
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(Flag.withDescription("Port to listen on (0: any free port)"), Flag.withDefault(8000)),
    maxBatchSize: Flag.Int("max-batch-size").pipe(
      Flag.withDescription("Most sequences decoded together"),
      Flag.withDefault(32)
    ),
    threads: Flag.Int("threads").pipe(Flag.withDescription("onnxruntime intra-op threads"), Flag.withDefault(1))
  },
  Effect.fn("serve")(function*({ modelDir, host, port, maxBatchSize, threads }) {
    const folder = yield* ModelFolder.load(modelDir)
    const engine = yield* PolicyEngine.make({
      config: folder.config,
      weights: folder.weights,
      maxBatchSize,
      intraOpNumThreads: threads
    })
    const server = yield* OpenAiServer.make(folder, { host, port }).pipe(
      Effect.provideService(PolicyEngine.PolicyEngine, engine)
    )
    yield* Console.log(`serving ${folder.name} (qwen2, vocab ${folder.config.vocabSize}) at ${server.baseUrl}`)
    return yield* Effect.never
  }, Effect.scoped)
).pipe(Command.withDescription("Serve a model folder over an OpenAI-compatible HTTP API"))
