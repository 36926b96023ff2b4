/**
 * The incremental token-in / token-out builder: the heart of loss masking.
 *
 * A builder starts from the prompt (the template rendered over the first messages with the tools and
 * `add_generation_prompt`), then alternates two steps:
 *
 * 1. `appendSampled`: the policy's sampled ids are appended **verbatim**, with their logprobs and policy version
 *    (source `policy`, the only trainable tokens; the end-of-turn token the policy sampled is among them).
 * 2. `appendObservations`: tool results and environment messages are appended by rendering the template over the
 *    extended message list and tokenizing **only the new suffix** (`\n<|im_start|>user\n<tool_response>...` up to
 *    the next assistant header), after checking that the rendered text still starts with everything so far. A
 *    template with a tail renderer (`ChatTemplate.renderTail`: the built-in `qwen2.5` and `chatml`) renders only
 *    the new messages, so a turn's render does not grow with the conversation.
 *
 * **How assistant turns are rendered.** The template never sees an assistant turn's structured `tool_calls`:
 * for rendering, each sampled turn is the assistant message whose content is the decoded sampled text (without the
 * end-of-turn token), as AgentFly does with `ignore_tool_calls`. So the rendered history contains exactly what the
 * model wrote (its own JSON spacing, its own `<tool_call>` tags), and the prefix check compares the template's
 * view of the sampled turn with the sampled text itself. The parsed message (with `tool_calls`) is kept in the
 * message view, `messages`, for tools, rewards and logs.
 *
 * **Rewrites start a new segment.** When the rendered text no longer starts with the tokens so far (Qwen3 drops
 * the `<think>` block of turns before the last user query; a template that trims or reformats a sampled turn), the
 * current segment is closed and a new one starts from a fresh render of the whole history (source `prompt`, mask
 * 0). The builder records a `Rewrite` saying where the texts diverged; nothing drifts silently. Each segment is
 * therefore exactly the template's tokenization of the conversation it covers.
 *
 * **Folds start a new segment too.** `fold` replaces the context the template renders by a shorter one (a context
 * policy's, `src/ContextPolicy.ts`): the open segment is closed and a new one starts from a fresh render of the new
 * context, all of it prompt (mask 0). The message view keeps every message; the builder records a `Fold`.
 *
 * Tokenization of a suffix is exact because text is cut at added tokens (`<|im_end|>`, `<|im_start|>`, ...) before
 * the tokenizer model runs: a suffix that starts at such a boundary tokenizes as it would inside the whole text.
 *
 * @since 0.1.0
 */
import { Effect, Result, Schema } from "effect"
import * as ChatTemplate from "./ChatTemplate.ts"
import * as Message from "./Message.ts"
import * as MessageImages from "./MessageImages.ts"
import * as Tokenizer from "./Tokenizer.ts"
import * as Trajectory from "./Trajectory.ts"

// ===== Errors =====

/**
 * Sampled ids outside the vocabulary (`cause`: the tokenizer's error).
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidTokenIds extends Schema.TaggedError<InvalidTokenIds>()("InvalidTokenIds", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Logprobs given, but not one per sampled id.
 *
 * @category errors
 * @since 0.1.0
 */
export class LogprobsMismatch extends Schema.TaggedError<LogprobsMismatch>()("LogprobsMismatch", {
  message: Schema.String,
  /** How many logprobs were given. */
  logprobs: Schema.Int,
  /** How many ids were sampled. */
  tokenIds: Schema.Int
}) {}

/**
 * A sample right after a sample, or an assistant message passed as an observation.
 *
 * @category errors
 * @since 0.1.0
 */
export class OutOfOrder extends Schema.TaggedError<OutOfOrder>()("OutOfOrder", { message: Schema.String }) {}

/**
 * The chat template could not render the conversation (`cause`: its `TemplateError`, when it failed).
 *
 * @category errors
 * @since 0.1.0
 */
export class TemplateFailed extends Schema.TaggedError<TemplateFailed>()("TemplateFailed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * An image part could not be used: the model has no vision, the URL is remote, the bytes do not decode (`cause`:
 * the `Image.ImageError`, whose reason says which).
 *
 * @category errors
 * @since 0.1.0
 */
export class ImageFailed extends Schema.TaggedError<ImageFailed>()("ImageFailed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why a builder step failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const BuilderErrorReason = Schema.Union([
  InvalidTokenIds,
  LogprobsMismatch,
  OutOfOrder,
  TemplateFailed,
  ImageFailed
])
export type BuilderErrorReason = typeof BuilderErrorReason.Type

