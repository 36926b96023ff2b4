/**
 * Chat messages in the OpenAI shape that chat templates render: system, user, assistant (with optional
 * `tool_calls`) and tool (answering one call by `tool_call_id`). Content is text or a list of parts, with room
 * for images. Tool-call arguments are kept as a JSON value (usually an object), which is what the Qwen and
 * Llama templates render with `tojson`.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { ImageRef } from "./Image.ts"

/**
 * A text part of a message.
 *
 * @category models
 * @since 0.1.0
 */
export const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })

/**
 * An image part of a message (a URL or a data URI), as the OpenAI wire writes it. Text-only templates drop it;
 * a rollout refuses it for a model without vision (`MessageImages.resolve`). Once decoded it carries `image`: the
 * content hash, size and media type (`Image.ImageRef`), which a vision template renders as its image tokens.
 *
 * @category models
 * @since 0.1.0
 */
export const ImagePart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({ url: Schema.String }),
  image: Schema.optionalKey(ImageRef)
})
export type ImagePart = typeof ImagePart.Type

/**
 * @category models
 * @since 0.1.0
 */
export const ContentPart = Schema.Union([TextPart, ImagePart])
export type ContentPart = typeof ContentPart.Type

/**
 * @category models
 * @since 0.1.0
 */
export const Content = Schema.Union([Schema.String, Schema.Array(ContentPart)])
export type Content = typeof Content.Type

/**
 * One call of a tool by the assistant, OpenAI-style.
 *
 * @category models
 * @since 0.1.0
 */
export const ToolCall = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Schema.String, arguments: Schema.Unknown })
})
export type ToolCall = typeof ToolCall.Type

/**
 * @category models
 * @since 0.1.0
 */
export const SystemMessage = Schema.Struct({ role: Schema.Literal("system"), content: Content })

/**
 * @category models
 * @since 0.1.0
 */
export const UserMessage = Schema.Struct({ role: Schema.Literal("user"), content: Content })

/**
 * @category models
 * @since 0.1.0
 */
export const AssistantMessage = Schema.Struct({
  role: Schema.Literal("assistant"),
  content: Content,
  tool_calls: Schema.optionalKey(Schema.Array(ToolCall)),
  reasoning_content: Schema.optionalKey(Schema.String)
})

/**
 * @category models
 * @since 0.1.0
 */
export const ToolMessage = Schema.Struct({
  role: Schema.Literal("tool"),
  content: Content,
  tool_call_id: Schema.String,
  name: Schema.optionalKey(Schema.String),
  /** True when the observation reports a failed call (bad arguments, unknown tool, timeout, handler error). */
  is_error: Schema.optionalKey(Schema.Boolean)
})

/**
 * @category models
 * @since 0.1.0
 */
export const Message = Schema.Union([SystemMessage, UserMessage, AssistantMessage, ToolMessage])
export type Message = typeof Message.Type

/**
 * A conversation as a list of messages.
 *
 * @category models
 * @since 0.1.0
 */
export const Conversation = Schema.Array(Message)
export type Conversation = typeof Conversation.Type

/**
 * The plain text of a message's content (image parts are skipped).
 *
 * @category getters
 * @since 0.1.0
 */
export const text = (content: Content): string =>
  typeof content === "string"
    ? content
    : content.map((part) => (part.type === "text" ? part.text : "")).join("")
