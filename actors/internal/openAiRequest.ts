/**
 * The request-body rules both OpenAI-compatible servers share (`agentfly serve`, `OpenAiServer.ts`, and the
 * recording gateway, `gateway/Bodies.ts`), checked before each server reads the fields it serves (a refusal is
 * answered by `openAiWire.ts`):
 *
 * - **Known fields.** Every field of OpenAI's documented chat-completions (or completions) request is accepted, plus
 *   the server's own extensions; any other field is refused as OpenAI refuses it ("Unrecognized request argument
 *   supplied: foo"), with the field in `param`. What a server does not serve (`tool_choice`, penalties, `user`,
 *   `metadata`, `store`, `service_tier`, ...) is accepted and ignored: SDKs send those on every call.
 * - **Ranges.** A number outside the range OpenAI documents (`temperature` 0–2, `top_p`, `n` ≥ 1,
 *   `max_tokens` ≥ 1, penalties −2–2, `logit_bias` −100–100, ...) is refused in OpenAI's words and codes
 *   (`decimal_above_max_value`, ...), naming the field; so is a value of the wrong type.
 * - **One choice.** `n` and `best_of` above 1 and `echo: true` are refused: both servers answer one sample per prompt.
 *
 * @since 0.1.0
 */
import { suggestion } from "../../src/internal/schemaIssues.ts"

/**
 * Which request: `/v1/chat/completions` or `/v1/completions`.
 *
 * @category models
 * @since 0.1.0
 */
export type Endpoint = "chat" | "completion"

/**
 * Why a body is refused: a 400 `invalid_request_error` naming `param`.
 *
 * @category models
 * @since 0.1.0
 */
export interface Refusal {
  readonly message: string
  readonly param: string
  readonly code?: string | undefined
}

/** Fields of both documented requests (openai-node 7.59: `ChatCompletionCreateParams`, `CompletionCreateParams`). */
const common = [
  "model",
  "frequency_penalty",
  "logit_bias",
  "logprobs",
  "max_tokens",
  "n",
  "presence_penalty",
  "seed",
  "stop",
  "stream",
  "stream_options",
  "temperature",
  "top_p",
  "user"
]

/**
 * Every field OpenAI documents for each endpoint.
 *
 * @category constants
 * @since 0.1.0
 */
export const documentedFields: { readonly [E in Endpoint]: ReadonlySet<string> } = {
  chat: new Set([
    ...common,
    "messages",
    "audio",
    "function_call",
    "functions",
    "max_completion_tokens",
    "metadata",
    "modalities",
    "moderation",
    "parallel_tool_calls",
    "prediction",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "service_tier",
    "store",
    "tool_choice",
    "tools",
    "top_logprobs",
    "verbosity",
    "web_search_options"
  ]),
  completion: new Set([...common, "prompt", "best_of", "echo", "suffix"])
}

interface Range {
  readonly integer: boolean
  readonly min?: number
  /** `min` itself is refused. */
  readonly exclusive?: boolean
  readonly max?: number
}

const decimal = (min: number, max: number, exclusive = false): Range => ({ integer: false, min, max, exclusive })
const integer = (min?: number, max?: number): Range => ({
  integer: true,
  ...(min === undefined ? {} : { min }),
  ...(max === undefined ? {} : { max })
})

/**
 * OpenAI's documented ranges, plus vLLM's `top_k` (−1: off). `top_p` must be above 0 here (the engine, as vLLM,
 * refuses 0), which OpenAI allows.
 */
const commonRanges: Readonly<Record<string, Range>> = {
  temperature: decimal(0, 2),
  top_p: decimal(0, 1, true),
  n: integer(1, 128),
  max_tokens: integer(1),
  presence_penalty: decimal(-2, 2),
  frequency_penalty: decimal(-2, 2),
  seed: integer(),
  top_k: integer(-1)
}