/**
 * A builder step failed. `message` is the reason's. Handle reasons with
 * `Effect.catchReason("TrajectoryBuilderError", "InvalidTokenIds", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class BuilderError extends Schema.TaggedError<BuilderError>()("TrajectoryBuilderError", {
  reason: BuilderErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `builderError`; a reason left out is a compile error. */
const reasons = { InvalidTokenIds, LogprobsMismatch, OutOfOrder, TemplateFailed, ImageFailed } satisfies Record<
  BuilderErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type BuilderErrorFacts<Tag extends BuilderErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `BuilderError` of the reason tagged `tag`: `builderError("OutOfOrder", text)`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const builderError = <Tag extends BuilderErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: BuilderErrorFacts<Tag>
): BuilderError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => BuilderErrorReason
  return new BuilderError({ reason: new Reason({ ...facts, message }) })
}

// ===== Models =====

/**
 * A history rewrite: at message `atMessage` the template's render diverged from the tokens so far at character
 * `offset` of the segment's text, so segment `newSegment` was started. `expected` / `actual` are the 80 characters
 * from the divergence.
 *
 * @category models
 * @since 0.1.0
 */
export interface Rewrite {
  readonly atMessage: number
  readonly newSegment: number
  readonly offset: number
  readonly expected: string
  readonly actual: string
}

/**
 * A fold: before message `atMessage` of the message view the context was replaced by `contextMessages` messages
 * (`kind`: the context policy's name), and segment `newSegment` started.
 *
 * @category models
 * @since 0.1.0
 */
export interface Fold {
  readonly atMessage: number
  readonly newSegment: number
  readonly contextMessages: number
  readonly kind: string
}

/**
 * What the policy sampled for one assistant turn.
 *
 * @category models
 * @since 0.1.0
 */
export interface Sample {
  /** The sampled ids, verbatim, usually ending with the end-of-turn token. */
  readonly tokenIds: ReadonlyArray<number>
  /** One logprob per sampled id. */
  readonly logprobs?: ReadonlyArray<number> | undefined
  readonly policyVersion?: number | undefined
  /**
   * The parsed assistant message for the message view (e.g. `ToolCallParser.toAssistantMessage(...)`). Default:
   * an assistant message holding the decoded text.
   */
  readonly message?: Message.Message | undefined
}

/**
 * Options of `start`.
 *
 * @category models
 * @since 0.1.0
 */
export interface StartOptions {
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  /** The conversation so far (system, user, possibly few-shot turns): all of it is prompt (mask 0). */
  readonly messages: ReadonlyArray<Message.Message>
  readonly tools?: ReadonlyArray<ChatTemplate.ToolSpec> | undefined
  /** Extra template variables, e.g. `{ enable_thinking: false }`. */
  readonly variables?: Readonly<Record<string, unknown>> | undefined
}

const TypeId = "~agentfly/TrajectoryBuilder"

/**
 * An immutable builder state; every step returns a new one.
 *
 * - `messages`: the message view (parsed assistant messages, observations).
 * - `segments`: the token-level segments so far (the last one is open).
 * - `rewrites`: one entry per segment started because the template rewrote history.
 * - `folds`: one entry per segment started by `fold`.
 * - `awaitingObservation`: true right after a sample.
 *
 * @category models
 * @since 0.1.0
 */
export interface TrajectoryBuilder {
  readonly [TypeId]: typeof TypeId
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  readonly tools: ReadonlyArray<ChatTemplate.ToolSpec>
  readonly variables: Readonly<Record<string, unknown>>
  readonly messages: ReadonlyArray<Message.Message>
  readonly segments: ReadonlyArray<Trajectory.Segment>
  readonly rewrites: ReadonlyArray<Rewrite>
  readonly folds: ReadonlyArray<Fold>
  readonly awaitingObservation: boolean
  /** What the template renders: assistant turns as their sampled text. */
  readonly renderMessages: ReadonlyArray<Message.Message>
  /** The text of the open segment's tokens, except a pending sample. */
  readonly rendered: string
  /** The decoded text of the last sample while `awaitingObservation`. */
  readonly pending: string
  /**
   * The `renderMessages` whose render with the generation prompt `rendered` is (set by `start` and
   * `appendObservations`), so that `assistantTurnText` need not render it again; any other value means unknown.
   */
  readonly promptOf?: ReadonlyArray<Message.Message> | undefined
}

// ===== Tokenization with sources =====

interface Region {
  readonly start: number
  readonly end: number
  readonly source: Trajectory.Source
}

/**
 * Tokenizes `text` piece by piece (pieces cut at added tokens, so the ids equal the whole text's) and labels each
 * piece with the source of the region it overlaps, `fallback` elsewhere. Adjacent pieces of one source share a span.
 */
