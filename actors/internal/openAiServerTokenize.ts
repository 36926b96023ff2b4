/**
 * vLLM's `POST /tokenize` (at the server's root, beside `/v1`) on the OpenAI-compatible server: a text's token ids,
 * what a distillation teacher's tokenizer check asks (`OpenAiCompatSampler.makeTokenize`). Only `prompt` is
 * served (a chat's `messages` is refused); the model's tokenizer adds no special tokens, so `add_special_tokens`
 * changes nothing.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as SchemaIssues from "../../src/internal/schemaIssues.ts"
import { encodePrompt, type ServerState } from "./openAiServerState.ts"
import { invalid } from "./openAiWire.ts"

const TokenizeRequest = Schema.Struct({
  model: Schema.optionalKey(Schema.String),
  prompt: Schema.String,
  add_special_tokens: Schema.optionalKey(Schema.NullOr(Schema.Boolean))
})

/**
 * The answer to a `/tokenize` body: `{ count, max_model_len, tokens }` (vLLM's fields).
 *
 * @category constructors
 * @since 0.1.0
 */
export const tokenize = Effect.fnUntraced(function*(state: ServerState, raw: unknown) {
  if ((raw as { messages?: unknown } | null)?.messages !== undefined) {
    return yield* invalid("this server's /tokenize takes a prompt, not messages", "messages")
  }
  const body = yield* Schema.decodeUnknownEffect(TokenizeRequest)(raw).pipe(
    Effect.mapError((e) => {
      const [first] = SchemaIssues.formatIssues(TokenizeRequest, e.issue)
      return invalid(first ?? e.message, first === undefined ? undefined : /^([A-Za-z_]+)/.exec(first)?.[1])
    })
  )
  const tokens = yield* encodePrompt(state, body.prompt, state.limits.maxRequestTokens, "prompt")
  return { count: tokens.length, max_model_len: state.config.maxPositionEmbeddings, tokens }
})
