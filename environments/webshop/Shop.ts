/**
 * One chain's visit to the shop: the page it is on (start, search results, an item), the options it selected and
 * what it bought, over the run's shared {@link Catalog.Catalog}. Each chain has its own (`Environment.perChain`);
 * the catalogue and its index are never copied.
 *
 * **Pages** are WebShop's text pages, kept compact for a byte-level policy (≈ 100–200 bytes by default):
 *
 * ```
 * page 1/17                                    [BM0IZ] Fable cotton slim fit t-shirt $12.99
 * [BM0IZ] Fable cotton slim fit t-shirt $12.99  cotton, slim fit, moisture wicking
 * [B4Q1T] Brio slim fit cotton t-shirt $24.49   size: m, l, xxl
 * [B09ZK] Sol slim fit cotton t-shirt $18.00    color: red, blue
 * [next]                                       [buy] [back]
 * ```
 *
 * **Actions** ({@link act}): `search` (from any page: a new list of results), `click` (a result id on the
 * results page, or the buttons `next`, `prev`, `back`; `back` or `prev` on an item page), `select` (an option
 * value of the open item, e.g. `m`; `size m` and `size: m` also work), `buy` (the open item with the options
 * selected: the episode is over). A
 * refused action (a button not on the page, an unknown option, anything after the purchase or past the step
 * limit) is an error message for the model, never a crash, and leaves the page as it was. Every action counts
 * towards the step limit, refused ones included.
 *
 * WebShop's item page hides attributes behind [Description] and [Features] buttons; here the item page lists
 * them (one line), which saves a turn and its bytes. WebShop also allows `search` only on the search page; here
 * it works from any page.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import * as Environment from "../../src/Environment.ts"
import * as Catalog from "./Catalog.ts"

// ===== Models =====

/**
 * Rendering and limits.
 *
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  /** Results per page (default 3). */
  readonly pageSize: number
  /** Results a search returns at most, over all pages (default 50, as WebShop). */
  readonly maxResults: number
  /** Titles longer than this are cut on results and item pages (default 48 characters). */
  readonly titleChars: number
  /** Actions per episode, refused ones included (default 12). */
  readonly maxSteps: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaultSettings: Settings = { pageSize: 3, maxResults: 50, titleChars: 48, maxSteps: 12 }

/**
 * A purchase: the product and the options selected when `buy` ran.
 *
 * @category models
 * @since 0.1.0
 */
export interface Purchase {
  readonly product: Catalog.Product
  readonly options: Readonly<Record<string, string>>
}

/**
 * A visit's state.
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  page: "start" | "results" | "item"
  query: string
  /** The ids of the last search's results, best first. */
  hits: ReadonlyArray<string>
  /** The results page shown (0-based). */
  pageIndex: number
  item: Catalog.Product | undefined
  selected: Record<string, string>
  purchase: Purchase | undefined
  steps: number
}

/**
 * An action of the agent.
 *
 * @category models
 * @since 0.1.0
 */
export type Action =
  | { readonly _tag: "search"; readonly q: string }
  | { readonly _tag: "click"; readonly id: string }
  | { readonly _tag: "select"; readonly o: string }
  | { readonly _tag: "buy" }

/**
 * What an action did: the page or message the agent reads, or why it was refused.
 *
 * @category models
 * @since 0.1.0
 */
export type Outcome =
  | { readonly ok: true; readonly text: string }
  | { readonly ok: false; readonly error: string }

// ===== Pages =====

const money = (price: number): string => `$${price.toFixed(2)}`

const cut = (text: string, chars: number): string => (text.length <= chars ? text : text.slice(0, chars - 1) + "…")

const pages = (state: State, settings: Settings) => Math.max(1, Math.ceil(state.hits.length / settings.pageSize))

const shown = (state: State, settings: Settings): ReadonlyArray<string> =>
  state.hits.slice(state.pageIndex * settings.pageSize, (state.pageIndex + 1) * settings.pageSize)

