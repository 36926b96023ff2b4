/**
 * Agent formats for rollout chains: how a chain turns messages into prompt tokens and sampled tokens back into
 * an assistant message (the `ChainPorts.Format` port).
 *
 * `fromTemplate` is the standard format: a chat template and its tokenizer through `TrajectoryBuilder`
 * (token-in / token-out: sampled ids are appended verbatim; only observation suffixes are tokenized; a template
 * that rewrites history starts a new segment) and a `ToolCallParser` convention (by default the template's own,
 * e.g. `hermes` for Qwen).
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Image from "../src/Image.ts"
import type * as ModelFolder from "../src/ModelFolder.ts"
import * as RolloutError from "../src/RolloutError.ts"
import type * as Tokenizer from "../src/Tokenizer.ts"
import type * as TrainConfig from "../src/TrainConfig.ts"
import * as ToolCallParser from "../src/ToolCallParser.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"

/**
 * Options of `fromTemplate`.
 *
 * @category models
 * @since 0.1.0
 */
export interface TemplateOptions {
  readonly tokenizer: Tokenizer.Tokenizer
  readonly template: ChatTemplate.ChatTemplate
  /** The tool-call convention to parse (default: the template's `toolCallFormat`). */
  readonly toolCallFormat?: ChatTemplate.ToolCallFormat | undefined
  /** Extra template variables, e.g. `{ enable_thinking: false }`. */
  readonly variables?: Readonly<Record<string, unknown>> | undefined
  /** The model's vocabulary size (`Format.vocabSize`). */
  readonly vocabSize?: number | undefined
}

/**
 * A template failure as the chain's error; an image for a model without vision is `SamplerUnusable` (the run
 * aborts, naming the model: no chain of the task can produce data with it), as a backend without token ids is.
 */
const templateFailed = (error: { readonly message: string; readonly reason?: unknown }) =>
  new RolloutError.RolloutError({
    reason: withoutVision(error) ? "SamplerUnusable" : "TemplateFailed",
    message: error.message
  })

const withoutVision = (error: { readonly reason?: unknown }): boolean => {
  const reason = error.reason as { readonly _tag?: string; readonly cause?: unknown } | undefined
  return reason?._tag === "ImageFailed" && reason.cause instanceof Image.ImageError &&
    reason.cause.reason._tag === "ModelWithoutVision"
}

/**
 * The images of the builder's open segment's image spans, in order, decoded from the conversation's image parts
 * (each once: `decoded` keeps them by hash). The builder decoded the same parts when it marked the spans, so a
 * failure here is a defect.
 */
const promptImages = (builder: TrajectoryBuilder.TrajectoryBuilder, decoded: Map<string, Image.Image>) => {
  const wanted = builder.segments.at(-1)!.spans.flatMap((span) => span.image === undefined ? [] : [span.image.sha256])
  if (wanted.length === 0) return Effect.succeed([])
  return Effect.gen(function*() {
    for (const message of [...builder.messages, ...builder.renderMessages]) {
      if (typeof message.content === "string") continue
      for (const part of message.content) {
        if (part.type !== "image_url" || (part.image !== undefined && decoded.has(part.image.sha256))) continue
        const image = yield* Image.fromUrl(part.image_url.url)
        decoded.set(image.ref.sha256, image)
      }
    }
    const missing = wanted.find((sha) => !decoded.has(sha))
    if (missing !== undefined) return yield* Effect.die(`no image part of the conversation has the hash ${missing}`)
    return wanted.map((sha) => decoded.get(sha)!)
  }).pipe(Effect.orDie)
}

