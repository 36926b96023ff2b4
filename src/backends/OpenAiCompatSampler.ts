/**
 * A `Sampler` backed by an OpenAI-compatible inference server (vLLM, SGLang, `agentfly serve`).
 *
 * **Token mode** (`make` / `layer`) posts token-id prompts to `/completions` and asks for the sampled token ids
 * and their logprobs (`logprobs: 1`, vLLM's `return_token_ids` and `return_tokens_as_token_ids`). Token ids are
 * read from `choices[0].token_ids`, or from `logprobs.tokens` entries of the form `token_id:<id>`. A server that
 * returns neither cannot serve token-in/token-out training: the call fails with
 * a `SamplerError` of reason `NoTokenIds` (not retried). A response's `lora_adapter` (`agentfly serve` names the
 * adapter it sampled with: `{ name, digest, policy_version }`) is returned as the result's `adapter`, for a LoRA
 * run's digest check. vLLM and SGLang say no digest: a LoRA run names each published adapter by its version and
 * digest ({@link adapterName}, `policy-v3-<digest>`), and a response whose `model` echoes such a name as requested
 * is read as that adapter (the name's digest, the name's version): the server's word, not its tensors'.
 *
 * **Chat mode** (`makeChat` / `layerChat`) posts messages to `/chat/completions` of a black-box API and provides
 * `ChatSampler`; it returns text and tool calls only, so the trajectories built from it are marked not
 * trainable (usable for evaluation and SFT data). Image parts go as OpenAI's wire writes them (`image_url` with a
 * `data:` URL), which vLLM's and SGLang's multimodal chat APIs take. Token mode posts ids only: `/completions`
 * takes no images, so a vision model is sampled token-in / token-out by `agentfly serve` (or chat mode).
 *
 * Both modes time out each attempt (`timeoutMs`), and retry 429 (`Overloaded`), 5xx (`ServerError`), timeouts
 * and transport failures with jittered exponential backoff (`retries`, `retryBaseMs`), waiting at least as long as
 * a `Retry-After` header asks (up to `maxRetryAfterMs`); other 4xx answers fail with `BadRequest`. The HTTP
 * client comes from context: on Node 20 provide `NodeHttpClient.layerNodeHttp` (from
 * `@effect/platform-node/NodeHttpClient`) or `FetchHttpClient.layer`.
 *
 * @since 0.1.0
 */
import { Clock, Duration, Effect, Layer, Option, Redacted, Schedule, Schema } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import type { HttpClientResponse } from "effect/http"
import { ToolCall } from "../Message.ts"
import type * as Message from "../Message.ts"
import type { Conversation } from "../Message.ts"
import { ChatSampler, Sampler, samplerError } from "../Sampler.ts"
import type {
  ChatRequest,
  ChatResult,
  FinishReason,
  GenerateRequest,
  GenerateResult,
  SamplerError,
  SamplingParams
} from "../Sampler.ts"

// ===== Config =====

/**
 * Where the server is and how to talk to it.
 *
 * @category models
 * @since 0.1.0
 */
export interface Config {
  /** The API root, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string
  /** The served model name. */
  readonly model: string
  readonly apiKey?: Redacted.Redacted<string> | undefined
  /** Time limit of one attempt (default 60 s). */
  readonly timeoutMs?: number | undefined
  /** Retries after the first attempt on retryable failures (default 4). */
  readonly retries?: number | undefined
  /** First backoff delay; doubles per retry, jittered (default 200 ms). */
  readonly retryBaseMs?: number | undefined
  /** Longest `Retry-After` honoured (default 60 s); a server asking for more is retried after this long. */
  readonly maxRetryAfterMs?: number | undefined
  /**
   * The policy version to record when the server does not report one in `policy_version` (default 0). An
   * effect is read at every call (e.g. the trainer's current weight version).
   */
  readonly policyVersion?: number | Effect.Effect<number> | undefined
  /** Extra fields merged into every request body (server-specific options). */
  readonly extraBody?: Readonly<Record<string, unknown>> | undefined
}

// ===== Response schemas (only the fields we read) =====

const CompletionChoice = Schema.Struct({
  finish_reason: Schema.optionalKey(Schema.NullOr(Schema.String)),
  token_ids: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Int))),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Struct({
    tokens: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.String))),
    token_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.NullOr(Schema.Number))))
  }))),
  policy_version: Schema.optionalKey(Schema.Int)
})

