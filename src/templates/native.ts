/**
 * Native renderers of built-in templates: plain TypeScript that writes, character for character, what the Jinja
 * source of `qwen2.5` and `chatml` (`builtin.ts`) renders, without the Jinja interpreter. A rollout renders the
 * whole conversation after every turn (`TrajectoryBuilder` checks that the render extends the tokens so far); with
 * `@huggingface/jinja` that render costs about a millisecond for a short episode and grows with its length, the
 * largest cost of an environment step for fast text environments.
 *
 * `ChatTemplate.make` uses a native renderer only for a source equal to the built-in one (so a model folder whose
 * `chat_template` is the built-in Qwen2.5 template gets it too). A renderer answers `undefined` for an input it does
 * not handle exactly as Jinja does (a tool call without a string name, a value `tojson` cannot write), and the Jinja
 * template renders it instead. `test/src/ChatTemplate.test.ts` checks both against Jinja on random conversations.
 *
 * @since 0.1.0
 */
import * as builtin from "./builtin.ts"

/**
 * What a native renderer reads: messages as templates see them (`ChatTemplate.toTemplateMessage`), the tool specs
 * (`null` for none) and `add_generation_prompt`.
 *
 * @category models
 * @since 0.1.0
 */
export type Renderer = (
  messages: ReadonlyArray<Readonly<Record<string, unknown>>>,
  tools: ReadonlyArray<unknown> | null,
  addGenerationPrompt: boolean
) => string | undefined

/** Thrown inside a renderer for an input it does not handle; the renderer then answers `undefined`. */
const unsupported = Symbol("unsupported")

/**
 * `@huggingface/jinja`'s `tojson` without options: `", "` between items, `": "` after keys, undefined as `null`
 * (also as an object's value, where `JSON.stringify` would drop the key), numbers, strings and booleans as
 * `JSON.stringify` writes them.
 */
const toJson = (value: unknown): string => {
  switch (typeof value) {
    case "undefined":
      return "null"
    case "number":
    case "boolean":
    case "string":
      return JSON.stringify(value)
    case "object": {
      if (value === null) return "null"
      if (Array.isArray(value)) return `[${value.map(toJson).join(", ")}]`
      return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${toJson(v)}`).join(", ")}}`
    }
    default:
      throw unsupported
  }
}

const text = (value: unknown): string => {
  if (typeof value !== "string") throw unsupported
  return value
}

/** Jinja truthiness of the values these templates test (`if message.content`, `if message.tool_calls`). */
const truthy = (value: unknown): boolean =>
  Array.isArray(value) ? value.length > 0 : typeof value === "string" ? value.length > 0 : Boolean(value)

/** One Hermes `<tool_call>` block as both templates write it. */
const toolCall = (raw: unknown): string => {
  if (typeof raw !== "object" || raw === null) throw unsupported
  const call = (raw as Record<string, unknown>)["function"] === undefined
    ? (raw as Record<string, unknown>)
    : (raw as Record<string, unknown>)["function"]
  if (typeof call !== "object" || call === null) throw unsupported
  const { arguments: args, name } = call as Record<string, unknown>
  return `\n<tool_call>\n{"name": "${text(name)}", "arguments": ${toJson(args)}}\n</tool_call>`
}

/**
 * The message loop both templates share: tool results merged into user turns, assistant tool calls in Hermes.
 * From message `from` on (a system message first is the head's, whatever `from`).
 */
const turns = (messages: ReadonlyArray<Readonly<Record<string, unknown>>>, out: Array<string>, from = 0): void => {
  for (let i = from; i < messages.length; i++) {
    const message = messages[i]!
    const role = text(message["role"])
    if (role === "tool") {
      if (i === 0 || messages[i - 1]!["role"] !== "tool") out.push("<|im_start|>user")
      out.push("\n<tool_response>\n", text(message["content"]), "\n</tool_response>")
      if (i === messages.length - 1 || messages[i + 1]!["role"] !== "tool") out.push("<|im_end|>\n")
    } else if (role === "assistant" && truthy(message["tool_calls"])) {
      const calls = message["tool_calls"]
      if (!Array.isArray(calls)) throw unsupported
      out.push("<|im_start|>assistant")
      if (truthy(message["content"])) out.push("\n", text(message["content"]))
      for (const call of calls) out.push(toolCall(call))
      out.push("<|im_end|>\n")
    } else if (!(role === "system" && i === 0)) {
      out.push("<|im_start|>", role, "\n", text(message["content"]), "<|im_end|>\n")
    }
  }
}

