/**
 * `agentfly gateway --model-dir DIR [--checkpoint RUN/checkpoints/step-N] [--omit-tool-schemas] [--upstream URL
 * --upstream-model NAME] [--port 8100] [--output FILE]`: the
 * recording gateway (`actors/Gateway.ts`) in serving mode, until interrupted. Point any OpenAI SDK (chat completions
 * or Responses) at `http://HOST:PORT/episodes/<ID>/v1`, and Anthropic's SDK or Claude Code (`ANTHROPIC_BASE_URL`) at
 * `http://HOST:PORT/episodes/<ID>` (a fresh `<ID>` per episode; `docs/gateway.md`); an episode opens with its first
 * request, ends with `POST /episodes/<ID>/reward {"reward": r}` (or `POST /episodes/<ID>/end`), and is abandoned
 * (masked) after `--idle-timeout` seconds without a request. Every finished episode is appended to `--output` as one JSON line:
 * `{ trajectory, threads }` (the token-level trajectory and each thread's segments). A request answered with an error
 * (400 `context_length_exceeded`, a bad field, ...) is not recorded, and an episode with nothing recorded is not
 * written.
 *
 * Sampling is on the model folder's weights (the local engine), or, with `--upstream`, on an OpenAI-compatible
 * server that returns token ids and logprobs (vLLM, SGLang, `agentfly serve`); the folder then gives only the
 * tokenizer and the chat template. With `--checkpoint`, a training run's weights at that checkpoint sample (checked
 * as `agentfly eval --checkpoint` checks them); `--omit-tool-schemas` leaves the requests' tools out of the prompt,
 * as a policy trained with `agent.renderTools: false` expects. A request's own `temperature`, `top_p`, `seed` and
 * `max_tokens` are honoured.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option, Redacted } from "effect"
import type { Scope } from "effect"
import { Command, Flag } from "effect/cli"
import { FetchHttpClient } from "effect/http"
import * as ChainFormat from "../actors/ChainFormat.ts"
import * as Auth from "../actors/internal/auth.ts"
import * as Gateway from "../actors/Gateway.ts"
import * as OpenAiCompatSampler from "../src/backends/OpenAiCompatSampler.ts"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import { Sampler } from "../src/Sampler.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import { servedPolicy, trainedPolicyFlags } from "./serve.ts"
import { exitOnFailure } from "./train.ts"

/**
 * What `agentfly gateway` runs with.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly modelDir: string
  /** A training run's checkpoint whose weights sample instead of the folder's. */
  readonly checkpoint?: string | undefined
  /** Render the requests' tools into the prompt (default true). */
  readonly renderTools?: boolean | undefined
  readonly upstream?: { readonly baseUrl: string; readonly model: string } | undefined
  readonly host: string
  readonly port: number
  /** JSONL file finished episodes are appended to. */
  readonly output: string
  readonly idleTimeoutSeconds: number
  readonly maxNewTokens: number
  readonly maxContextTokens?: number | undefined
  readonly temperature: number
  /** onnxruntime intra-op threads (default `PolicyEngine.defaultThreads`). */
  readonly threads?: number | undefined
  /** A file of client tokens, one a line, beside `AGENTFLY_GATEWAY_TOKEN` (`Gateway.Options.tokens`). */
  readonly tokenFile?: string | undefined
  /** Most episodes open at once (default 1024). */
  readonly maxEpisodes?: number | undefined
}

/**
 * Starts the gateway in the current scope and returns it (the command then waits forever).
 *
 * @category constructors
 * @since 0.1.0
 */
export const start = Effect.fn("cli.gateway.start")(function*(
  options: Options
): Effect.fn.Return<
  Gateway.Gateway["Service"],
  unknown,
  FileSystem.FileSystem | import("effect").Path.Path | Scope.Scope
> {
  // Checked before the model loads: a refused bind says so at once.
  const tokens = yield* Auth.forServer({ env: ["AGENTFLY_GATEWAY_TOKEN"], file: options.tokenFile, host: options.host })
  const fs = yield* FileSystem.FileSystem
  let sampler: Sampler["Service"]
  let tokenizer: Tokenizer.Tokenizer
  let template: ChatTemplate.ChatTemplate
  let name: string
  let positions: number | undefined
  if (options.upstream === undefined) {
    const { folder, engine } = yield* servedPolicy(options.modelDir, options.checkpoint, {
      ...(options.threads === undefined ? {} : { intraOpNumThreads: options.threads })
    })
    sampler = Sampler.of({ generate: (r) => engine.generate(r), policyVersion: engine.policyVersion })
    ;({ tokenizer, template, name } = folder)
    positions = folder.config.maxPositionEmbeddings
  } else {
    if (options.checkpoint !== undefined) {
      return yield* Effect.fail(
        new Error("--checkpoint needs the local engine: with --upstream the upstream's weights sample")
      )
    }
    tokenizer = yield* Tokenizer.load(options.modelDir)
    template = yield* ChatTemplate.load(options.modelDir)
    name = options.upstream.model
    // An `agentfly serve` upstream started with a token takes AGENTFLY_SERVE_TOKEN (a vLLM one, its API key).
    const upstreamToken = Auth.fromEnv("AGENTFLY_SERVE_TOKEN")
    sampler = yield* OpenAiCompatSampler.make({
      baseUrl: options.upstream.baseUrl,
      model: options.upstream.model,
      apiKey: upstreamToken === undefined ? undefined : Redacted.make(upstreamToken)
    }).pipe(
      Effect.provide(FetchHttpClient.layer)
    )
  }
  const output = options.output
  const gateway = yield* Gateway.make({
    host: options.host,
    port: options.port,
    model: name,
    tokens,
    maxEpisodes: options.maxEpisodes,
    autoOpen: {
      episode: {
        format: ChainFormat.fromTemplate({ tokenizer, template }),
        sampler,
        sampling: { temperature: options.temperature, maxTokens: options.maxNewTokens },
        requestSampling: "honour",
        maxContextTokens: options.maxContextTokens ?? positions,
        renderTools: options.renderTools ?? true,
        tokenizer
      },
      idleTimeout: `${options.idleTimeoutSeconds} seconds`,
      onEnd: (finished) =>
        fs.writeFileString(output, JSON.stringify(finished) + "\n", { flag: "a" }).pipe(
          Effect.catch((e) => Console.error(`cannot append to ${output}: ${e.message}`))
        )
    }
  })
  yield* Console.log(
    `gateway for ${name} at ${gateway.url}: use ${gateway.url}/episodes/<ID>/v1 as the base URL ` +
      `(Anthropic's SDK: ${gateway.url}/episodes/<ID>); finished episodes → ${output}`
  )
  return gateway
})

