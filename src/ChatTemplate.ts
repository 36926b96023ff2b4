/**
 * Chat templates: Jinja programs (the Hugging Face `chat_template` language, run by `@huggingface/jinja`) that turn
 * a conversation into the exact text a model was trained on.
 *
 * A `ChatTemplate` comes from a model folder (`tokenizer_config.json`'s `chat_template`, or `chat_template.jinja`)
 * or from the built-ins: `qwen2.5`, `qwen3` (Hermes-style `<tool_call>` JSON), `llama3` (JSON tool calls) and
 * `chatml` (for small byte-level models). Rendering supports tools (OpenAI-style JSON Schema function specs),
 * assistant tool calls, tool results and `add_generation_prompt`. Each template also says which tool-call
 * convention its models write (`toolCallFormat`, see `ToolCallParser`) and which token ends an assistant turn.
 *
 * Message contents are flattened to text before rendering: every template we target concatenates
 * `message.content` as a string. A template without `vision` drops image parts; a template with `vision` (a model
 * with a vision tower, `withVision`) writes each decoded image part (one carrying `image`, see
 * `MessageImages.resolve`) as Qwen2-VL does: `<|vision_start|>`, one `<|image_pad|>` per merged patch
 * (`Image.visionTokenCount`), `<|vision_end|>`.
 *
 * @since 0.1.0
 */
import { Template } from "@huggingface/jinja"
import { Effect, FileSystem, Option, Path, Schema } from "effect"
import * as Image from "./Image.ts"
import * as Message from "./Message.ts"
import * as builtin from "./templates/builtin.ts"
import * as native from "./templates/native.ts"
import * as Tokenizer from "./Tokenizer.ts"

// ===== Errors =====

/**
 * The model folder has no chat template.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The Jinja source does not parse.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidSyntax extends Schema.TaggedError<InvalidSyntax>()("InvalidSyntax", { message: Schema.String }) {}

/**
 * The template raised (e.g. `raise_exception`) or hit a runtime error on these messages.
 *
 * @category errors
 * @since 0.1.0
 */
