/**
 * The shop's oracle: a plain policy that shops as a careful person would, reading only the conversation (the
 * instruction and the pages the tools returned), through the task's own tools. It proves each instruction
 * solvable within the step and context budgets and the reward right; its trajectories are the SFT
 * demonstrations.
 *
 * 1. Read the instruction: the wanted words (attributes and type), the option phrases and the price bound.
 * 2. `search` the wanted words and the option phrases.
 * 3. On a results page, `click` the first result (in the search's order) not opened yet whose price is within
 *    the bound; `next` when the page has none.
 * 4. On an item page, check it (every wanted word in its title or attributes, every option offered, the price);
 *    `back` if it fails, else `select` each option, then `buy`.
 *
 * With `detour` > 0, that share of visits (chosen by a hash of the instruction, so runs are reproducible) first
 * opens a result that fails the check, and goes back: demonstrations of recovering from a wrong click.
 *
 * @since 0.1.0
 */
import * as Oracle from "../../actors/Oracle.ts"
import type * as ChainPorts from "../../src/ChainPorts.ts"
import type { Conversation, Message } from "../../src/Message.ts"
import * as Sampling from "../../src/Sampling.ts"
import type * as Catalog from "./Catalog.ts"
import * as Shop from "./Shop.ts"

// ===== Reading =====

/**
 * An instruction read back: the wanted words, the option phrases ("size m", "6 pack") and the price bound.
 *
 * @category models
 * @since 0.1.0
 */
export interface Wish {
  readonly head: string
  readonly options: ReadonlyArray<string>
  readonly price: number
}

/**
 * Reads an instruction of `Goal.instruction`'s shape, or undefined.
 *
 * @category getters
 * @since 0.1.0
 */
export const readInstruction = (text: string): Wish | undefined => {
  const m = /^i want (?:an? )?(.+), under (\d+(?:\.\d+)?) dollars$/.exec(text.trim())
  if (m === null) return undefined
  const [head, ...options] = m[1]!.split(", ")
  return { head: head!, options, price: Number(m[2]) }
}

const words = (text: string): Array<string> => text.toLowerCase().split(/[^a-z0-9]+/).filter((w) => w !== "")

interface Result {
  readonly id: string
  readonly title: string
  readonly price: number
}

/** The results of a results page, or undefined for any other text. */
const readResults = (text: string): { readonly results: Array<Result>; readonly next: boolean } | undefined => {
  if (!text.startsWith("page ")) return undefined
  const results = [...text.matchAll(/^\[([A-Z0-9]+)\] (.*) \$(\d+\.\d\d)$/gm)].map((m) => ({
    id: m[1]!,
    title: m[2]!,
    price: Number(m[3])
  }))
  return { results, next: /\[next\]/.test(text) }
}

interface Item {
  readonly id: string
  readonly text: string
  readonly price: number
  readonly options: ReadonlyArray<readonly [string, ReadonlyArray<string>]>
}

/** The item of an item page, or undefined for any other text. */
const readItem = (text: string): Item | undefined => {
  const lines = text.split("\n")
  const head = /^\[([A-Z0-9]+)\] (.*) \$(\d+\.\d\d)$/.exec(lines[0] ?? "")
  if (head === null || lines.at(-1) !== "[buy] [back]") return undefined
  const options = lines.slice(2, -1).map((line) => {
    const [dim, values] = line.split(": ")
    return [dim!, values!.split(", ")] as const
  })
  return { id: head[1]!, text: `${head[2]} ${lines[1]}`, price: Number(head[3]), options }
}

/** The option value an instruction's phrase asks for on an item ("size m" → "m"), or undefined. */
const optionOf = (item: Item, phrase: string): string | undefined => {
  for (const [dim, values] of item.options) {
    for (const v of values) if (phrase === v || phrase === `${dim} ${v}`) return v
  }
  return undefined
}

const fits = (item: Item, wish: Wish): boolean => {
  const have = new Set(words(item.text))
  return item.price <= wish.price && words(wish.head).every((w) => have.has(w)) &&
    wish.options.every((o) => optionOf(item, o) !== undefined)
}

/** FNV-1a of a string: the per-visit seed of the detours. */
const hash = (text: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193)
  return h >>> 0
}

// ===== Policy =====

/**
 * The oracle policy (see the module header). Gives up (a reply without a call) when nothing fits.
 *
 * @category constructors
 * @since 0.1.0
 */