const tokenizeWithSources = (
  tokenizer: Tokenizer.Tokenizer,
  text: string,
  regions: ReadonlyArray<Region>,
  fallback: Trajectory.Source
): Array<Trajectory.Span> => {
  const spans: Array<Trajectory.Span> = []
  const pieces = tokenizer.encodePieces(text)
  // The open span: pieces of one source, ids [spanStart, idEnd).
  let source: Trajectory.Source | undefined
  let spanStart = 0
  let idEnd = 0
  const close = () => {
    if (source !== undefined && idEnd > spanStart) spans.push({ source, tokenIds: pieces.ids.slice(spanStart, idEnd) })
  }
  let offset = 0
  let r = 0
  for (let i = 0; i < pieces.textEnds.length; i++) {
    const end = pieces.textEnds[i]!
    while (r < regions.length && regions[r]!.end <= offset) r++
    const region = regions[r]
    const next = region !== undefined && region.start < end && region.end > offset ? region.source : fallback
    if (next !== source) {
      close()
      source = next
      spanStart = idEnd
    }
    idEnd = pieces.idEnds[i]!
    offset = end
  }
  close()
  return spans
}

/** Image parts decoded (`MessageImages.resolve`); a failure is the builder's `ImageFailed`. */
const resolveImages = (
  template: ChatTemplate.ChatTemplate,
  messages: ReadonlyArray<Message.Message>
): Effect.Effect<ReadonlyArray<Message.Message>, BuilderError> =>
  MessageImages.resolve(messages, template).pipe(
    Effect.mapError((error) => builderError("ImageFailed", error.message, { cause: error }))
  )

/** The spans with the image placeholder runs of `messages`' image parts marked (a template without vision: as is). */
const withImageSpans = (
  builder: Pick<TrajectoryBuilder, "template" | "tokenizer">,
  spans: Array<Trajectory.Span>,
  messages: ReadonlyArray<Message.Message>,
  fallback: Trajectory.Source
): Array<Trajectory.Span> =>
  builder.template.vision === undefined
    ? spans
    : MessageImages.markImageSpans(
      spans,
      MessageImages.imageParts(messages, fallback),
      builder.template,
      builder.tokenizer
    )

/** Where each observation's content sits in the rendered suffix (searched in order; absent contents are skipped). */
const observationRegions = (suffix: string, observations: ReadonlyArray<Message.Message>): Array<Region> => {
  const regions: Array<Region> = []
  let cursor = 0
  for (const message of observations) {
    const content = Message.text(message.content)
    if (content.length === 0) continue
    const at = suffix.indexOf(content, cursor)
    if (at === -1) continue
    regions.push({ start: at, end: at + content.length, source: message.role === "tool" ? "tool" : "env" })
    cursor = at + content.length
  }
  return regions
}

/** Like `observationRegions`, searching backwards from the end of `text` (observations end a render). */
const trailingRegions = (text: string, observations: ReadonlyArray<Message.Message>): Array<Region> => {
  const regions: Array<Region> = []
  let cursor = text.length
  for (let i = observations.length - 1; i >= 0; i--) {
    const message = observations[i]!
    const content = Message.text(message.content)
    if (content.length === 0 || cursor - content.length < 0) continue
    const at = text.lastIndexOf(content, cursor - content.length)
    if (at === -1) continue
    regions.unshift({ start: at, end: at + content.length, source: message.role === "tool" ? "tool" : "env" })
    cursor = at
  }
  return regions
}

// ===== Helpers =====

const templateFailed = (error: ChatTemplate.TemplateError) =>
  builderError("TemplateFailed", error.message, { cause: error })

const render = (
  builder: Pick<TrajectoryBuilder, "template" | "tools" | "variables">,
  messages: ReadonlyArray<Message.Message>,
  addGenerationPrompt: boolean
) =>
  builder.template.render(messages, { tools: builder.tools, addGenerationPrompt, variables: builder.variables }).pipe(
    Effect.mapError(templateFailed)
  )

/**
 * Whether `text` holds `prefix` at `position` (`text.startsWith(prefix, position)`). V8's `startsWith` compares
 * character by character (≈ 6 ns a character here: 20 µs for a 3 KB conversation, the largest cost of a turn once
 * the template rendered natively), while `===` on a slice compares the memory at once (≈ 0.1 µs).
 */
const startsWithText = (text: string, prefix: string, position = 0): boolean =>
  text.length >= position + prefix.length && text.slice(position, position + prefix.length) === prefix

const divergence = (a: string, b: string): number => {
  const n = Math.min(a.length, b.length)
  let i = 0
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++
  return i
}