/**
 * The results page.
 *
 * @category getters
 * @since 0.1.0
 */
export const resultsPage = (state: State, catalog: Catalog.Shape, settings: Settings): string => {
  if (state.hits.length === 0) return `no results for "${cut(state.query, 40)}" [back]`
  const lines = [`page ${state.pageIndex + 1}/${pages(state, settings)}`]
  for (const id of shown(state, settings)) {
    const p = catalog.get(id)!
    lines.push(`[${id}] ${cut(p.title, settings.titleChars)} ${money(p.price)}`)
  }
  const buttons = [
    ...(state.pageIndex > 0 ? ["[prev]"] : []),
    ...(state.pageIndex + 1 < pages(state, settings) ? ["[next]"] : [])
  ]
  if (buttons.length > 0) lines.push(buttons.join(" "))
  return lines.join("\n")
}

/**
 * The item page.
 *
 * @category getters
 * @since 0.1.0
 */
export const itemPage = (product: Catalog.Product, settings: Settings): string =>
  [
    `[${product.id}] ${cut(product.title, settings.titleChars)} ${money(product.price)}`,
    product.attributes.join(", "),
    ...Object.entries(product.options).map(([dim, values]) => `${dim}: ${values.join(", ")}`),
    "[buy] [back]"
  ].join("\n")

// ===== Actions =====

/**
 * A fresh visit: on the start page, nothing searched, selected or bought.
 *
 * @category constructors
 * @since 0.1.0
 */
export const initial = (): State => ({
  page: "start",
  query: "",
  hits: [],
  pageIndex: 0,
  item: undefined,
  selected: {},
  purchase: undefined,
  steps: 0
})

const ok = (text: string): Outcome => ({ ok: true, text })
const refused = (error: string): Outcome => ({ ok: false, error })

/** An option value of the product named by `o` ("m", "size m", "size: m"), with its dimension. */
const findOption = (product: Catalog.Product, o: string): readonly [string, string] | undefined => {
  const wanted = o.trim().toLowerCase().replace(/\s+/g, " ")
  for (const [dim, values] of Object.entries(product.options)) {
    for (const value of values) {
      const v = value.toLowerCase()
      if (wanted === v || wanted === `${dim} ${v}` || wanted === `${dim}: ${v}` || wanted === `${dim}:${v}`) {
        return [dim, value]
      }
    }
  }
  return undefined
}

const search = (state: State, catalog: Catalog.Shape, settings: Settings, q: string): Outcome => {
  const query = q.trim()
  if (query === "") return refused("search needs words")
  state.page = "results"
  state.query = query
  state.hits = catalog.search(query, settings.maxResults).map((h) => h.id)
  state.pageIndex = 0
  state.item = undefined
  state.selected = {}
  return ok(resultsPage(state, catalog, settings))
}

const click = (state: State, catalog: Catalog.Shape, settings: Settings, raw: string): Outcome => {
  const id = raw.trim().replace(/^\[|\]$/g, "").trim()
  const button = id.toLowerCase()
  if (state.page === "start") return refused("nothing to click yet: search first")
  if (state.page === "item") {
    if (button !== "back" && button !== "prev") {
      return refused(`"${cut(id, 20)}" is not a button here (back; buy and select are tools)`)
    }
    state.page = "results"
    state.item = undefined
    state.selected = {}
    return ok(resultsPage(state, catalog, settings))
  }
  if (button === "back") {
    state.page = "start"
    state.hits = []
    return ok("start page: search")
  }
  if (button === "next" || button === "prev") {
    const to = state.pageIndex + (button === "next" ? 1 : -1)
    if (to < 0 || to >= pages(state, settings)) return refused(`no ${button} page`)
    state.pageIndex = to
    return ok(resultsPage(state, catalog, settings))
  }
  const match = shown(state, settings).find((h) => h.toLowerCase() === button)
  if (match === undefined) return refused(`"${cut(id, 20)}" is not on this page (a result id, next, prev, back)`)
  state.page = "item"
  state.item = catalog.get(match)!
  state.selected = {}
  return ok(itemPage(state.item, settings))
}

