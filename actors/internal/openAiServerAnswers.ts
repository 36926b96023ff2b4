/**
 * The OpenAI-compatible server's answers (`OpenAiServer.ts`): `/v1/completions` and `/v1/chat/completions`, whole
 * or streamed as server-sent events, each sampled through the fair scheduler once `openAiServerRequests.ts` has
 * checked the request. A streamed completion writes one event per sampled token; a streamed chat writes its text
 * until a tool-call tag starts, and the parsed calls in one `tool_calls` delta at the end.
 *
 * @since 0.1.0
 */
import { createHash } from "node:crypto"
import type * as Http from "node:http"
import { Effect } from "effect"
import type * as Message from "../../src/Message.ts"
import type { FinishReason, GenerateResult } from "../../src/Sampler.ts"
import * as ToolCallParser from "../../src/ToolCallParser.ts"
import * as Fair from "./fairScheduler.ts"
import { chatRequest, completionRequests, completionText, makeText, stableText } from "./openAiServerRequests.ts"
import { adapterStamp, generate, type Model, nextId, now, type ServerState } from "./openAiServerState.ts"
import { done, event, samplerError, startEvents, toolCalls, usage } from "./openAiWire.ts"

const logprobToken = (model: Model, id: number, asIds: boolean) =>
  asIds ? `token_id:${id}` : model.tokenizer.decode([id])

const finishOf = (reason: FinishReason, calls: number) => (calls > 0 ? "tool_calls" : reason)

/** The tool calls in a chat answer's text (none without `tools`), and the text around them. */
const parseToolCalls = (model: Model, text: string, tools: ReadonlyArray<unknown>, prompt: ReadonlyArray<number>) => {
  if (tools.length === 0) return { content: text, toolCalls: [] as ReadonlyArray<Message.ToolCall> }
  // Ids unique across a conversation's answers (as OpenAI's: its history holds every turn's calls), and the same
  // for the same seeded answer: a hash of the prompt and the answer.
  const digest = createHash("sha256").update(Int32Array.from(prompt)).update(text).digest("hex").slice(0, 12)
  const parsed = ToolCallParser.parse(model.template.toolCallFormat, text, { idPrefix: `call_${digest}_` })
  return { content: parsed.content, toolCalls: parsed.toolCalls }
}

const chatLogprobs = (model: Model, result: GenerateResult) => ({
  content: result.tokenIds.map((id, i) => {
    const token = model.tokenizer.decode([id])
    return { token, logprob: result.logprobs[i]!, bytes: [...new TextEncoder().encode(token)], top_logprobs: [] }
  })
})

// ===== Completions =====

/**
 * A prompt's `prompt_logprobs` in vLLM's shape: `null` for the first token, then per token an object keyed by token
 * id (as a string) holding `{ logprob, rank, decoded_token }` for the prompt's token and the `k` likeliest.
 */
const promptLogprobs = (
  state: ServerState,
  ids: ReadonlyArray<number>,
  k: number,
  asIds: boolean
) =>
  Effect.map(
    Effect.mapError(state.engine.score!(ids, { top: k }), samplerError),
    (scores) =>
      scores.map((s, t) => {
        if (s === null) return null
        const entry = (id: number, logprob: number, rank: number) => ({
          logprob,
          rank,
          decoded_token: logprobToken(state.model, id, asIds)
        })
        const out: Record<string, ReturnType<typeof entry>> = { [ids[t]!]: entry(ids[t]!, s.logprob, s.rank) }
        s.top.forEach((alt, r) => {
          if (out[alt.id] === undefined) out[alt.id] = entry(alt.id, alt.logprob, r + 1)
        })
        return out
      })
  )

/**
 * `/v1/completions`: every prompt sampled (at most `perRequest` at once), one choice each.
 *
 * @category constructors
 * @since 0.1.0
 */
