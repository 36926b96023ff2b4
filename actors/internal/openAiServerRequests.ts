/**
 * What a request to the OpenAI-compatible server asks for (`OpenAiServer.ts`, "Fields" and "Limits"): the bodies
 * of `/v1/completions` and `/v1/chat/completions` decoded with Schemas (a refusal is a 400 naming the field, in
 * OpenAI's words), the sampling parameters, the conversation, and the prompts tokenized within the limits. Every
 * check runs here, before anything is sampled or a status line written.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as MessageImages from "../../src/MessageImages.ts"
import type { ModelConfig } from "../../src/model/ModelConfig.ts"
import type { GenerateRequest, GenerateResult, SamplingParams } from "../../src/Sampler.ts"
import * as SchemaIssues from "../../src/internal/schemaIssues.ts"
import { validateRequest } from "../PolicyEngine.ts"
import type * as OpenAiRequest from "./openAiRequest.ts"
import { invalid, parseArguments, refusal } from "./openAiWire.ts"
import { asked, tooManyTokens } from "./promptBudget.ts"
import { atLeast, encodePrompt, type Model, type ServerState } from "./openAiServerState.ts"

// ===== Request schemas =====

const Sampling = {
  model: Schema.optionalKey(Schema.String),
  max_tokens: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  max_completion_tokens: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  temperature: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  top_p: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  top_k: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  seed: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  n: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  stop: Schema.optionalKey(Schema.NullOr(Schema.Union([Schema.String, Schema.Array(Schema.String)]))),
  stop_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Int))),
  ignore_eos: Schema.optionalKey(Schema.Boolean),
  stream: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  /** `include_usage`: a streamed chat ends with a chunk of usage (no choices), as OpenAI's does. */
  stream_options: Schema.optionalKey(
    Schema.NullOr(Schema.Struct({ include_usage: Schema.optionalKey(Schema.NullOr(Schema.Boolean)) }))
  ),
  skip_special_tokens: Schema.optionalKey(Schema.Boolean),
  include_stop_str_in_output: Schema.optionalKey(Schema.Boolean),
  return_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  return_tokens_as_token_ids: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  /** This server's extension: refuse (409) rather than sample with weights older than this policy version. */
  min_policy_version: Schema.optionalKey(Schema.NullOr(Schema.Int))
}

const CompletionRequest = Schema.Struct({
  ...Sampling,
  prompt: Schema.Union([
    Schema.String,
    Schema.Array(Schema.Int),
    Schema.Array(Schema.String),
    Schema.Array(Schema.Array(Schema.Int))
  ]),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  echo: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  /** vLLM's: each prompt token's logprob given the ones before it, with this many likeliest alternatives. */
  prompt_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int))
})

/**
 * Most alternatives `prompt_logprobs` asks for (vLLM's default `max_logprobs`).
 *
 * @category models
 * @since 0.1.0
 */
export const maxPromptLogprobs = 20

/** `prompt_logprobs` checked: a count in [0, 20], not streamed, an engine that can score (`PolicyEngine.score`). */
const promptLogprobsOf = (state: ServerState, body: typeof CompletionRequest.Type, stream: boolean) => {
  const k = body.prompt_logprobs
  if (k === undefined || k === null) return Effect.succeed(undefined)
  if (k < 0 || k > maxPromptLogprobs) {
    const message = `prompt_logprobs must be in [0, ${maxPromptLogprobs}] (the alternatives per position), got ${k}`
    return Effect.fail(invalid(message, "prompt_logprobs"))
  }
  if (stream) return Effect.fail(invalid("prompt_logprobs is not available with stream: true", "prompt_logprobs"))
  if (state.engine.score === undefined) {
    const message = "this server's engine cannot score prompts (prompt_logprobs): serve the model on this thread"
    return Effect.fail(invalid(message, "prompt_logprobs"))
  }
  return Effect.succeed(k)
}

const ChatCompletionRequest = Schema.Struct({
  ...Sampling,
  messages: Schema.Array(Schema.Unknown).check(Schema.isMinLength(1)),
  tools: Schema.optionalKey(Schema.NullOr(Schema.Array(Schema.Unknown))),
  tool_choice: Schema.optionalKey(Schema.Unknown),
  logprobs: Schema.optionalKey(Schema.NullOr(Schema.Boolean)),
  top_logprobs: Schema.optionalKey(Schema.NullOr(Schema.Int))
})

/**
 * The sampling fields of either request.
 *
 * @category models
 * @since 0.1.0
 */
export type SamplingFields = { readonly [K in keyof typeof Sampling]?: (typeof Sampling)[K]["Type"] }