const withOpenSegment = (
  builder: TrajectoryBuilder,
  update: (segment: Trajectory.Segment) => Trajectory.Segment
): ReadonlyArray<Trajectory.Segment> => {
  const segments = builder.segments.slice()
  segments[segments.length - 1] = update(segments[segments.length - 1]!)
  return segments
}

/** `items` and then `item`, in a new array. */
const appended = <A>(items: ReadonlyArray<A>, item: A): Array<A> => {
  const out = items.slice()
  out.push(item)
  return out
}

/** What a step changes; the tokenizer, template, tools and variables stay. */
type State = Omit<TrajectoryBuilder, typeof TypeId | "tokenizer" | "template" | "tools" | "variables">

/**
 * The builder with a new state. Every builder is made here, with its fields in one order, so that V8 gives all of
 * them one shape (`{ ...builder, ... }` made a new one per step, and property reads on them slower).
 */
const withState = (builder: TrajectoryBuilder, state: State): TrajectoryBuilder => ({
  [TypeId]: TypeId,
  tokenizer: builder.tokenizer,
  template: builder.template,
  tools: builder.tools,
  variables: builder.variables,
  messages: state.messages,
  segments: state.segments,
  rewrites: state.rewrites,
  folds: state.folds,
  awaitingObservation: state.awaitingObservation,
  renderMessages: state.renderMessages,
  rendered: state.rendered,
  pending: state.pending,
  promptOf: state.promptOf
})

/** `withState` for steps off the hot path that change a few fields. */
const withChanges = (builder: TrajectoryBuilder, changes: Partial<State>): TrajectoryBuilder =>
  withState(builder, { ...builder, ...changes })

const stopIdCache = new WeakMap<ChatTemplate.ChatTemplate, WeakMap<Tokenizer.Tokenizer, ReadonlySet<number>>>()

const stopIds = (builder: Pick<TrajectoryBuilder, "template" | "tokenizer">): ReadonlySet<number> => {
  let byTokenizer = stopIdCache.get(builder.template)
  if (byTokenizer === undefined) {
    byTokenizer = new WeakMap()
    stopIdCache.set(builder.template, byTokenizer)
  }
  const cached = byTokenizer.get(builder.tokenizer)
  if (cached !== undefined) return cached
  const ids = computeStopIds(builder)
  byTokenizer.set(builder.tokenizer, ids)
  return ids
}

const computeStopIds = (builder: Pick<TrajectoryBuilder, "template" | "tokenizer">): ReadonlySet<number> =>
  new Set(
    builder.template.stopTokens.flatMap((token) => {
      const id = builder.tokenizer.tokenToId(token)
      return id === undefined ? [] : [id]
    })
  )

// ===== Constructors =====

/**
 * Starts a trajectory from the prompt messages: renders them with the tools and `add_generation_prompt` and
 * tokenizes the result (source `prompt`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const start = Effect.fnUntraced(function*(startOptions: StartOptions) {
  const options = MessageImages.anyImage(startOptions.messages)
    ? { ...startOptions, messages: yield* resolveImages(startOptions.template, startOptions.messages) }
    : startOptions
  const tools = options.tools ?? []
  const variables = options.variables ?? {}
  const context = { template: options.template, tools, variables }
  const rendered = yield* render(context, options.messages, true)
  const tokens = tokenizeWithSources(options.tokenizer, rendered, [], "prompt")
  const spans = withImageSpans(options, tokens, options.messages, "prompt")
  const builder: TrajectoryBuilder = {
    [TypeId]: TypeId,
    tokenizer: options.tokenizer,
    template: options.template,
    tools,
    variables,
    messages: options.messages,
    segments: [{ spans, messageCount: options.messages.length }],
    rewrites: [],
    folds: [],
    awaitingObservation: false,
    renderMessages: options.messages,
    rendered,
    pending: "",
    promptOf: options.messages
  }
  return builder
})

// ===== Combinators =====

/**
 * Appends what the policy sampled, verbatim. The end-of-turn token is expected last (it is trainable); a sample
 * cut by `maxTokens` may lack it, and the template's own end-of-turn token then arrives with the next observation
 * as a `template` token.
 *
 * @category combinators
 * @since 0.1.0
 */
export const appendSampled = (
  builder: TrajectoryBuilder,
  sample: Sample
): Effect.Effect<TrajectoryBuilder, BuilderError> => Effect.suspend(() => Effect.fromResult(sampled(builder, sample)))