const ranges: { readonly [E in Endpoint]: Readonly<Record<string, Range>> } = {
  chat: { ...commonRanges, max_completion_tokens: integer(1), top_logprobs: integer(0, 20) },
  completion: { ...commonRanges, max_completion_tokens: integer(1), logprobs: integer(0, 5), best_of: integer(1, 20) }
}

const kindOf = (v: unknown): string =>
  Array.isArray(v) ? "an array" : typeof v === "object" ? "an object" : `a ${typeof v}`

const invalidType = (key: string, expected: string, got: string): Refusal => ({
  message: `Invalid type for '${key}': expected ${expected}, but got ${got} instead.`,
  param: key,
  code: "invalid_type"
})

const outOfRange = (key: string, range: Range, v: unknown): Refusal | undefined => {
  if (typeof v !== "number") return invalidType(key, range.integer ? "an integer" : "a number", kindOf(v))
  if (range.integer && !Number.isInteger(v)) return invalidType(key, "an integer", String(v))
  const kind = range.integer ? "integer" : "decimal"
  const low = range.min !== undefined && (range.exclusive === true ? !(v > range.min) : !(v >= range.min))
  if (low) {
    const bound = `${range.exclusive === true ? ">" : ">="} ${range.min}`
    return {
      message: `Invalid '${key}': ${kind} below minimum value. Expected a value ${bound}, but got ${v} instead.`,
      param: key,
      code: `${kind}_below_min_value`
    }
  }
  if (range.max !== undefined && !(v <= range.max)) {
    return {
      message: `Invalid '${key}': ${kind} above maximum value. Expected a value <= ${range.max}, but got ${v} instead.`,
      param: key,
      code: `${kind}_above_max_value`
    }
  }
  return undefined
}

const logitBias = (v: unknown): Refusal | undefined => {
  if (typeof v !== "object" || Array.isArray(v) || v === null) return invalidType("logit_bias", "an object", kindOf(v))
  for (const [token, bias] of Object.entries(v)) {
    const refused = outOfRange(`logit_bias.${token}`, decimal(-100, 100), bias)
    if (refused !== undefined) return { ...refused, param: "logit_bias" }
  }
  return undefined
}

/**
 * The first rule of this module that `body` breaks, or `undefined`. `extensions` are the fields the server reads
 * beyond OpenAI's (vLLM's `top_k`, `stop_token_ids`, ...): accepted too. A `null` value is an absent one.
 *
 * @category validation
 * @since 0.1.0
 */
export const check = (
  body: Readonly<Record<string, unknown>>,
  endpoint: Endpoint,
  extensions: Iterable<string>
): Refusal | undefined => {
  const documented = documentedFields[endpoint]
  const own = new Set(extensions)
  const unknown = Object.keys(body).filter((k) => !documented.has(k) && !own.has(k))
  if (unknown.length > 0) {
    // A near name is suggested; "n", a prefix of too many names, never is.
    const known = [...documented, ...own].filter((k) => k.length > 1)
    const named = unknown.map((k) => `${k}${suggestion(k, known)}`).join(", ")
    const plural = unknown.length > 1 ? "arguments" : "argument"
    return { message: `Unrecognized request ${plural} supplied: ${named}`, param: unknown[0]! }
  }
  for (const [key, range] of Object.entries(ranges[endpoint])) {
    const v = body[key]
    const refused = v === undefined || v === null ? undefined : outOfRange(key, range, v)
    if (refused !== undefined) return refused
  }
  if (body["logit_bias"] !== undefined && body["logit_bias"] !== null) {
    const refused = logitBias(body["logit_bias"])
    if (refused !== undefined) return refused
  }
  for (const key of ["n", "best_of"]) {
    const v = body[key]
    if (typeof v === "number" && v > 1) {
      return { message: `only ${key} = 1 is supported (one sample per prompt), got ${v}`, param: key }
    }
  }
  if (body["echo"] === true) return { message: "echo is not supported", param: "echo" }
  return undefined
}