// A Schema refusal as OpenAI's: `max_tokens: Expected number | null, got "5"`, the field in `param`; then the rules
// both servers share (`internal/openAiRequest.ts`): a field that is neither OpenAI's nor read here, a value out of
// OpenAI's range, `n` > 1.
const decode = <S extends Schema.Struct<Schema.Struct.Fields> & { readonly DecodingServices: never }>(
  schema: S,
  body: unknown,
  endpoint: OpenAiRequest.Endpoint
) =>
  Schema.decodeUnknownEffect(schema)(body).pipe(
    Effect.mapError((e) => {
      const [first] = SchemaIssues.formatIssues(schema, e.issue)
      const param = first === undefined ? undefined : /^([A-Za-z_]+)/.exec(first)?.[1]
      return invalid(first ?? e.message, param)
    }),
    Effect.tap(() => {
      const refused = refusal(body as Record<string, unknown>, endpoint, Object.keys(schema.fields))
      return refused === undefined ? Effect.void : Effect.fail(refused)
    })
  )

/**
 * Decoded text that ends in an incomplete UTF-8 sequence, held back until it completes.
 *
 * @category getters
 * @since 0.1.0
 */
export const stableText = (text: string): string => (text.endsWith("\uFFFD") ? text.replace(/\uFFFD+$/, "") : text)

/**
 * The text of token ids (ids outside the vocabulary dropped; with `skipSpecial`, the `<|…|>` tokens too).
 *
 * @category getters
 * @since 0.1.0
 */
export const makeText = (model: Model, skipSpecial: boolean) => {
  const special = new Set(
    [...model.tokenizer.addedTokens.entries()].filter(([t]) => t.startsWith("<|")).map(([, id]) => id)
  )
  return (ids: ReadonlyArray<number>): string =>
    model.tokenizer.decode(ids.filter((id) => model.tokenizer.isValidId(id) && !(skipSpecial && special.has(id))))
}

// ===== Parameters =====

/**
 * The sampling parameters of a request, whose ranges `decode` checked (the engine checks them again, in its names,
 * with {@link validateRequest}); the stops checked against the model.
 */
const samplingOf = Effect.fnUntraced(function*(model: Model, config: ModelConfig, body: SamplingFields, chat: boolean) {
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? (chat ? 256 : 16)
  const temperature = body.temperature ?? 1
  const topP = body.top_p ?? undefined
  const topK = body.top_k ?? undefined
  const stopIds = new Set(body.stop_token_ids ?? [])
  const badStop = [...stopIds].find((id) => id < 0 || id >= config.vocabSize)
  if (badStop !== undefined) {
    const message = `stop_token_ids: ${badStop} is outside the vocabulary [0, ${config.vocabSize})`
    return yield* invalid(message, "stop_token_ids")
  }
  if (body.ignore_eos !== true) for (const id of model.stopTokenIds) stopIds.add(id)
  const stops = body.stop === undefined || body.stop === null ?
    [] :
    typeof body.stop === "string" ?
    [body.stop] :
    body.stop
  // A stop string is text: its tokens as the model writes it ("\n", "é" in two bytes, "<|im_end|>"); this server
  // stops on single tokens, so a string of several is refused rather than matched on something else.
  for (const s of stops) {
    const ids = model.tokenizer.encode(s)
    if (ids.length !== 1) {
      return yield* invalid(
        `stop string ${JSON.stringify(s)} is ${ids.length} tokens, not a single token; this server stops on single ` +
          "tokens: use stop_token_ids",
        "stop"
      )
    }
    stopIds.add(ids[0]!)
  }
  const sampling: SamplingParams = {
    temperature,
    maxTokens,
    stopTokenIds: [...stopIds],
    ...(topP === undefined ? {} : { topP }),
    ...(topK === undefined || topK === -1 ? {} : { topK }),
    ...(body.seed === undefined || body.seed === null ? {} : { seed: body.seed })
  }
  return sampling
})

/** The engine's own checks (prompt, context, vocabulary, parameters) as a 400, before anything is answered. */
const checked = (config: ModelConfig, request: GenerateRequest, param: string) => {
  const error = validateRequest(config, request)
  return error === undefined ? Effect.succeed(request) : Effect.fail(invalid(error.message, param))
}

const roles = ["system", "user", "assistant", "tool"]

/** OpenAI messages → our Message schema: tool-call arguments arrive as JSON strings. */
const conversation = (body: typeof ChatCompletionRequest.Type) => {
  // A role the API does not know is named as such, not as a mismatch with each of the union's members.
  const badRole = body.messages.findIndex((m) => !roles.includes((m as { role?: unknown })?.role as string))
  if (badRole !== -1) {
    const role = (body.messages[badRole] as { role?: unknown })?.role
    return Effect.fail(invalid(
      `messages[${badRole}].role: expected "system", "user", "assistant" or "tool", got ${JSON.stringify(role)}`,
      `messages[${badRole}].role`
    ))
  }
  const messages = body.messages.map((m) => {
    const calls = (m as { tool_calls?: unknown }).tool_calls
    if (!Array.isArray(calls)) return m
    return {
      ...(m as object),
      tool_calls: calls.map((c) => {
        const fn = (c as { function?: { arguments?: unknown } })?.function
        // A malformed argument string stays a string: the template renders it as the model wrote it.
        return typeof fn?.arguments === "string" ?
          { ...c, function: { ...fn, arguments: parseArguments(fn.arguments) } } :
          c
      })
    }
  })
  return ChatTemplate.decodeConversation({ messages, tools: body.tools ?? [] }).pipe(
    Effect.mapError((e) => invalid(e.message, "messages"))
  )
}