/** The adapter a server sampled with (`agentfly serve`'s extension; vLLM names the adapter as the `model`). */
const LoraAdapterStamp = Schema.Struct({
  name: Schema.optionalKey(Schema.String),
  digest: Schema.String,
  policy_version: Schema.optionalKey(Schema.Int)
})

const CompletionResponse = Schema.Struct({
  choices: Schema.Array(CompletionChoice).check(Schema.isMinLength(1)),
  policy_version: Schema.optionalKey(Schema.Int),
  model: Schema.optionalKey(Schema.NullOr(Schema.String)),
  lora_adapter: Schema.optionalKey(Schema.NullOr(LoraAdapterStamp))
})

const ChatChoice = Schema.Struct({
  finish_reason: Schema.optionalKey(Schema.NullOr(Schema.String)),
  message: Schema.Struct({
    content: Schema.optionalKey(Schema.NullOr(Schema.String)),
    tool_calls: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Struct({
      id: Schema.String,
      type: Schema.optionalKey(Schema.String),
      function: Schema.Struct({ name: Schema.String, arguments: Schema.Unknown })
    }))))
  })
})

const ChatResponse = Schema.Struct({
  choices: Schema.Array(ChatChoice).check(Schema.isMinLength(1))
})

// ===== Pure helpers =====

/**
 * The name a published LoRA adapter is loaded and requested under: `base`, its policy version and its digest
 * (`policy-v3-0123456789abcdef`; warm-up checks have negative versions, `policy-v-2-…`). A server that returns no
 * digest (vLLM, SGLang) still says which adapter it sampled with when it echoes the name as the response's `model`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const adapterName = (base: string, version: number, digest: string): string => `${base}-v${version}-${digest}`

const adapterNamePattern = /^(.+)-v(-?\d+)-([0-9a-f]{16})$/

/**
 * The base, version and digest an {@link adapterName} carries; `undefined` for any other name.
 *
 * @category getters
 * @since 0.1.0
 */
export const parseAdapterName = (
  name: string
): { readonly base: string; readonly version: number; readonly digest: string } | undefined => {
  const m = adapterNamePattern.exec(name)
  return m === null ? undefined : { base: m[1]!, version: Number(m[2]), digest: m[3]! }
}

/** What a response says it sampled with: its `lora_adapter`, else the adapter name it echoes as asked. */
const adapterOf = (
  requested: string,
  response: typeof CompletionResponse.Type
): GenerateResult["adapter"] => {
  const stamp = response.lora_adapter
  if (stamp !== undefined && stamp !== null) {
    return {
      name: stamp.name ?? response.model ?? requested,
      digest: stamp.digest,
      ...(stamp.policy_version === undefined ? {} : { policyVersion: stamp.policy_version })
    }
  }
  // vLLM and SGLang answer with the model the request named: an adapter name then says version and digest.
  const named = response.model === requested ? parseAdapterName(requested) : undefined
  return named === undefined ? undefined : { name: requested, digest: named.digest, policyVersion: named.version }
}

/**
 * The `/completions` body for a token-id prompt.
 *
 * The request's `stopTokenIds` are its only stops, as in the local engine: `ignore_eos` (vLLM's extension, also
 * `agentfly serve`'s) keeps the server from adding its model's end-of-sequence ids, which would end a sample on a
 * token the chain's format does not count as a turn end (the chain would then record `stop` where the local engine
 * samples on).
 *
 * @category constructors
 * @since 0.1.0
 */
export const completionBody = (model: string, request: GenerateRequest, extra?: Readonly<Record<string, unknown>>) => ({
  model,
  prompt: request.promptTokenIds,
  ...samplingFields(request.sampling),
  logprobs: 1,
  echo: false,
  return_token_ids: true,
  return_tokens_as_token_ids: true,
  skip_special_tokens: false,
  include_stop_str_in_output: true,
  ignore_eos: true,
  ...extra
})

const samplingFields = (sampling: SamplingParams) => ({
  max_tokens: sampling.maxTokens,
  temperature: sampling.temperature,
  ...(sampling.topP === undefined ? {} : { top_p: sampling.topP }),
  ...(sampling.topK === undefined ? {} : { top_k: sampling.topK }),
  ...(sampling.seed === undefined ? {} : { seed: sampling.seed }),
  ...(sampling.stopTokenIds === undefined ? {} : { stop_token_ids: sampling.stopTokenIds })
})

const tokenIdPattern = /^token_id:(-?\d+)$/