export const completions = Effect.fnUntraced(function*(state: ServerState, raw: unknown) {
  const { model } = state
  const { body, promptLogprobs: k, requests } = yield* completionRequests(state, raw, false)
  const lane = Fair.makeLane()
  const results = yield* Effect.forEach(requests, (r) => generate(state, lane, r), { concurrency: state.perRequest })
  const asIds = body.return_tokens_as_token_ids === true
  // Scored after sampling, one prompt at a time (each costs a decode run per token).
  const scored = k === undefined ?
    undefined :
    yield* Effect.forEach(requests, (r) => promptLogprobs(state, r.promptTokenIds, k, asIds))
  const choices = results.map((result, index) => ({
    index,
    text: completionText(model, result, body),
    token_ids: result.tokenIds,
    prompt_token_ids: requests[index]!.promptTokenIds,
    logprobs: body.logprobs === undefined || body.logprobs === null ? null : {
      tokens: result.tokenIds.map((id) => logprobToken(model, id, asIds)),
      token_logprobs: result.logprobs,
      top_logprobs: result.tokenIds.map((id, i) => ({ [logprobToken(model, id, asIds)]: result.logprobs[i]! })),
      text_offset: result.tokenIds.map(() => 0)
    },
    finish_reason: result.finishReason,
    policy_version: result.policyVersion,
    ...(scored === undefined ? {} : { prompt_logprobs: scored[index]! })
  }))
  const promptTokens = requests.reduce((n, r) => n + r.promptTokenIds.length, 0)
  const completionTokens = results.reduce((n, r) => n + r.tokenIds.length, 0)
  return {
    id: nextId(state, "cmpl"),
    object: "text_completion",
    created: yield* now,
    model: model.name,
    choices,
    usage: usage(promptTokens, completionTokens),
    policy_version: results[0]!.policyVersion
  }
})

/**
 * `stream: true` on `/v1/completions`: one event per sampled token (its text delta may be empty).
 *
 * @category constructors
 * @since 0.1.0
 */
export const completionsStream = Effect.fnUntraced(function*(
  state: ServerState,
  raw: unknown,
  res: Http.ServerResponse
) {
  const { model } = state
  const { body, requests } = yield* completionRequests(state, raw, true)
  const request = requests[0]!
  const id = nextId(state, "cmpl"), created = yield* now
  const chunk = (choice: Record<string, unknown>) =>
    event({ id, object: "text_completion", created, model: model.name, choices: [{ index: 0, ...choice }] })
  const text = makeText(model, body.skip_special_tokens ?? true)
  const stop = new Set(request.sampling.stopTokenIds)
  const asIds = body.return_tokens_as_token_ids === true
  const withLogprobs = body.logprobs !== undefined && body.logprobs !== null
  const shown: Array<number> = []
  let sent = 0
  startEvents(res)
  const onToken = (tokenId: number, logprob: number) => {
    if (!stop.has(tokenId) || body.include_stop_str_in_output === true) shown.push(tokenId)
    const current = stableText(text(shown))
    const delta = current.length > sent ? current.slice(sent) : ""
    sent = Math.max(sent, current.length)
    res.write(chunk({
      text: delta,
      token_ids: [tokenId],
      logprobs: withLogprobs ? { tokens: [logprobToken(model, tokenId, asIds)], token_logprobs: [logprob] } : null,
      finish_reason: null
    }))
  }
  const result = yield* generate(state, Fair.makeLane(), request, onToken)
  const full = text(shown)
  res.write(chunk({
    text: full.length > sent ? full.slice(sent) : "",
    token_ids: [],
    finish_reason: result.finishReason,
    policy_version: result.policyVersion,
    ...adapterStamp(state)
  }))
  res.end(done)
})

// ===== Chat =====