const select = (state: State, o: string): Outcome => {
  if (state.page !== "item" || state.item === undefined) return refused("no item open: click a result first")
  const found = findOption(state.item, o)
  if (found === undefined) {
    const offered = Object.entries(state.item.options).map(([d, vs]) => `${d}: ${vs.join(", ")}`).join("; ")
    return refused(`no option "${cut(o, 20)}" (${offered === "" ? "this item has none" : offered})`)
  }
  state.selected = { ...state.selected, [found[0]]: found[1] }
  return ok(`${found[0]}: ${found[1]}`)
}

const buy = (state: State): Outcome => {
  if (state.page !== "item" || state.item === undefined) return refused("no item open: click a result first")
  state.purchase = { product: state.item, options: { ...state.selected } }
  const chosen = Object.entries(state.selected).map(([d, v]) => `, ${d}: ${v}`).join("")
  return ok(`bought ${state.item.id}${chosen}`)
}

/**
 * Runs one action against a visit (mutating it) and says what the agent sees.
 *
 * @category combinators
 * @since 0.1.0
 */
export const act = (state: State, catalog: Catalog.Shape, settings: Settings, action: Action): Outcome => {
  if (state.purchase !== undefined) return refused("the order is placed: the visit is over")
  if (state.steps >= settings.maxSteps) return refused(`no steps left (${settings.maxSteps} per visit)`)
  state.steps++
  switch (action._tag) {
    case "search":
      return search(state, catalog, settings, action.q)
    case "click":
      return click(state, catalog, settings, action.id)
    case "select":
      return select(state, action.o)
    case "buy":
      return buy(state)
  }
}

/**
 * Whether the visit is over: bought, or out of steps.
 *
 * @category getters
 * @since 0.1.0
 */
export const ended = (state: State, settings: Settings): "bought" | "out_of_steps" | undefined =>
  state.purchase !== undefined ? "bought" : state.steps >= settings.maxSteps ? "out_of_steps" : undefined

// ===== Service =====

/**
 * A chain's visit as a service: the tools' actions, a reset, and the state (read by the reward and the episode).
 *
 * @category services
 * @since 0.1.0
 */
export class Shop extends Context.Service<Shop, {
  readonly settings: Settings
  readonly reset: Effect.Effect<void>
  readonly act: (action: Action) => Effect.Effect<string, Environment.EnvError>
  readonly state: Effect.Effect<State>
}>()("agentfly/environments/webshop/Shop") {}

/**
 * One visit per build (use with `Environment.perChain`), over the run's catalogue.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (settings: Settings = defaultSettings): Layer.Layer<Shop, never, Catalog.Catalog> =>
  Layer.effect(
    Shop,
    Effect.map(Catalog.Catalog, (catalog) => {
      let state = initial()
      return Shop.of({
        settings,
        reset: Effect.sync(() => {
          state = initial()
        }),
        act: (action) =>
          Effect.suspend(() => {
            const outcome = act(state, catalog, settings, action)
            return outcome.ok
              ? Effect.succeed(outcome.text)
              : Effect.fail(
                Environment.envError("webshop", action._tag, "InvalidAction", outcome.error)
              )
          }),
        state: Effect.sync(() => state)
      })
    })
  )

/**
 * The task's provider: a fresh visit per chain ({@link layer} through `Environment.perChain`), with the run's
 * figures `env/webshop/visits` (visits started) and `env/webshop/open` (visits whose chain has not ended: 0 once
 * every chain is done, or a chain leaked its visit). Build it in the run's scope.
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = (
  settings: Settings = defaultSettings
): Effect.Effect<Environment.Provider<Shop, never, Catalog.Catalog>, never, Scope.Scope> =>
  Effect.sync(() =>
    Environment.counted(Environment.perChain(layer(settings)), {
      started: "env/webshop/visits",
      open: "env/webshop/open"
    })
  )