export const policy = (
  options: { readonly detour?: number | undefined } = {}
): (messages: Conversation) => Oracle.Reply =>
(messages) => {
  const wish = readInstruction(Oracle.text(messages.find((m) => m.role === "user")))
  if (wish === undefined) return { content: "I cannot read the instruction." }
  const call = (name: string, args: Record<string, unknown>) => ({ toolCalls: [Oracle.call(messages, name, args)] })
  const clicked = clickedIds(messages)
  const pageAt = lastPage(messages)
  if (pageAt < 0) return call("search", { q: [wish.head, ...wish.options].join(" ") })
  const page = Oracle.text(messages[pageAt])
  const results = readResults(page)
  if (results !== undefined) {
    const draw = Sampling.mulberry32(hash(wish.head + wish.options.join()))()
    const detour = clicked.size === 0 && draw < (options.detour ?? 0)
    const want = new Set(words(wish.head))
    const score = (r: Result) => words(r.title).filter((w) => want.has(w)).length
    const open = results.results.filter((r) => !clicked.has(r.id) && r.price <= wish.price)
    const ranked = open
    const wrong = results.results.find((r) => !clicked.has(r.id) && score(r) < want.size)
    const pick = detour ? wrong ?? ranked[0] : ranked[0]
    if (pick !== undefined) return call("click", { id: pick.id })
    return results.next ? call("click", { id: "next" }) : { content: "Nothing fits." }
  }
  const item = readItem(page)!
  if (!fits(item, wish)) return call("click", { id: "back" })
  const selected = new Set(messages.slice(pageAt + 1).flatMap((m) => (m.role === "tool" ? [Oracle.text(m)] : [])))
  for (const phrase of wish.options) {
    const value = optionOf(item, phrase)!
    if (![...selected].some((s) => s.endsWith(`: ${value}`))) return call("select", { o: value })
  }
  return call("buy", {})
}

/** The index of the last tool message that is a results or an item page, or -1. */
const lastPage = (messages: Conversation): number => {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!
    if (m.role === "tool" && (readResults(Oracle.text(m)) ?? readItem(Oracle.text(m))) !== undefined) return i
  }
  return -1
}

/** The result ids the conversation clicked. */
const clickedIds = (messages: Conversation): Set<string> => {
  const ids = new Set<string>()
  for (const m of messages) {
    if (m.role !== "assistant") continue
    for (const c of m.tool_calls ?? []) {
      const id = (c.function.arguments as { id?: unknown } | undefined)?.id
      if (c.function.name === "click" && typeof id === "string" && /^[A-Z0-9]+$/.test(id)) ids.add(id)
    }
  }
  return ids
}

// ===== Direct play =====

/**
 * Plays a policy against a visit directly, without the rollout runtime (no chat template, tool actor or reward
 * actor): each call becomes a {@link Shop.act} and its outcome a tool message. What `bench/webshop.ts` compares the
 * runtime with; it stops at a reply without calls, a purchase, the step limit or `maxTurns`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const playDirect = (
  policy: (messages: Conversation) => Oracle.Reply,
  catalog: Catalog.Shape,
  settings: Shop.Settings,
  question: string,
  options: { readonly systemPrompt?: string | undefined; readonly maxTurns?: number | undefined } = {}
): { readonly messages: Array<Message>; readonly state: Shop.State; readonly actions: number } => {
  const state = Shop.initial()
  const messages: Array<Message> = [
    ...(options.systemPrompt === undefined ? [] : [{ role: "system" as const, content: options.systemPrompt }]),
    { role: "user", content: question }
  ]
  let actions = 0
  for (let turn = 0; turn < (options.maxTurns ?? 8) && Shop.ended(state, settings) === undefined; turn++) {
    const reply = policy(messages)
    const calls = reply.toolCalls ?? []
    messages.push({
      role: "assistant",
      content: reply.content ?? "",
      ...(calls.length > 0 ? { tool_calls: calls } : {})
    })
    if (calls.length === 0) break
    for (const call of calls) {
      actions++
      const action = toAction(call.function.name, call.function.arguments)
      const outcome: Shop.Outcome = action === undefined
        ? { ok: false, error: `unknown tool "${call.function.name}"` }
        : Shop.act(state, catalog, settings, action)
      messages.push({
        role: "tool",
        tool_call_id: call.id,
        name: call.function.name,
        content: outcome.ok ? outcome.text : `Error: ${outcome.error}`,
        ...(outcome.ok ? {} : { is_error: true })
      })
    }
  }
  return { messages, state, actions }
}

/** A tool call as a shop action (what the tools' handlers do after decoding their arguments). */
const toAction = (name: string, args: unknown): Shop.Action | undefined => {
  const a = (typeof args === "object" && args !== null ? args : {}) as Record<string, unknown>
  switch (name) {
    case "search":
      return { _tag: "search", q: String(a["q"] ?? "") }
    case "click":
      return { _tag: "click", id: String(a["id"] ?? "") }
    case "select":
      return { _tag: "select", o: String(a["o"] ?? "") }
    case "buy":
      return { _tag: "buy" }
    default:
      return undefined
  }
}

// ===== Through the runtime =====

/**
 * The chat format the shop's oracle plays through: Qwen2.5's template on the byte-level tokenizer, as the tiny
 * policy's (the runtime leaves the tools' schemas out of the system turn, the task's `renderTools: false`), so
 * that the lengths of the oracle's visits are what a policy's would be (`Oracle.byteFormat`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const format = (): ChainPorts.Format => Oracle.byteFormat()

/**
 * The tokens of a whole conversation in that format, as a warm-up step reads it (`Oracle.contextLength`): the
 * test of whether a demonstration fits a context.
 *
 * @category getters
 * @since 0.1.0
 */
export const contextLength = (): (messages: Conversation) => number => Oracle.contextLength()

/**
 * Rolls a policy out on rows of a task (`Oracle.rollout`: one chain per row, `concurrency` at a time, within the
 * task's default turn and context budgets).
 *
 * @category constructors
 * @since 0.1.0
 */
export const rollout = Oracle.rollout