export class RenderFailed extends Schema.TaggedError<RenderFailed>()("RenderFailed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The conversation does not decode as OpenAI-style messages.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidMessages extends Schema.TaggedError<InvalidMessages>()("InvalidMessages", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * Why a template could not be loaded or rendered.
 *
 * @category errors
 * @since 0.1.0
 */
export const TemplateErrorReason = Schema.Union([NotFound, InvalidSyntax, RenderFailed, InvalidMessages])
export type TemplateErrorReason = typeof TemplateErrorReason.Type

/**
 * A template could not be loaded or rendered. `message` is the reason's. Handle reasons with
 * `Effect.catchReason("TemplateError", "NotFound", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class TemplateError extends Schema.TaggedError<TemplateError>()("TemplateError", {
  reason: TemplateErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `templateError`; a reason left out is a compile error. */
const reasons = { NotFound, InvalidSyntax, RenderFailed, InvalidMessages } satisfies Record<
  TemplateErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message.
 *
 * @category errors
 * @since 0.1.0
 */
export type TemplateErrorFacts<Tag extends TemplateErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `TemplateError` of the reason tagged `tag`: `templateError("RenderFailed", text, { cause })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const templateError = <Tag extends TemplateErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: TemplateErrorFacts<Tag>
): TemplateError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => TemplateErrorReason
  return new TemplateError({ reason: new Reason({ ...facts, message }) })
}

// ===== Models =====

/**
 * An OpenAI-style tool spec as templates render it: `{ type: "function", function: { name, description?,
 * parameters? } }`, `parameters` being a JSON Schema.
 *
 * @category models
 * @since 0.1.0
 */
export const ToolSpec = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: Schema.String,
    description: Schema.optionalKey(Schema.String),
    parameters: Schema.optionalKey(Schema.Unknown)
  })
})
export type ToolSpec = typeof ToolSpec.Type

/**
 * The tool-call conventions of the built-in parsers (`ToolCallParser.parse`).
 *
 * @category models
 * @since 0.1.0
 */
export const ToolCallFormat = Schema.Literals(["hermes", "llama3", "react", "code"])
export type ToolCallFormat = typeof ToolCallFormat.Type

/**
 * Names of the built-in templates.
 *
 * @category models
 * @since 0.1.0
 */
export type BuiltinName = "qwen2.5" | "qwen3" | "llama3" | "chatml"

/**
 * Options of one render.
 *
 * @category models
 * @since 0.1.0
 */
export interface RenderOptions {
  readonly tools?: ReadonlyArray<ToolSpec> | undefined
  /** Append the header of the next assistant turn (`<|im_start|>assistant\n`). Default false. */
  readonly addGenerationPrompt?: boolean | undefined
  /** Extra template variables, e.g. `{ enable_thinking: false }`; they override the template's defaults. */
  readonly variables?: Readonly<Record<string, unknown>> | undefined
}

const TypeId = "~agentfly/ChatTemplate"

/**
 * A compiled chat template.
 *
 * - `endOfTurn`: the token the template writes after an assistant turn (`<|im_end|>`, `<|eot_id|>`). The policy
 *   samples it, so it is trainable.
 * - `stopTokens`: tokens a sampler should stop on (`endOfTurn` plus the model's end-of-text tokens).
 * - `render` fails with `TemplateError` (never throws).
 *
 * @category models
 * @since 0.1.0
 */
export interface ChatTemplate {
  readonly [TypeId]: typeof TypeId
  /** Present for a model with a vision tower: how image parts are written (absent: they are dropped). */
  readonly vision?: Vision | undefined
  readonly name: string
  readonly source: string
  readonly toolCallFormat: ToolCallFormat
  readonly endOfTurn: string
  readonly stopTokens: ReadonlyArray<string>
  /** Variables every render gets (`bos_token`, `eos_token`, ...). */
  readonly variables: Readonly<Record<string, unknown>>
  readonly render: (
    messages: ReadonlyArray<Message.Message>,
    options?: RenderOptions
  ) => Effect.Effect<string, TemplateError>
  /**
   * What `render(messages, { tools, addGenerationPrompt })` writes after `render(messages.slice(0, from), { tools })`
   * (no generation prompt), where the template guarantees the first is the second followed by it; `undefined`
   * where it cannot say. Present for the built-in `qwen2.5` and `chatml` sources, whose turns each depend on their
   * own message alone: a rollout then renders only a turn's new messages instead of the whole conversation.
   */
  readonly renderTail?:
    | ((messages: ReadonlyArray<Message.Message>, from: number, addGenerationPrompt: boolean) => string | undefined)
    | undefined
}

/**
 * How a vision model's template writes an image: `start`, then `pad` once per merged patch of the image resized by
 * `geometry` (`Image.visionTokenCount`), then `end`. The three are single tokens of the model's tokenizer.
 *
 * @category models
 * @since 0.1.0
 */
export interface Vision {
  readonly start: string
  readonly pad: string
  readonly end: string
  readonly geometry: Image.VisionGeometry
}

/**
 * Qwen2-VL's and Qwen2.5-VL's image tokens (also the embedded byte-level vision presets',
 * `ByteTokenizer.visionSpecialTokens`).
 *
 * @category constants
 * @since 0.1.0
 */
export const qwenVisionTokens = { start: "<|vision_start|>", pad: "<|image_pad|>", end: "<|vision_end|>" } as const

// ===== Constructors =====

/**
 * The built-in template sources, by name (`qwen2.5` is `templates["qwen2.5"]`).
 *
 * @category constants
 * @since 0.1.0
 */
export const templates: { readonly [K in BuiltinName]: string } = {
  "qwen2.5": builtin.qwen25,
  qwen3: builtin.qwen3,
  llama3: builtin.llama3,
  chatml: builtin.chatml
}

const builtinDefaults: {
  readonly [K in BuiltinName]: Pick<MakeOptions, "toolCallFormat" | "endOfTurn" | "stopTokens" | "variables">
} = {
  "qwen2.5": { toolCallFormat: "hermes", endOfTurn: "<|im_end|>", stopTokens: ["<|im_end|>", "<|endoftext|>"] },
  qwen3: { toolCallFormat: "hermes", endOfTurn: "<|im_end|>", stopTokens: ["<|im_end|>", "<|endoftext|>"] },
  chatml: { toolCallFormat: "hermes", endOfTurn: "<|im_end|>", stopTokens: ["<|im_end|>", "<|endoftext|>"] },
  llama3: {
    toolCallFormat: "llama3",
    endOfTurn: "<|eot_id|>",
    stopTokens: ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
    variables: { bos_token: "<|begin_of_text|>" }
  }
}

/**
 * Options of `make`. Everything but `source` is inferred from the source when omitted.
 *
 * @category models
 * @since 0.1.0
 */
export interface MakeOptions {
  readonly source: string
  readonly name?: string | undefined
  readonly toolCallFormat?: ToolCallFormat | undefined
  readonly endOfTurn?: string | undefined
  readonly stopTokens?: ReadonlyArray<string> | undefined
  readonly variables?: Readonly<Record<string, unknown>> | undefined
  readonly vision?: Vision | undefined
}

const knownEndOfTurn = ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>"]

/**
 * The tool-call convention a template's models write, read from the source: Qwen's templates (Qwen2.5, Qwen3) wrap
 * calls in `<tool_call>` (Hermes); Llama 3.x's render tool results as `ipython` turns and ask for a bare JSON
 * object `{"name": …, "parameters": …}` (Llama 3.1 adds `<|python_tag|>`); anything else defaults to Hermes.
 */
const inferFormat = (source: string): ToolCallFormat => {
  if (source.includes("<tool_call>")) return "hermes"
  const llama = source.includes("ipython") || source.includes("<|python_tag|>") ||
    (source.includes("<|eot_id|>") && source.includes("\"parameters\""))
  return llama ? "llama3" : "hermes"
}

const compile = Option.liftThrowable((source: string) => new Template(source))

/**
 * The text a content renders as: its text parts, and with `vision` each decoded image part as the image's tokens
 * (an image part not decoded, or any image part without `vision`, writes nothing).
 *
 * @category converting
 * @since 0.1.0
 */
export const contentText = (content: Message.Content, vision?: Vision): string => {
  if (vision === undefined || typeof content === "string") return Message.text(content)
  let out = ""
  for (const part of content) {
    if (part.type === "text") out += part.text
    else if (part.image !== undefined) out += imageText(part.image, vision)
  }
  return out
}

/**
 * An image's tokens as text: `start`, `pad` × `Image.visionTokenCount`, `end`.
 *
 * @category converting
 * @since 0.1.0
 */
export const imageText = (image: Image.ImageRef, vision: Vision): string =>
  vision.start + vision.pad.repeat(Image.visionTokenCount(image.width, image.height, vision.geometry)) + vision.end

/** The first image part of the messages that a vision template cannot write (not decoded), as `[message, part]`. */
const undecodedImage = (messages: ReadonlyArray<Message.Message>): [number, number] | undefined => {
  for (let m = 0; m < messages.length; m++) {
    const content = messages[m]!.content
    if (typeof content === "string") continue
    const p = content.findIndex((part) => part.type === "image_url" && part.image === undefined)
    if (p >= 0) return [m, p]
  }
  return undefined
}

/**
 * A message as templates see it: a plain object with the content flattened to text (image parts dropped).
 *
 * @category converting
 * @since 0.1.0
 */
export const toTemplateMessage = (message: Message.Message): Record<string, unknown> => templateMessage(message)

/**
 * A message as a vision template sees it: its decoded image parts written as their image tokens (`contentText`).
 *
 * @category converting
 * @since 0.1.0
 */
export const toVisionTemplateMessage = (message: Message.Message, vision: Vision): Record<string, unknown> =>
  templateMessage(message, vision)

const templateMessage = (message: Message.Message, vision?: Vision): Record<string, unknown> => {
  const content = contentText(message.content, vision)
  switch (message.role) {
    case "assistant":
      return {
        role: "assistant",
        content,
        ...(message.tool_calls !== undefined && message.tool_calls.length > 0
          ? { tool_calls: message.tool_calls }
          : {}),
        ...(message.reasoning_content !== undefined ? { reasoning_content: message.reasoning_content } : {})
      }
    case "tool":
      return {
        role: "tool",
        content,
        tool_call_id: message.tool_call_id,
        ...(message.name !== undefined ? { name: message.name } : {})
      }
    default:
      return { role: message.role, content }
  }
}

/**
 * Whether the messages from `from` on have text contents. The native turns read `role`, `content` and `tool_calls`
 * alone, which such a message holds as `toTemplateMessage` writes them (an empty `tool_calls` is falsy either way),
 * so a rollout's tail renders read its messages as they are, without a template copy of each.
 */
const textOnly = (messages: ReadonlyArray<Message.Message>, from: number): boolean => {
  for (let i = from; i < messages.length; i++) if (typeof messages[i]!.content !== "string") return false
  return true
}

/**
 * Compiles a template. Fails with `InvalidSyntax` when the Jinja source does not parse.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: MakeOptions): Effect.Effect<ChatTemplate, TemplateError> => {
  const compiled = compile(options.source)
  if (Option.isNone(compiled)) {
    return Effect.fail(templateError("InvalidSyntax", "the chat template does not parse"))
  }
  const template = compiled.value
  const endOfTurn = options.endOfTurn ?? knownEndOfTurn.find((t) => options.source.includes(t)) ?? "<|im_end|>"
  const variables = { bos_token: "", eos_token: endOfTurn, ...options.variables }
  const name = options.name ?? "custom"
  const nativeRender = native.bySource.get(options.source)
  const nativeTail = native.tailsBySource.get(options.source)
  const vision = options.vision
  const toTemplate = vision === undefined
    ? toTemplateMessage
    : (m: Message.Message) => toVisionTemplateMessage(m, vision)
  return Effect.succeed({
    [TypeId]: TypeId,
    ...(vision === undefined ? {} : { vision }),
    name,
    source: options.source,
    toolCallFormat: options.toolCallFormat ?? inferFormat(options.source),
    endOfTurn,
    stopTokens: options.stopTokens ?? [endOfTurn],
    variables,
    render: (messages, renderOptions = {}) => {
      const undecoded = vision === undefined ? undefined : undecodedImage(messages)
      if (undecoded !== undefined) {
        const at = `messages[${undecoded[0]}].content[${undecoded[1]}]`
        return Effect.fail(templateError("RenderFailed", `template ${name}: the image part ${at} is not decoded`))
      }
      const templateMessages = messages.map(toTemplate)
      const tools = renderOptions.tools && renderOptions.tools.length > 0 ? renderOptions.tools : null
      const addGenerationPrompt = renderOptions.addGenerationPrompt ?? false
      // A built-in source renders natively (the same text, without the interpreter); Jinja renders the rest.
      const fast = nativeRender?.(templateMessages, tools, addGenerationPrompt)
      if (fast !== undefined) return Effect.succeed(fast)
      return Effect.try({
        try: () =>
          template.render({
            ...variables,
            ...renderOptions.variables,
            messages: templateMessages,
            tools,
            add_generation_prompt: addGenerationPrompt
          }),
        catch: (cause) =>
          templateError(
            "RenderFailed",
            `template ${name}: ${cause instanceof Error ? cause.message : String(cause)}`,
            { cause }
          )
      })
    },
    // Only the turn before `from` and the new messages are read (a tool turn's neighbour decides its closing).
    ...(nativeTail === undefined ? {} : {
      renderTail: (messages: ReadonlyArray<Message.Message>, from: number, addGenerationPrompt: boolean) =>
        from < 1 || from > messages.length
          ? undefined
          : textOnly(messages, from - 1)
          ? nativeTail(messages as ReadonlyArray<Readonly<Record<string, unknown>>>, from, addGenerationPrompt)
          : vision !== undefined && undecodedImage(messages.slice(from - 1)) !== undefined
          ? undefined
          : nativeTail(messages.slice(from - 1).map(toTemplate), 1, addGenerationPrompt)
    })
  })
}

/**
 * The same template for a model with a vision tower: image parts are written as `vision` says.
 *
 * @category constructors
 * @since 0.1.0
 */
export const withVision = (template: ChatTemplate, vision: Vision): ChatTemplate =>
  Effect.runSync(make({
    name: template.name,
    source: template.source,
    toolCallFormat: template.toolCallFormat,
    endOfTurn: template.endOfTurn,
    stopTokens: template.stopTokens,
    variables: template.variables,
    vision
  }))

/**
 * A built-in template.
 *
 * @category constructors
 * @since 0.1.0
 */
export const builtinTemplate = (name: BuiltinName): ChatTemplate =>
  Effect.runSync(make({ name, source: templates[name], ...builtinDefaults[name] }))

/**
 * Loads the chat template of a Hugging Face style model folder: `chat_template.jinja` if present, else
 * `tokenizer_config.json`'s `chat_template` (a string, or a list of `{ name, template }` of which `default` or the
 * first is used). `bos_token` / `eos_token` come from `tokenizer_config.json`; the end-of-turn token is inferred
 * from the source.
 *
 * @category constructors
 * @since 0.1.0
 */
export const load = Effect.fn("ChatTemplate.load")(function*(modelDir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const configFile = path.join(modelDir, "tokenizer_config.json")
  const hasConfig = yield* fs.exists(configFile).pipe(Effect.orElseSucceed(() => false))
  const config = (hasConfig
    ? yield* Tokenizer.readJsonFile(configFile).pipe(
      Effect.mapError((e) => templateError("NotFound", e.message, { cause: e }))
    )
    : {}) as Record<string, unknown>
  const jinjaFile = path.join(modelDir, "chat_template.jinja")
  const hasJinja = yield* fs.exists(jinjaFile).pipe(Effect.orElseSucceed(() => false))
  const source = hasJinja
    ? yield* fs.readFileString(jinjaFile).pipe(
      Effect.mapError((e) => templateError("NotFound", `cannot read ${jinjaFile}`, { cause: e }))
    )
    : pickTemplate(config.chat_template)
  if (source === undefined) {
    const message = `${modelDir} has no chat_template.jinja and no chat_template in tokenizer_config.json`
    return yield* templateError("NotFound", message)
  }
  const token = (value: unknown) =>
    typeof value === "string" ? value : (value as { content?: string } | null)?.content ?? undefined
  const bos = token(config.bos_token)
  const eos = token(config.eos_token)
  const endOfTurn = knownEndOfTurn.find((t) => source.includes(t)) ?? eos ?? "<|im_end|>"
  const stopTokens = eos !== undefined && eos !== endOfTurn ? [endOfTurn, eos] : [endOfTurn]
  return yield* make({
    name: path.basename(modelDir),
    source,
    endOfTurn,
    stopTokens,
    variables: { bos_token: bos ?? "", eos_token: eos ?? endOfTurn }
  })
})

const pickTemplate = (value: unknown): string | undefined => {
  if (typeof value === "string") return value
  if (Array.isArray(value)) {
    const named = value as Array<{ name?: unknown; template?: unknown }>
    const chosen = named.find((t) => t.name === "default") ?? named[0]
    return typeof chosen?.template === "string" ? chosen.template : undefined
  }
  return undefined
}

/**
 * Decodes an OpenAI-style conversation file: `{ messages, tools? }` or a bare list of messages.
 *
 * @category constructors
 * @since 0.1.0
 */
export const decodeConversation = (
  input: unknown
): Effect.Effect<{ messages: Message.Conversation; tools: ReadonlyArray<ToolSpec> }, TemplateError> => {
  const shape = Array.isArray(input) ? { messages: input } : input
  return Schema.decodeUnknownEffect(ConversationFile)(lenient(shape)).pipe(
    Effect.map((file) => ({ messages: file.messages, tools: file.tools ?? [] })),
    Effect.mapError((error) => templateError("InvalidMessages", error.message, { cause: error }))
  )
}

// OpenAI's API writes `content: null` beside tool calls and files often omit call ids: accept both.
const lenient = (input: unknown): unknown => {
  if (typeof input !== "object" || input === null || !Array.isArray((input as { messages?: unknown }).messages)) {
    return input
  }
  const file = input as { messages: Array<unknown> }
  return {
    ...file,
    messages: file.messages.map((m, i) => {
      if (typeof m !== "object" || m === null) return m
      const message = m as Record<string, unknown>
      const calls = message.tool_calls
      return {
        ...message,
        ...(message.content === null ? { content: "" } : {}),
        ...(Array.isArray(calls)
          ? {
            tool_calls: calls.map((c, j) =>
              typeof c === "object" && c !== null ? { id: `call_${i}_${j}`, type: "function", ...c } : c
            )
          }
          : {})
      }
    })
  }
}

const ConversationFile = Schema.Struct({
  messages: Message.Conversation,
  tools: Schema.optionalKey(Schema.Array(ToolSpec))
})