const finishReasonOf = (raw: string | null | undefined): FinishReason => (raw === "length" ? "length" : "stop")

/**
 * Reads token ids and logprobs out of a decoded `/completions` choice; `undefined` when the server returned no
 * token ids (or a logprob is missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const readChoice = (
  choice: typeof CompletionChoice.Type
): { readonly tokenIds: ReadonlyArray<number>; readonly logprobs: ReadonlyArray<number> } | undefined => {
  const fromTokens = choice.logprobs?.tokens?.map((t) => tokenIdPattern.exec(t)?.[1])
  const tokenIds = choice.token_ids ??
    (fromTokens !== undefined && fromTokens.every((t) => t !== undefined) ? fromTokens.map(Number) : undefined)
  const logprobs = choice.logprobs?.token_logprobs
  if (tokenIds === undefined || logprobs === undefined || logprobs === null) return undefined
  if (logprobs.length !== tokenIds.length || logprobs.some((lp) => lp === null)) return undefined
  return { tokenIds, logprobs: logprobs as ReadonlyArray<number> }
}

// ===== Transport =====

/** A transport error's message with its cause's (`connect ECONNREFUSED 127.0.0.1:8009`): what a user must fix. */
const transportMessage = (error: { readonly message: string; readonly cause?: unknown }): string => {
  const cause = error.cause
  const detail = cause instanceof Error
    ? [(cause as { code?: unknown }).code, cause.message].filter((x) => typeof x === "string" && x !== "").join(": ")
    : ""
  return detail === "" || error.message.includes(detail) ? error.message : `${error.message}: ${detail}`
}

/**
 * Milliseconds to wait from an HTTP `Retry-After` value (delta-seconds or an HTTP date), given the current time.
 *
 * @category constructors
 * @since 0.1.0
 */
export const retryAfterMs = (header: string | undefined, nowMs: number): number | undefined => {
  if (header === undefined) return undefined
  const trimmed = header.trim()
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Number(trimmed) * 1000
  const at = Date.parse(trimmed)
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs)
}

const statusError = (status: number, body: string, waitMs: number | undefined): SamplerError => {
  const message = `HTTP ${status}: ${body.slice(0, 500)}`
  const wait = waitMs === undefined ? {} : { retryAfterMs: waitMs }
  return status === 429
    ? samplerError("Overloaded", message, wait)
    : status === 408
    ? samplerError("Timeout", message)
    : status >= 500
    ? samplerError("ServerError", message, { status, ...wait })
    : samplerError("BadRequest", message, { status })
}

const makePost = Effect.fnUntraced(function*(config: Config) {
  const client = yield* HttpClient.HttpClient
  const timeoutMs = config.timeoutMs ?? 60_000
  const maxRetryAfterMs = config.maxRetryAfterMs ?? 60_000
  // Backoff, stretched to the server's `Retry-After` when it sent one (capped).
  const retry = Schedule.exponential(config.retryBaseMs ?? 200).pipe(
    Schedule.jittered,
    Schedule.setInputType<SamplerError>(),
    Schedule.modifyDelay(({ duration, input }) =>
      Effect.succeed(Math.max(Duration.toMillis(duration), Math.min(input.retryAfterMs ?? 0, maxRetryAfterMs)))
    )
  )
  const base = config.baseUrl.replace(/\/+$/, "")
  return <S extends Schema.Top & { readonly DecodingServices: never }>(
    path: string,
    body: unknown,
    schema: S
  ): Effect.Effect<S["Type"], SamplerError> => {
    let request = HttpClientRequest.post(`${base}${path}`).pipe(
      HttpClientRequest.acceptJson,
      HttpClientRequest.bodyJsonUnsafe(body)
    )
    if (config.apiKey !== undefined) request = HttpClientRequest.bearerToken(request, Redacted.value(config.apiKey))
    const attempt = client.execute(request).pipe(
      Effect.mapError((error) => samplerError("Transport", transportMessage(error))),
      Effect.flatMap((response: HttpClientResponse.HttpClientResponse) =>
        response.status >= 200 && response.status < 300
          ? Effect.flatMap(
            Effect.mapError(response.json, (e) => samplerError("ServerError", `unreadable body: ${e.message}`)),
            (json) =>
              Effect.mapError(Schema.decodeUnknownEffect(schema)(json), (e) =>
                samplerError("ServerError", `unexpected response: ${e.message}`))
          )
          : Effect.flatMap(
            Effect.orElseSucceed(response.text, () => ""),
            (text) =>
              Effect.flatMap(Clock.currentTimeMillis, (now) =>
                Effect.fail(statusError(response.status, text, retryAfterMs(response.headers["retry-after"], now))))
          )
      ),
      Effect.timeoutOrElse({
        duration: timeoutMs,
        orElse: () => Effect.fail(samplerError("Timeout", `no answer from ${path} in ${timeoutMs} ms`))
      })
    )
    return attempt.pipe(
      Effect.retry({ schedule: retry, times: config.retries ?? 4, while: (e: SamplerError) => e.isRetryable })
    )
  }
})

