/**
 * `agentfly serve --model-dir DIR [--checkpoint RUN/checkpoints/step-NNNNNN] [--host 127.0.0.1] [--port 8000]
 * [limits…]`: serves a model folder over an OpenAI-compatible HTTP API (see `actors/OpenAiServer.ts`) until
 * interrupted; with `--checkpoint`, the folder's model with a training run's weights at that checkpoint (checked as
 * `agentfly eval --checkpoint` checks them).
 *
 * The limits are `OpenAiServer.Options` with the same defaults: `--max-body-bytes`, `--max-prompts` (per
 * `/v1/completions` request), `--max-request-tokens` (prompt tokens plus `max_tokens` per prompt, summed over a
 * request) and `--max-running-per-request` (sequences of one request in the batch at once; the server keeps at most
 * `--max-batch-size` sequences in the engine, its batch).
 *
 * `--accept-weights` lets a training run push its weights to this server as it learns (`PUT /v1/weights`, a run
 * with `engine.servers`); when `AGENTFLY_WEIGHTS_TOKEN` is set, only requests bearing it may replace them.
 *
 * **Tokens.** With `AGENTFLY_SERVE_TOKEN` set (or `--token-file FILE`, one token a line), every route requires
 * `Authorization: Bearer` one of them; `AGENTFLY_WEIGHTS_TOKEN` is accepted on every route too (folded in). Without
 * any token only loopback hosts are allowed: `--host 0.0.0.0` without one is refused at start.
 *
 * @since 0.1.0
 */
import { Console, Effect, Option } from "effect"
import { Command, Flag } from "effect/cli"
import * as Auth from "../actors/internal/auth.ts"
import { visionOf } from "../actors/internal/localVersions.ts"
import * as OpenAiServer from "../actors/OpenAiServer.ts"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import { verifiedCheckpoint } from "./eval.ts"
import { exitOnFailure } from "./train.ts"

/** A positive integer flag with a default. */
const count = (name: string, description: string, value: number) =>
  Flag.Int(name).pipe(
    Flag.withDescription(description),
    Flag.withDefault(value),
    Flag.filter((n) => n >= 1, (n) => `--${name} must be at least 1, got ${n}`)
  )

/**
 * The flags of a command that samples with a trained policy (`serve`, `gateway`): its checkpoint, and the tool
 * lists its training left out of the prompt.
 *
 * @category flags
 * @since 0.1.0
 */
export const trainedPolicyFlags = {
  checkpoint: Flag.Directory("checkpoint").pipe(
    Flag.withDescription("Sample with a training run's weights at this checkpoint (RUN/checkpoints/step-NNNNNN)"),
    Flag.optional
  ),
  omitToolSchemas: Flag.Boolean("omit-tool-schemas").pipe(
    Flag.withDescription(
      "Leave a chat request's tools out of the prompt (a policy trained with agent.renderTools: false); its tool " +
        "calls are still parsed"
    ),
    Flag.withDefault(false)
  )
}

/**
 * A model folder, or a run's checkpoint of it, on a local engine: what `serve` and the gateway answer with. A folder
 * with a tower (`tiny-vl`) gets an engine that runs it; a checkpoint's weights answer with the run's policy version
 * at that step (the folder's are 0).
 */