/**
 * @category commands
 * @since 0.1.0
 */
export const gateway = Command.make(
  "gateway",
  {
    modelDir: Flag.Directory("model-dir", { mustExist: true }).pipe(
      Flag.withDescription("A model folder: its weights sample (or, with --upstream, only its tokenizer and template)")
    ),
    ...trainedPolicyFlags,
    upstream: Flag.String("upstream").pipe(
      Flag.withDescription("An OpenAI-compatible API root that returns token ids and logprobs (vLLM, SGLang)"),
      Flag.optional
    ),
    upstreamModel: Flag.String("upstream-model").pipe(Flag.withDescription("The upstream's model name"), Flag.optional),
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(
      Flag.withDescription("Port to listen on (0: any free port)"),
      Flag.withDefault(8100),
      Flag.filter((p) => p >= 0 && p <= 65535, (p) => `--port must be in [0, 65535], got ${p}`)
    ),
    output: Flag.String("output").pipe(
      Flag.withDescription("JSONL file finished episodes are appended to"),
      Flag.withDefault("episodes.jsonl")
    ),
    idleTimeout: Flag.Int("idle-timeout").pipe(
      Flag.withDescription("Seconds without a request after which an episode is abandoned (masked)"),
      Flag.withDefault(600)
    ),
    maxNewTokens: Flag.Int("max-new-tokens").pipe(
      Flag.withDescription("Tokens per answer when a request sets no max_tokens"),
      Flag.withDefault(512)
    ),
    maxContextTokens: Flag.Int("max-context-tokens").pipe(
      Flag.withDescription("Token budget of a conversation (default: the model's positions)"),
      Flag.optional
    ),
    temperature: Flag.Finite("temperature").pipe(
      Flag.withDescription("Temperature when a request sets none"),
      Flag.withDefault(1)
    ),
    threads: Flag.Int("threads").pipe(
      Flag.withDescription("onnxruntime intra-op threads (default: 1 for models under 50 M parameters, else every core)"),
      Flag.optional
    ),
    tokenFile: Flag.String("token-file").pipe(
      Flag.withDescription("A file of client tokens (one a line; each client's episodes are its own), beside " +
        "AGENTFLY_GATEWAY_TOKEN"),
      Flag.optional
    ),
    maxEpisodes: Flag.Int("max-episodes").pipe(
      Flag.withDescription("Most episodes open at once; a request opening one more gets 429"),
      Flag.withDefault(1024),
      Flag.filter((n) => n >= 1, (n) => `--max-episodes must be at least 1, got ${n}`)
    )
  },
  Effect.fn("gateway")(function*(args) {
    const upstream = Option.getOrUndefined(args.upstream)
    const upstreamModel = Option.getOrUndefined(args.upstreamModel)
    if ((upstream === undefined) !== (upstreamModel === undefined)) {
      yield* Console.error("--upstream and --upstream-model go together")
      process.exitCode = 1
      return
    }
    yield* start({
      modelDir: args.modelDir,
      checkpoint: Option.getOrUndefined(args.checkpoint),
      renderTools: !args.omitToolSchemas,
      upstream: upstream === undefined ? undefined : { baseUrl: upstream, model: upstreamModel! },
      host: args.host,
      port: args.port,
      output: args.output,
      idleTimeoutSeconds: args.idleTimeout,
      maxNewTokens: args.maxNewTokens,
      maxContextTokens: Option.getOrUndefined(args.maxContextTokens),
      temperature: args.temperature,
      threads: Option.getOrUndefined(args.threads),
      tokenFile: Option.getOrUndefined(args.tokenFile),
      maxEpisodes: args.maxEpisodes
    })
    return yield* Effect.never
    // A refused folder or checkpoint (NaN weights, a wrong fingerprint): one line and a non-zero exit, as serve's.
  }, Effect.scoped, exitOnFailure)
).pipe(Command.withDescription("Serve an OpenAI-compatible gateway that records token-level trajectories per episode"))