/** Prompts in a raw `/v1/completions` body, counted before it is decoded. */
const promptCount = (raw: unknown): number => {
  const prompt = (raw as { prompt?: unknown } | null)?.prompt
  return Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== "number" ? prompt.length : 1
}


/**
 * A completion's text: the stop token left out unless `include_stop_str_in_output`.
 *
 * @category getters
 * @since 0.1.0
 */
export const completionText = (model: Model, result: GenerateResult, body: SamplingFields): string => {
  const keepStop = body.include_stop_str_in_output === true
  const shown = result.finishReason === "stop" && !keepStop ? result.tokenIds.slice(0, -1) : result.tokenIds
  return makeText(model, body.skip_special_tokens ?? true)(shown)
}

// ===== Requests =====

/**
 * Every check of a `/v1/completions` body, cheapest first; nothing is sampled and no status line is written.
 *
 * @category validation
 * @since 0.1.0
 */
export const completionRequests = Effect.fnUntraced(function*(state: ServerState, raw: unknown, stream: boolean) {
  const { config, limits, model } = state
  const count = promptCount(raw)
  if (count > limits.maxPrompts) {
    const message = `the request has ${count} prompts; this server takes at most ${limits.maxPrompts}`
    return yield* invalid(message, "prompt")
  }
  if (stream && count !== 1) return yield* invalid("stream: true takes a single prompt", "prompt")
  const body = yield* decode(CompletionRequest, raw, "completion")
  const promptLogprobs = yield* promptLogprobsOf(state, body, stream)
  yield* atLeast(state, body.min_policy_version)
  const prompts: ReadonlyArray<string | ReadonlyArray<number>> =
    typeof body.prompt === "string" ? [body.prompt] : body.prompt.length > 0 && typeof body.prompt[0] === "number"
    ? [body.prompt as ReadonlyArray<number>]
    : (body.prompt as ReadonlyArray<string | ReadonlyArray<number>>)
  if (prompts.length === 0) return yield* invalid("the prompt is empty", "prompt")
  const sampling = yield* samplingOf(model, config, body, false)
  // The budget before any text is tokenized: token-id prompts exactly, text prompts by their length.
  let known = 0, bound = 0
  for (const p of prompts) {
    known += typeof p === "string" ? asked(config, sampling, 0) : asked(config, sampling, p.length)
    if (typeof p === "string") bound += Math.ceil(p.length / state.charsPerToken)
  }
  if (known + bound > limits.maxRequestTokens) {
    return yield* tooManyTokens(known + bound, bound === 0, limits.maxRequestTokens, "prompt")
  }
  const requests: Array<GenerateRequest> = []
  for (const p of prompts) {
    let ids = p as ReadonlyArray<number>
    if (typeof p === "string") {
      ids = yield* encodePrompt(state, p, limits.maxRequestTokens - known, "prompt")
      known += ids.length
      // Tokenizing thousands of prompts must not stall the decode loop (the same thread) for long.
      if (requests.length % 64 === 63) yield* Effect.yieldNow
    }
    requests.push(yield* checked(config, { promptTokenIds: ids, sampling }, "prompt"))
  }
  return { body, requests, promptLogprobs }
})

/**
 * Every check of a `/v1/chat/completions` body; the rendered conversation is tokenized within the limits.
 *
 * @category validation
 * @since 0.1.0
 */
export const chatRequest = Effect.fnUntraced(function*(state: ServerState, raw: unknown) {
  const { config, limits, model } = state
  const body = yield* decode(ChatCompletionRequest, raw, "chat")
  yield* atLeast(state, body.min_policy_version)
  const sampling = yield* samplingOf(model, config, body, true)
  const conversed = yield* conversation(body)
  const tools = conversed.tools
  // Image parts decoded (a model without vision, a remote URL or bad bytes: a 400 naming why); `images` are in
  // the order of their image tokens in the prompt.
  const { images, messages } = yield* MessageImages.decodeAll(conversed.messages, {
    name: model.name,
    vision: model.template.vision
  }).pipe(Effect.mapError((e) => invalid(e.message, "messages")))
  const rendered = limits.renderTools === false ? [] : tools
  const text = yield* model.template.render(messages, { addGenerationPrompt: true, tools: rendered }).pipe(
    Effect.mapError((e) => invalid(e.message, "messages"))
  )
  const ids = yield* encodePrompt(state, text, limits.maxRequestTokens - asked(config, sampling, 0), "messages")
  const request = yield* checked(config, { promptTokenIds: ids, sampling }, "messages")
  return { body, tools, request, images }
})