/** The span of a sample: copies of its ids and logprobs, its policy version when known. */
const policySpan = (ids: ReadonlyArray<number>, sample: Sample): Trajectory.Span => {
  type Mutable = { -readonly [K in keyof Trajectory.Span]: Trajectory.Span[K] }
  // Assigned, not spread in: a spread of `{}` or `{ logprobs }` allocates an object per sample.
  const span: Mutable = { source: "policy", tokenIds: ids.slice() }
  if (sample.logprobs !== undefined) span.logprobs = sample.logprobs.slice()
  if (sample.policyVersion !== undefined) span.policyVersion = sample.policyVersion
  return span
}

/** `appendSampled` as a plain function: a rollout appends a turn every step, without the cost of an effect. */
const sampled = (builder: TrajectoryBuilder, sample: Sample): Result.Result<TrajectoryBuilder, BuilderError> => {
  if (builder.awaitingObservation) {
    return Result.fail(
      builderError("OutOfOrder", "two samples in a row: append the observations (or finish) before sampling again")
    )
  }
  const ids = sample.tokenIds
  const valid = Tokenizer.checkIds(builder.tokenizer, ids)
  if (Result.isFailure(valid)) {
    return Result.fail(builderError("InvalidTokenIds", valid.failure.message, { cause: valid.failure }))
  }
  if (sample.logprobs !== undefined && sample.logprobs.length !== ids.length) {
    return Result.fail(
      builderError("LogprobsMismatch", `${sample.logprobs.length} logprobs for ${ids.length} sampled ids`, {
        logprobs: sample.logprobs.length,
        tokenIds: ids.length
      })
    )
  }
  const endsWithStop = ids.length > 0 && stopIds(builder).has(ids[ids.length - 1]!)
  const body = builder.tokenizer.decode(endsWithStop ? ids.slice(0, -1) : ids)
  const text = endsWithStop ? body + builder.tokenizer.decode(ids.slice(-1)) : body
  const span: Trajectory.Span = policySpan(ids, sample)
  const message: Message.Message = sample.message ?? { role: "assistant", content: body }
  const messages = appended(builder.messages, message)
  return Result.succeed(withState(builder, {
    messages,
    segments: withOpenSegment(builder, (segment) => ({
      spans: ids.length === 0 ? segment.spans : appended(segment.spans, span),
      messageCount: messages.length
    })),
    rewrites: builder.rewrites,
    folds: builder.folds,
    awaitingObservation: true,
    renderMessages: appended<Message.Message>(builder.renderMessages, { role: "assistant", content: body }),
    rendered: builder.rendered,
    pending: text,
    promptOf: builder.promptOf
  }))
}

/**
 * Appends observations: tool results (source `tool`), environment messages such as a user turn (source `env`),
 * and the template text around them up to the next assistant header (source `template`). Renders the whole
 * conversation and tokenizes only the new suffix; if the render no longer starts with the text so far, closes the
 * segment and starts a new one (see the module docs).
 *
 * @category combinators
 * @since 0.1.0
 */
export const appendObservations = (
  builder: TrajectoryBuilder,
  observations: ReadonlyArray<Message.Message>
): Effect.Effect<TrajectoryBuilder, BuilderError> =>
  MessageImages.anyImage(observations)
    ? Effect.flatMap(resolveImages(builder.template, observations), (resolved) => appendResolved(builder, resolved))
    : appendResolved(builder, observations)

const appendResolved = (
  builder: TrajectoryBuilder,
  observations: ReadonlyArray<Message.Message>
): Effect.Effect<TrajectoryBuilder, BuilderError> =>
  Effect.suspend(() => {
    if (observations.some((m) => m.role === "assistant")) {
      return Effect.fail(
        builderError(
          "OutOfOrder",
          "an assistant message is not an observation: append what the policy sampled with appendSampled"
        )
      )
    }
    const renderMessages = builder.renderMessages.concat(observations)
    const messages = builder.messages.concat(observations)
    const fast = appendAfterSample(builder, renderMessages, messages, observations)
    return fast !== undefined ? Effect.succeed(fast) : appendByRender(builder, renderMessages, messages, observations)
  })