/** The turns after the system part, and the generation prompt, joined into one flat string (one copy, no rope). */
const finish = (
  messages: ReadonlyArray<Readonly<Record<string, unknown>>>,
  out: Array<string>,
  addGenerationPrompt: boolean
): string => {
  turns(messages, out)
  if (addGenerationPrompt) out.push("<|im_start|>assistant\n")
  return out.join("")
}

const guarded = (render: Renderer): Renderer => (messages, tools, addGenerationPrompt) => {
  try {
    return render(messages, tools, addGenerationPrompt)
  } catch (e) {
    if (e === unsupported) return undefined
    throw e
  }
}

const hasSystem = (messages: ReadonlyArray<Readonly<Record<string, unknown>>>) =>
  messages.length > 0 && messages[0]!["role"] === "system"

// A rollout renders the same tool list (a read-only value) every turn: its JSON is written once per list.
const toolLists = new WeakMap<ReadonlyArray<unknown>, string>()

const toolList = (tools: ReadonlyArray<unknown>): string => {
  const cached = toolLists.get(tools)
  if (cached !== undefined) return cached
  const text = tools.map((tool) => "\n" + toJson(tool)).join("")
  toolLists.set(tools, text)
  return text
}

/**
 * `builtin.qwen25` (Qwen2.5-Instruct), natively.
 *
 * @category constructors
 * @since 0.1.0
 */
export const qwen25: Renderer = guarded((messages, tools, addGenerationPrompt) => {
  const system = hasSystem(messages)
    ? text(messages[0]!["content"])
    : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
  const out = ["<|im_start|>system\n", system]
  if (tools !== null && tools.length > 0) {
    out.push("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" + toolList(tools) +
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within " +
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": " +
      "<args-json-object>}\n</tool_call>")
  }
  out.push("<|im_end|>\n")
  return finish(messages, out, addGenerationPrompt)
})

/**
 * `builtin.chatml` (ChatML for small byte-level models), natively.
 *
 * @category constructors
 * @since 0.1.0
 */
export const chatml: Renderer = guarded((messages, tools, addGenerationPrompt) => {
  const system = hasSystem(messages)
  const withTools = tools !== null && tools.length > 0
  const out: Array<string> = []
  if (system || withTools) {
    out.push("<|im_start|>system\n")
    if (system) out.push(text(messages[0]!["content"]))
    if (withTools) {
      if (system) out.push("\n\n")
      out.push(
        "# Tools\n<tools>" + toolList(tools) + "\n</tools>\nCall a tool with <tool_call>\n{\"name\": " +
          "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
      )
    }
    out.push("<|im_end|>\n")
  }
  return finish(messages, out, addGenerationPrompt)
})

/**
 * What a native template writes for `messages` from message `from` on, after the render of `messages.slice(0,
 * from)` without the generation prompt: `render(messages, tools, g) === render(messages.slice(0, from), tools,
 * false) + tail(messages, from, g)`. Both templates here write each turn from its message and its neighbours'
 * roles alone, so a rollout renders only the new messages of a turn. `undefined` where that equation would not
 * hold: `from` 0 (the head depends on the first message) and a tool message after a tool message (the earlier one
 * would lose its `<|im_end|>`), or an input the renderer does not handle.
 *
 * @category models
 * @since 0.1.0
 */
export type TailRenderer = (
  messages: ReadonlyArray<Readonly<Record<string, unknown>>>,
  from: number,
  addGenerationPrompt: boolean
) => string | undefined

/** The tail renderer of the `turns` loop shared by `qwen25` and `chatml`. */
const turnsTail: TailRenderer = (messages, from, addGenerationPrompt) => {
  if (from < 1 || from > messages.length) return undefined
  // No new message: only the generation prompt (asked for twice a rollout turn).
  if (from === messages.length) return addGenerationPrompt ? "<|im_start|>assistant\n" : ""
  if (from < messages.length && messages[from]!["role"] === "tool" && messages[from - 1]!["role"] === "tool") {
    return undefined
  }
  try {
    const out: Array<string> = []
    turns(messages, out, from)
    if (addGenerationPrompt) out.push("<|im_start|>assistant\n")
    return out.join("")
  } catch (e) {
    if (e === unsupported) return undefined
    throw e
  }
}

/**
 * The tail renderers by template source (see {@link TailRenderer}).
 *
 * @category constants
 * @since 0.1.0
 */
export const tailsBySource: ReadonlyMap<string, TailRenderer> = new Map([
  [builtin.qwen25, turnsTail],
  [builtin.chatml, turnsTail]
])

/**
 * The native renderers by template source: a source equal to a built-in one renders natively.
 *
 * @category constants
 * @since 0.1.0
 */
export const bySource: ReadonlyMap<string, Renderer> = new Map([[builtin.qwen25, qwen25], [builtin.chatml, chatml]])