const versionOf = (config: Config): Effect.Effect<number> => {
  const v = config.policyVersion
  return v === undefined ? Effect.succeed(0) : typeof v === "number" ? Effect.succeed(v) : v
}

// ===== Token mode =====

/**
 * A token-in / token-out `Sampler` over `/completions`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = Effect.fnUntraced(function*(config: Config) {
  const post = yield* makePost(config)
  const policyVersion = versionOf(config)
  return Sampler.of({
    generate: Effect.fn("OpenAiCompatSampler.generate")(function*(request: GenerateRequest) {
      const response = yield* post("/completions", completionBody(config.model, request, config.extraBody),
        CompletionResponse)
      const choice = response.choices[0]!
      const read = readChoice(choice)
      if (read === undefined) {
        return yield* samplerError(
          "NoTokenIds",
          "the server returned no token ids or logprobs for the completion " +
            "(vLLM needs return_token_ids or return_tokens_as_token_ids; this backend needs both ids and logprobs)"
        )
      }
      const adapter = adapterOf(config.model, response)
      const result: GenerateResult = {
        tokenIds: read.tokenIds,
        logprobs: read.logprobs,
        finishReason: finishReasonOf(choice.finish_reason),
        // A server that says no version (vLLM) sampled the version its adapter's name says, if it named one.
        policyVersion: choice.policy_version ?? response.policy_version ?? adapter?.policyVersion ??
          (yield* policyVersion),
        // Which adapter sampled it, for a LoRA run's digest check (absent for full weights).
        ...(adapter === undefined ? {} : { adapter })
      }
      return result
    }),
    policyVersion
  })
})

/**
 * @category layers
 * @since 0.1.0
 */
export const layer = (config: Config): Layer.Layer<Sampler, never, HttpClient.HttpClient> =>
  Layer.effect(Sampler, make(config))

// ===== Prompt logprobs (a distillation teacher's scores) =====

/** One position of vLLM's `prompt_logprobs`: null for the first token, else the top ids (the prompt's among them). */
const PromptLogprobEntry = Schema.NullOr(Schema.Record(Schema.String, Schema.Struct({ logprob: Schema.Number })))

const PromptLogprobsResponse = Schema.Struct({
  choices: Schema.Array(Schema.Struct({
    prompt_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Array(PromptLogprobEntry)))
  })).check(Schema.isMinLength(1)),
  prompt_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Array(PromptLogprobEntry)))
})

/**
 * The `/completions` body asking for the prompt's own logprobs (vLLM's `prompt_logprobs: 0`: each prompt token's,
 * no alternatives) and one token, which is ignored.
 *
 * @category constructors
 * @since 0.1.0
 */
export const promptLogprobsBody = (
  model: string,
  tokenIds: ReadonlyArray<number>,
  extra?: Readonly<Record<string, unknown>>
) => ({ model, prompt: tokenIds, max_tokens: 1, temperature: 1, prompt_logprobs: 0, ...extra })