/**
 * `/v1/chat/completions`: one assistant message, its tool calls parsed against the request's `tools`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chat = Effect.fnUntraced(function*(state: ServerState, raw: unknown) {
  const { model } = state
  const { body, tools, request } = yield* chatRequest(state, raw)
  const ids = request.promptTokenIds
  const result = yield* generate(state, Fair.makeLane(), request)
  const text = completionText(model, result, { ...body, include_stop_str_in_output: false })
  const { content, toolCalls: calls } = parseToolCalls(model, text, tools, ids)
  return {
    id: nextId(state, "chatcmpl"),
    object: "chat.completion",
    created: yield* now,
    model: model.name,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: calls.length > 0 && content === "" ? null : content,
        ...(calls.length > 0 ? { tool_calls: toolCalls(calls) } : {})
      },
      logprobs: body.logprobs === true ? chatLogprobs(model, result) : null,
      finish_reason: finishOf(result.finishReason, calls.length),
      token_ids: result.tokenIds,
      policy_version: result.policyVersion
    }],
    prompt_token_ids: ids,
    usage: usage(ids.length, result.tokenIds.length),
    policy_version: result.policyVersion
  }
})

/** How much of `current` a streamed chat may show: all of it, or up to a tool-call tag (or what may start one). */
const shownBeforeTag = (
  current: string,
  toolOpen: string | undefined
): { readonly text: string; readonly tag: boolean } => {
  const tag = toolOpen === undefined ? -1 : current.indexOf(toolOpen)
  if (tag >= 0) return { text: current.slice(0, tag), tag: true }
  if (toolOpen !== undefined) {
    // Hold back a suffix that could be the start of the tool-call tag.
    for (let k = Math.min(toolOpen.length - 1, current.length); k > 0; k--) {
      if (toolOpen.startsWith(current.slice(current.length - k))) {
        return { text: current.slice(0, current.length - k), tag: false }
      }
    }
  }
  return { text: current, tag: false }
}

/**
 * `stream: true` on `/v1/chat/completions`: the role, the text as it is sampled (held back from a tool-call tag
 * on), the tool calls in one delta, the finish reason, the usage when asked for.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chatStream = Effect.fnUntraced(function*(state: ServerState, raw: unknown, res: Http.ServerResponse) {
  const { model } = state
  const { body, tools, request } = yield* chatRequest(state, raw)
  const id = nextId(state, "chatcmpl"), created = yield* now
  const head = { id, object: "chat.completion.chunk", created, model: model.name }
  const chunk = (delta: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
    event({ ...head, choices: [{ index: 0, delta, finish_reason: finish, ...extra }] })
  const text = makeText(model, true)
  const stop = new Set(request.sampling.stopTokenIds)
  const sampled: Array<number> = []
  let sent = 0, holding = false
  const toolOpen = tools.length > 0 ? "<tool_call>" : undefined
  startEvents(res)
  res.write(chunk({ role: "assistant", content: "" }, null))
  const onToken = (tokenId: number, logprob: number) => {
    if (stop.has(tokenId)) return
    sampled.push(tokenId)
    if (holding) return
    const shown = shownBeforeTag(stableText(text(sampled)), toolOpen)
    holding = shown.tag
    if (shown.text.length > sent) {
      const delta = shown.text.slice(sent)
      const logprobs = { logprobs: { content: [{ token: delta, logprob, top_logprobs: [] }] } }
      res.write(chunk({ content: delta }, null, body.logprobs === true ? logprobs : {}))
      sent = shown.text.length
    }
  }
  const result = yield* generate(state, Fair.makeLane(), request, onToken)
  const full = text(sampled)
  const { content, toolCalls: calls } = parseToolCalls(model, full, tools, request.promptTokenIds)
  if (calls.length === 0 && full.length > sent) res.write(chunk({ content: full.slice(sent) }, null))
  else if (calls.length > 0) {
    const rest = content.length > sent ? content.slice(sent) : ""
    res.write(chunk({ ...(rest === "" ? {} : { content: rest }), tool_calls: toolCalls(calls) }, null))
  }
  const finish = finishOf(result.finishReason, calls.length)
  res.write(chunk({}, finish, {
    token_ids: result.tokenIds,
    policy_version: result.policyVersion,
    ...adapterStamp(state)
  }))
  if (body.stream_options?.include_usage === true) {
    res.write(event({ ...head, choices: [], usage: usage(request.promptTokenIds.length, result.tokenIds.length) }))
  }
  res.end(done)
})