export const servedPolicy = Effect.fnUntraced(function*(
  modelDir: string,
  checkpoint: string | undefined,
  engineOptions: { readonly maxBatchSize?: number; readonly intraOpNumThreads?: number }
) {
  const folder = yield* ModelFolder.load(modelDir)
  const trained = checkpoint === undefined
    ? undefined
    : yield* verifiedCheckpoint(checkpoint, ModelFolder.parameters(folder))
  const vision = visionOf(folder)
  const engine = yield* PolicyEngine.make({
    config: folder.config,
    weights: trained?.weights ?? folder.weights,
    ...(vision === undefined ? {} : { vision }),
    version: trained?.policyVersion ?? 0,
    ...engineOptions
  })
  return { folder, trained, engine }
})

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
    ...trainedPolicyFlags,
    acceptWeights: Flag.Boolean("accept-weights").pipe(
      Flag.withDescription(
        "Let a training run push new weights (PUT /v1/weights; with AGENTFLY_WEIGHTS_TOKEN set, only with that " +
          "bearer token, which every route then also takes)"
      ),
      Flag.withDefault(false)
    ),
    tokenFile: Flag.String("token-file").pipe(
      Flag.withDescription("A file of bearer tokens (one a line) every request must bear, beside AGENTFLY_SERVE_TOKEN"),
      Flag.optional
    ),
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(
      Flag.withDescription("Port to listen on (0: any free port)"),
      Flag.withDefault(8000),
      Flag.filter((p) => p >= 0 && p <= 65535, (p) => `--port must be in [0, 65535], got ${p}`)
    ),
    maxBatchSize: count("max-batch-size", "Most sequences decoded together (and in the engine at once)", 32),
    threads: Flag.Int("threads").pipe(
      Flag.withDescription("onnxruntime intra-op threads (default: 1 for models under 50 M parameters, else every core)"),
      Flag.filter((n) => n >= 1, (n) => `--threads must be at least 1, got ${n}`),
      Flag.optional
    ),
    maxBodyBytes: count("max-body-bytes", "Largest request body accepted", OpenAiServer.defaults.maxBodyBytes),
    maxPrompts: count("max-prompts", "Most prompts in one /v1/completions request", OpenAiServer.defaults.maxPrompts),
    maxRequestTokens: count(
      "max-request-tokens",
      "Most tokens one request may ask for: its prompts' tokens plus max_tokens per prompt",
      OpenAiServer.defaults.maxRequestTokens
    ),
    maxRunningPerRequest: count(
      "max-running-per-request",
      "Most sequences of one request in the batch at once (lower: latency beside large requests; higher: a lone " +
        "many-prompt request's throughput)",
      OpenAiServer.defaults.maxRunningPerRequest
    )
  },
  Effect.fn("serve")(function*(
    { modelDir, checkpoint, omitToolSchemas, acceptWeights, host, port, maxBatchSize, threads, tokenFile, ...rest }
  ) {
    // Checked before the model loads: a refused bind says so at once.
    const token = Auth.fromEnv("AGENTFLY_WEIGHTS_TOKEN")
    const tokens = yield* Auth.forServer({
      env: ["AGENTFLY_SERVE_TOKEN"],
      file: Option.getOrUndefined(tokenFile),
      host,
      also: [token]
    })
    const from = Option.getOrUndefined(checkpoint)
    const { folder, trained, engine } = yield* servedPolicy(modelDir, from, {
      maxBatchSize,
      ...(Option.isSome(threads) ? { intraOpNumThreads: threads.value } : {})
    })
    const options: OpenAiServer.Options = {
      host,
      port,
      maxRunning: maxBatchSize,
      renderTools: !omitToolSchemas,
      // The weights token is a token of this server (folded in): without --accept-weights it guards sampling too.
      token: acceptWeights || token === undefined ? tokens : [...tokens, token],
      ...(acceptWeights ? { acceptWeights: { token }, loraBase: trained?.weights ?? folder.weights } : {}),
      ...rest
    }
    const server = yield* OpenAiServer.make(folder, options).pipe(
      Effect.provideService(PolicyEngine.PolicyEngine, engine)
    )
    yield* Console.log(
      `serving ${folder.name}${from === undefined ? "" : ` with the weights of ${from}`} (qwen2, vocab ` +
        `${folder.config.vocabSize}) at ${server.baseUrl}` +
        (acceptWeights ? `, accepting weights${token ? " with a token" : ""} (PUT /v1/weights)` : "") +
        (tokens.length > 0 || token !== undefined ? "; requests must bear a token" : "")
    )
    return yield* Effect.never
  }, Effect.scoped, exitOnFailure)
).pipe(Command.withDescription("Serve a model folder over an OpenAI-compatible HTTP API"))