/** `appendObservations` by rendering the whole conversation (no tail renderer, observations after observations). */
const appendByRender = Effect.fnUntraced(function*(
  current: TrajectoryBuilder,
  renderMessages: ReadonlyArray<Message.Message>,
  messages: ReadonlyArray<Message.Message>,
  observations: ReadonlyArray<Message.Message>
) {
  let builder = current
  const next = yield* render(builder, renderMessages, true)
  if (!builder.awaitingObservation && !startsWithText(next, builder.rendered)) {
    // Observations right after observations: the generation prompt already appended is taken back first.
    const retracted = yield* retractGenerationPrompt(builder, next)
    if (retracted !== undefined) builder = retracted
  }
  // `next` starts with the text so far (compared in two parts: concatenating them would copy the whole text).
  if (startsWithText(next, builder.rendered) && startsWithText(next, builder.pending, builder.rendered.length)) {
    const suffix = next.slice(builder.rendered.length + builder.pending.length)
    return extended(builder, { messages, renderMessages, observations, suffix, rendered: next })
  }
  // The template rewrote history: close the open segment and start a new one from a fresh render. The new
  // segment's history (through the last end-of-turn before the observations) is its prompt.
  const closed = yield* closeSegment(builder)
  const expected = builder.rendered + builder.pending
  const at = divergence(expected, next)
  const observed = trailingRegions(next, observations)
  const firstObservation = observed[0]?.start ?? next.length
  const lastTurnEnd = next.lastIndexOf(builder.template.endOfTurn, firstObservation - 1)
  const historyEnd = lastTurnEnd === -1 ? firstObservation : lastTurnEnd + builder.template.endOfTurn.length
  const regions: Array<Region> = [{ start: 0, end: historyEnd, source: "prompt" }, ...observed]
  const tokens = tokenizeWithSources(builder.tokenizer, next, regions, "template")
  const spans = withImageSpans(builder, tokens, renderMessages, "env")
  const rewrite: Rewrite = {
    atMessage: builder.messages.length,
    newSegment: closed.length,
    offset: at,
    expected: expected.slice(at, at + 80),
    actual: next.slice(at, at + 80)
  }
  yield* Effect.logDebug("TrajectoryBuilder: the chat template rewrote history; starting a new segment").pipe(
    Effect.annotateLogs({ template: builder.template.name, atMessage: rewrite.atMessage, offset: at })
  )
  return withState(builder, {
    messages,
    segments: appended(closed, { spans, messageCount: messages.length }),
    rewrites: appended(builder.rewrites, rewrite),
    folds: builder.folds,
    awaitingObservation: false,
    renderMessages,
    rendered: next,
    pending: "",
    promptOf: renderMessages
  })
})

/**
 * `appendObservations` right after a sample by the template's tail renderer (`ChatTemplate.renderTail`): the
 * sampled turn and the observations are rendered alone, not the whole conversation. `rendered` is the render of
 * `promptOf` (the messages before the sample) with the generation prompt, so the whole render would be `rendered`
 * without that prompt, then the tail from the sampled turn on: it extends the text so far exactly when that tail
 * starts with the generation prompt and the sampled text. `undefined` when the template has no tail renderer or
 * this condition fails (a rewrite): the whole render then decides.
 */
const appendAfterSample = (
  builder: TrajectoryBuilder,
  renderMessages: ReadonlyArray<Message.Message>,
  messages: ReadonlyArray<Message.Message>,
  observations: ReadonlyArray<Message.Message>
): TrajectoryBuilder | undefined => {
  const tail = builder.template.renderTail
  const before = builder.promptOf
  const sampledAt = builder.renderMessages.length - 1
  if (tail === undefined || !builder.awaitingObservation || before === undefined || before.length !== sampledAt) {
    return undefined
  }
  const generation = tail(before, sampledAt, true)
  // One tail from the sampled turn on: by the tail renderer's contract, the sampled turn's tail then the
  // observations' tail, in one render.
  const written = tail(renderMessages, sampledAt, true)
  if (generation === undefined || written === undefined) return undefined
  const sampled = generation + builder.pending
  if (!startsWithText(written, sampled)) return undefined
  const suffix = written.slice(sampled.length)
  return extended(builder, {
    messages,
    renderMessages,
    observations,
    suffix,
    rendered: builder.rendered + builder.pending + suffix
  })
}

/** The open segment extended by `suffix` (the observations and the template text around them), tokenized. */
const extended = (
  builder: TrajectoryBuilder,
  next: {
    readonly messages: ReadonlyArray<Message.Message>
    readonly renderMessages: ReadonlyArray<Message.Message>
    readonly observations: ReadonlyArray<Message.Message>
    readonly suffix: string
    /** The whole text so far: the render, or the text before plus `suffix`. */
    readonly rendered: string
  }
): TrajectoryBuilder => {
  const { messages, renderMessages, suffix } = next
  const regions = observationRegions(suffix, next.observations)
  const spans = withImageSpans(
    builder,
    tokenizeWithSources(builder.tokenizer, suffix, regions, "template"),
    next.observations,
    "env"
  )
  return withState(builder, {
    messages,
    segments: withOpenSegment(builder, (segment) => ({
      spans: segment.spans.concat(spans),
      messageCount: messages.length
    })),
    rewrites: builder.rewrites,
    folds: builder.folds,
    awaitingObservation: false,
    renderMessages,
    rendered: next.rendered,
    pending: "",
    promptOf: renderMessages
  })
}