/**
 * The format of a chat template and tokenizer. Every request stops on the template's end-of-turn tokens; a
 * sample that ends with one is a complete turn. Tool-call ids are `call_<turn>_<i>`, unique within a chain.
 *
 * **Gotchas**
 *
 * Stop tokens the tokenizer does not know are ignored; a template whose end-of-turn token is not a single token
 * of the tokenizer yields turns that never count as complete (they end with `stop`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromTemplate = (options: TemplateOptions): ChainPorts.Format => {
  const { template, tokenizer } = options
  const stopTokenIds = template.stopTokens.flatMap((token) => {
    const id = tokenizer.tokenToId(token)
    return id === undefined ? [] : [id]
  })
  const stops = new Set(stopTokenIds)
  const parseFormat = options.toolCallFormat ?? template.toolCallFormat
  // Every image of the chain decoded once, by content hash (a fork shares them).
  const decoded = new Map<string, Image.Image>()
  /** A transcript over `initial`; the builder is immutable, so a fork is a second transcript over the same one. */
  const transcriptOf = (initial: TrajectoryBuilder.TrajectoryBuilder, turnsSoFar: number): ChainPorts.Transcript => {
    let builder = initial
    let turns = turnsSoFar
    return {
      length: () => builder.segments.at(-1)!.spans.reduce((n, span) => n + span.tokenIds.length, 0),
      promptTokenIds: () => TrajectoryBuilder.promptTokenIds(builder),
      promptImages: () => promptImages(builder, decoded),
      appendSampled: (result) =>
        Effect.gen(function*() {
          const ids = result.tokenIds
          const complete = ids.length > 0 && stops.has(ids[ids.length - 1]!)
          const text = tokenizer.decode(complete ? ids.slice(0, -1) : ids)
          const parsed = ToolCallParser.parse(parseFormat, text, { idPrefix: `call_${turns}_` })
          const message = ToolCallParser.toAssistantMessage(parsed)
          builder = yield* TrajectoryBuilder.appendSampled(builder, {
            tokenIds: ids,
            logprobs: result.logprobs,
            policyVersion: result.policyVersion,
            message
          }).pipe(Effect.mapError(templateFailed))
          turns++
          return {
            message: message as ChainPorts.AssistantTurn["message"],
            toolCalls: parsed.toolCalls,
            parseErrors: parsed.errors.map((e) => e.message),
            complete
          }
        }),
      appendAssistant: (message) =>
        Effect.gen(function*() {
          builder = yield* TrajectoryBuilder.appendAssistant(builder, message).pipe(Effect.mapError(templateFailed))
          turns++
          return { message, toolCalls: message.tool_calls ?? [], parseErrors: [], complete: true }
        }),
      appendObservations: (observations) =>
        Effect.map(
          Effect.mapError(TrajectoryBuilder.appendObservations(builder, observations), templateFailed),
          (next) => {
            builder = next
          }
        ),
      messages: () => builder.messages,
      segments: () => builder.segments,
      context: () => builder.renderMessages,
      fold: (context, kind) =>
        Effect.map(Effect.mapError(TrajectoryBuilder.fold(builder, context, kind), templateFailed), (next) => {
          builder = next
        }),
      fork: () => transcriptOf(builder, turns)
    }
  }
  return {
    stopTokenIds,
    vocabSize: options.vocabSize,
    start: (messages, tools) =>
      Effect.map(
        TrajectoryBuilder.start({
          tokenizer,
          template,
          messages,
          tools: tools as ReadonlyArray<ChatTemplate.ToolSpec>,
          ...(options.variables === undefined ? {} : { variables: options.variables })
        }).pipe(Effect.mapError(templateFailed)),
        (builder) => transcriptOf(builder, 0)
      )
  }
}

/**
 * The format of a run's config on a model folder: the template it names (`agent.template`; `"model"` is the folder's
 * own) over the folder's tokenizer, and its tool-call parser (`agent.parser`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const ofConfig = (config: TrainConfig.TrainConfig, folder: ModelFolder.ModelFolder): ChainPorts.Format =>
  fromTemplate({
    tokenizer: folder.tokenizer,
    template: config.agent.template === "model"
      ? folder.template
      : ChatTemplate.builtinTemplate(config.agent.template as ChatTemplate.BuiltinName),
    toolCallFormat: config.agent.parser as ChatTemplate.ToolCallFormat,
    vocabSize: folder.config.vocabSize
  })
