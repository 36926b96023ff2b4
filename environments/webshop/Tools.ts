/**
 * The shop's four tools, bound to the chain's {@link Shop.Shop}: `search {q}`, `click {id}`, `select {o}` and
 * `buy {}`. Names and arguments are short because a byte-level policy writes every byte of every call.
 *
 * Typed tools rather than WebShop's text actions (`search[...]`, `click[...]` parsed from free text): the chat
 * template's tool-call format already is the action grammar, the argument Schemas reject malformed actions with
 * the runtime's own format errors (which `toolCallFormat` and the metrics count), and `select` / `buy` say what
 * WebShop's overloaded `click[m]` / `click[Buy Now]` mean.
 *
 * A refused action fails with `Environment.EnvError` (reason `InvalidAction`), which the model reads as
 * `Error: …` (`failureMode: "return"`).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Environment from "../../src/Environment.ts"
import * as Tool from "../../src/Tool.ts"
import * as Shop from "./Shop.ts"

const act = (action: Shop.Action) => Effect.flatMap(Shop.Shop, (shop) => shop.act(action))

/**
 * @category constructors
 * @since 0.1.0
 */
export const search = Tool.make("search", {
  description: "Search the shop; shows the first page of results",
  parameters: Schema.Struct({ q: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Shop.Shop],
  handler: ({ q }) => act({ _tag: "search", q })
})

/**
 * @category constructors
 * @since 0.1.0
 */
export const click = Tool.make("click", {
  description: "Click a result id, or next, prev, back",
  parameters: Schema.Struct({ id: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Shop.Shop],
  handler: ({ id }) => act({ _tag: "click", id })
})

/**
 * @category constructors
 * @since 0.1.0
 */
export const select = Tool.make("select", {
  description: "Select an option of the open item, e.g. m or red",
  parameters: Schema.Struct({ o: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Shop.Shop],
  handler: ({ o }) => act({ _tag: "select", o })
})

/**
 * @category constructors
 * @since 0.1.0
 */
export const buy = Tool.make("buy", {
  description: "Buy the open item with the selected options",
  failure: Environment.EnvError,
  dependencies: [Shop.Shop],
  handler: () => act({ _tag: "buy" })
})

/**
 * The four tools.
 *
 * @category constants
 * @since 0.1.0
 */
export const all = [search, click, select, buy] as const