/**
 * Each prompt token's logprob out of a `prompt_logprobs` answer (`null` where the entry is null or lacks the
 * token's id); `undefined` when the answer has none.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readPromptLogprobs = (
  response: typeof PromptLogprobsResponse.Type,
  tokenIds: ReadonlyArray<number>
): ReadonlyArray<number | null> | undefined => {
  const entries = response.choices[0]!.prompt_logprobs ?? response.prompt_logprobs
  if (entries === undefined || entries === null) return undefined
  return entries.map((entry, i) => entry?.[String(tokenIds[i])]?.logprob ?? null)
}

/**
 * Scores given token ids with the server's model: each token's logprob given the tokens before it (`[0]` null).
 * A server that answers without prompt logprobs (OpenAI's API, SGLang) fails with reason
 * `NoPromptLogprobs`; one that refuses the field (HTTP 400) with `BadRequest`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makePromptScorer = Effect.fnUntraced(function*(config: Config) {
  const post = yield* makePost(config)
  return Effect.fn("OpenAiCompatSampler.promptLogprobs")(function*(tokenIds: ReadonlyArray<number>) {
    const body = promptLogprobsBody(config.model, tokenIds, config.extraBody)
    const read = readPromptLogprobs(yield* post("/completions", body, PromptLogprobsResponse), tokenIds)
    if (read === undefined) {
      return yield* samplerError(
        "NoPromptLogprobs",
        `${config.baseUrl} answered without prompt_logprobs: a teacher must score given tokens ` +
          `(vLLM's /completions with prompt_logprobs)`
      )
    }
    return read
  })
})

const TokenizeResponse = Schema.Struct({ tokens: Schema.Array(Schema.Int) })

/**
 * The server's tokenization of a text, without special tokens (vLLM's `/tokenize`, at the root beside `/v1`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeTokenize = Effect.fnUntraced(function*(config: Config) {
  // vLLM serves /tokenize beside /v1, at the server's root.
  const post = yield* makePost({ ...config, baseUrl: config.baseUrl.replace(/\/+$/, "").replace(/\/v1$/, "") })
  return (text: string) =>
    post("/tokenize", { model: config.model, prompt: text, add_special_tokens: false }, TokenizeResponse).pipe(
      Effect.map((r) => r.tokens)
    )
})

// ===== Chat mode =====

/**
 * The `/chat/completions` body for a conversation.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chatBody = (model: string, request: ChatRequest, extra?: Readonly<Record<string, unknown>>) => {
  const { stop_token_ids: _ignored, ...sampling } = samplingFields(request.sampling)
  return {
    model,
    messages: toOpenAiMessages(request.messages),
    ...(request.tools === undefined || request.tools.length === 0 ? {} : { tools: request.tools }),
    ...sampling,
    ...extra
  }
}

/**
 * Image parts as vLLM's and SGLang's multimodal chat APIs take them (OpenAI's wire): `{ type: "image_url",
 * image_url: { url } }` with a `data:` URL, without the decoded `image` this runtime keeps beside it.
 */
const wireContent = (content: Message.Content): Message.Content =>
  typeof content === "string" || !content.some((p) => p.type === "image_url" && p.image !== undefined)
    ? content
    : content.map((p) => (p.type === "image_url" ? { type: "image_url", image_url: { url: p.image_url.url } } : p))

/** OpenAI wants tool-call arguments as a JSON string; our messages keep them as JSON values. */
const toOpenAiMessages = (messages: Conversation) =>
  messages.map((message) => {
    const content = wireContent(message.content)
    const m = (content === message.content ? message : { ...message, content }) as Message.Message
    if (m.role === "tool") {
      const { is_error: _isError, ...rest } = m
      return rest
    }
    if (m.role !== "assistant" || m.tool_calls === undefined) return m
    return {
      ...m,
      tool_calls: m.tool_calls.map((c) => ({
        ...c,
        function: {
          name: c.function.name,
          arguments: typeof c.function.arguments === "string"
            ? c.function.arguments
            : JSON.stringify(c.function.arguments)
        }
      }))
    }
  })

/** Arguments come back as a JSON string; keep the decoded value, or the raw string when it is not JSON. */
const decodeArguments = (raw: unknown): unknown =>
  typeof raw === "string"
    ? Option.getOrElse(Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))(raw), () => raw)
    : raw

/**
 * A `ChatSampler` over `/chat/completions` for black-box APIs (no token ids).
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeChat = Effect.fnUntraced(function*(config: Config) {
  const post = yield* makePost(config)
  return ChatSampler.of({
    complete: Effect.fn("OpenAiCompatSampler.complete")(function*(request: ChatRequest) {
      const response = yield* post("/chat/completions", chatBody(config.model, request, config.extraBody),
        ChatResponse)
      const choice = response.choices[0]!
      const toolCalls: Array<ToolCall> = (choice.message.tool_calls ?? []).map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.function.name, arguments: decodeArguments(c.function.arguments) }
      }))
      const result: ChatResult = {
        content: choice.message.content ?? "",
        toolCalls,
        finishReason: choice.finish_reason === "length" ? "length" : "stop"
      }
      return result
    })
  })
})

/**
 * @category layers
 * @since 0.1.0
 */
export const layerChat = (config: Config): Layer.Layer<ChatSampler, never, HttpClient.HttpClient> =>
  Layer.effect(ChatSampler, makeChat(config))