/**
 * The builder without the trailing generation prompt (`<|im_start|>assistant\n`), when the open segment ends with
 * it and `next` extends the text before it; `undefined` otherwise.
 */
const retractGenerationPrompt = Effect.fnUntraced(function*(builder: TrajectoryBuilder, next: string) {
  const probe: ReadonlyArray<Message.Message> = [{ role: "user", content: "x" }]
  const withPrompt = yield* render(builder, probe, true)
  const without = yield* render(builder, probe, false)
  const generationPrompt = startsWithText(withPrompt, without) ? withPrompt.slice(without.length) : ""
  if (generationPrompt.length === 0 || !builder.rendered.endsWith(generationPrompt)) return undefined
  const base = builder.rendered.slice(0, -generationPrompt.length)
  if (!startsWithText(next, base)) return undefined
  const ids = spanIds(tokenizeWithSources(builder.tokenizer, generationPrompt, [], "template"))
  const open = promptTokenIds(builder)
  if (open.length < ids.length || ids.some((id, i) => open[open.length - ids.length + i] !== id)) return undefined
  return withChanges(builder, {
    segments: withOpenSegment(builder, (s) => Trajectory.clipSegment(s, Trajectory.segmentLength(s) - ids.length)),
    rendered: base,
    promptOf: undefined
  })
})

/**
 * The open segment's segments after appending the template's closing text of a final assistant turn (Qwen's
 * `\n` after `<|im_end|>`), when the template renders one that extends the tokens so far.
 */
const closeSegment = Effect.fnUntraced(function*(builder: TrajectoryBuilder) {
  if (!builder.awaitingObservation) return builder.segments
  const expected = builder.rendered + builder.pending
  const full = yield* render(builder, builder.renderMessages, false)
  if (!startsWithText(full, expected) || full.length === expected.length) return builder.segments
  const spans = tokenizeWithSources(builder.tokenizer, full.slice(expected.length), [], "template")
  return withOpenSegment(builder, (segment) => ({ ...segment, spans: segment.spans.concat(spans) }))
})

/**
 * Ends the trajectory: after a final assistant turn, appends the template's closing text (source `template`) so
 * the last segment equals the tokenization of the whole rendered conversation.
 *
 * @category combinators
 * @since 0.1.0
 */
export const finish = Effect.fnUntraced(function*(builder: TrajectoryBuilder) {
  const segments = yield* closeSegment(builder)
  return withChanges(builder, {
    segments,
    awaitingObservation: false,
    rendered: builder.rendered + builder.pending,
    pending: "",
    promptOf: undefined
  })
})

/**
 * Folds the context: closes the open segment (after a folding turn, with the template's closing text, so the turn
 * the policy wrote is trained there) and starts a new one from a render of `context` with the generation prompt,
 * all of it source `prompt` (mask 0: what was kept or summarised is not trained again). `context` is what the
 * template renders from now on (assistant turns as their sampled text); the message view keeps every message.
 *
 * @category combinators
 * @since 0.1.0
 */
export const fold = Effect.fnUntraced(function*(
  builder: TrajectoryBuilder,
  context: ReadonlyArray<Message.Message>,
  kind: string
) {
  const closed = yield* closeSegment(builder)
  const rendered = yield* render(builder, context, true)
  const tokens = tokenizeWithSources(builder.tokenizer, rendered, [], "prompt")
  const spans = withImageSpans(builder, tokens, context, "prompt")
  const entry: Fold = {
    atMessage: builder.messages.length,
    newSegment: closed.length,
    contextMessages: context.length,
    kind
  }
  return withState(builder, {
    messages: builder.messages,
    segments: appended(closed, { spans, messageCount: builder.messages.length }),
    rewrites: builder.rewrites,
    folds: appended(builder.folds, entry),
    awaitingObservation: false,
    renderMessages: context,
    rendered,
    pending: "",
    promptOf: context
  })
})

/**
 * Renders what the template would write for `message` as the next assistant turn, through its end-of-turn token:
 * the text a policy would have sampled. Used to treat recorded conversations as if the policy had produced them.
 *
 * @category combinators
 * @since 0.1.0
 */
export const assistantTurnText = (
  builder: TrajectoryBuilder,
  message: Message.Message
): Effect.Effect<string, BuilderError> =>
  Effect.suspend(() => {
    const fast = turnTextByTail(builder, message)
    return fast !== undefined ? Effect.fromResult(fast) : turnTextByRender(builder, message)
  })

const notAppendOnly = () =>
  builderError(
    "TemplateFailed",
    "the template renders the next assistant turn over a different history (not append-only)"
  )

/** The turn in `full`, the render that extends `prompt` by it, through its end-of-turn token. */
const turnText = (builder: TrajectoryBuilder, prompt: string, full: string): Result.Result<string, BuilderError> => {
  if (!startsWithText(full, prompt)) return Result.fail(notAppendOnly())
  const turn = full.slice(prompt.length)
  const end = turn.indexOf(builder.template.endOfTurn)
  return Result.succeed(end === -1 ? turn : turn.slice(0, end + builder.template.endOfTurn.length))
}

/**
 * `assistantTurnText` by the template's tail renderer, when the text so far is the render of `renderMessages`
 * (after `start` or observations): the whole render would be that text without its generation prompt, then the
 * tail. `undefined` where it cannot tell (no tail renderer, a text so far of unknown render).
 */
const turnTextByTail = (
  builder: TrajectoryBuilder,
  message: Message.Message
): Result.Result<string, BuilderError> | undefined => {
  const tail = builder.template.renderTail
  const rm = builder.renderMessages
  if (tail === undefined || builder.promptOf !== rm || builder.awaitingObservation) return undefined
  const generation = tail(rm, rm.length, true)
  const full = generation === undefined ? undefined : tail(appended(rm, message), rm.length, false)
  return generation === undefined || full === undefined ? undefined : turnText(builder, generation, full)
}

const turnTextByRender = Effect.fnUntraced(function*(builder: TrajectoryBuilder, message: Message.Message) {
  const known = builder.promptOf === builder.renderMessages && !builder.awaitingObservation
  const prompt = known ? builder.rendered : yield* render(builder, builder.renderMessages, true)
  const full = yield* render(builder, appended(builder.renderMessages, message), false)
  return yield* Effect.fromResult(turnText(builder, prompt, full))
})

/**
 * Appends a recorded assistant message as if the policy had sampled it: its turn text (`assistantTurnText`) is
 * tokenized and appended as a `policy` span, and `message` goes to the message view.
 *
 * @category combinators
 * @since 0.1.0
 */
export const appendAssistant = (
  builder: TrajectoryBuilder,
  message: Message.Message,
  options: { readonly policyVersion?: number | undefined } = {}
): Effect.Effect<TrajectoryBuilder, BuilderError> => {
  const append = (text: string) =>
    sampled(builder, { tokenIds: builder.tokenizer.encode(text), message, policyVersion: options.policyVersion })
  return Effect.suspend(() => {
    const fast = turnTextByTail(builder, message)
    return fast !== undefined
      ? Effect.fromResult(Result.flatMap(fast, append))
      : Effect.flatMap(turnTextByRender(builder, message), (text) => Effect.fromResult(append(text)))
  })
}

/**
 * Builds a trajectory from a recorded conversation, treating every assistant message as sampled by the policy
 * (`appendAssistant`): the messages before the first assistant turn are the prompt, runs of other messages are
 * observations. Used by `agentfly tokens` and for SFT data.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromConversation = Effect.fnUntraced(function*(options: StartOptions) {
  const first = options.messages.findIndex((m) => m.role === "assistant")
  const promptEnd = first === -1 ? options.messages.length : first
  let builder = yield* start({ ...options, messages: options.messages.slice(0, promptEnd) })
  let observations: Array<Message.Message> = []
  for (const message of options.messages.slice(promptEnd)) {
    if (message.role !== "assistant") {
      observations.push(message)
      continue
    }
    if (observations.length > 0) builder = yield* appendObservations(builder, observations)
    observations = []
    builder = yield* appendAssistant(builder, message)
  }
  if (observations.length > 0) builder = yield* appendObservations(builder, observations)
  return yield* finish(builder)
})

// ===== Getters =====

/**
 * The ids to send to the sampler for the next assistant turn: the open segment's tokens.
 *
 * @category getters
 * @since 0.1.0
 */
export const promptTokenIds = (builder: TrajectoryBuilder): Array<number> => spanIds(builder.segments.at(-1)!.spans)

/**
 * The spans' ids in one array. `concat` copies each span's ids at once; `flatMap` over spans took ≈ 80 µs for a
 * thousand ids (≈ 1 µs this way), and a chain asks for its prompt before every sample.
 */
const spanIds = (spans: ReadonlyArray<Trajectory.Span>): Array<number> =>
  ([] as Array<number>).concat(...spans.map((span) => span.tokenIds))

/**
 * Number of tokens in the open segment (what counts against the context length).
 *
 * @category getters
 * @since 0.1.0
 */
export const tokenCount = (builder: TrajectoryBuilder): number =>
  builder.segments.at(-1)!.spans.reduce((n, span) => n + span.tokenIds.length, 0)
