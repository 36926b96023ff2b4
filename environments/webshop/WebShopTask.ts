/**
 * The web-shop task (WebShop, Yao et al. 2022, as AgentFly trains it): buy the product an instruction asks for
 * ("i want a slim fit cotton t-shirt, size m, color red, under 30 dollars") in a shop of ≥ 10,000 products,
 * with the tools `search`, `click`, `select` and `buy`; scored by WebShop's score (`Score.ts`).
 *
 * - The catalogue and its BM25 index are built once per run (the task's `layer`) and shared read-only by every
 *   chain; each chain has its own visit (`Shop.provider`, per chain): its page, selected options and purchase.
 * - The episode ends when the agent buys (`episodeEnd: "bought"`), runs out of steps (`"out_of_steps"`), or
 *   ends a turn without a call; `maxTurns` bounds it too.
 * - Rows: `{ question, goal }` (see `Goal.ts`), from `examples/webshop/generate.ts` or a user's own JSONL.
 *
 * Options (`{ "name": "webshop", "options": { … } }`): `catalog` (a JSONL file of products, relative to the config
 * file, as the generator's
 * `products.jsonl`; default: the generated catalogue of `catalogSeed` 1 and `products` 10,000), `pageSize`,
 * `maxResults`, `titleChars`, `maxSteps` (see `Shop.Settings`), and `toolCallFormat`, the weight of a tool-call
 * format term added to the score (default 0).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Task from "../../src/Task.ts"
import * as ToolCallFormat from "../rewards/ToolCallFormat.ts"
import * as Catalog from "./Catalog.ts"
import * as Goal from "./Goal.ts"
import * as Score from "./Score.ts"
import * as Shop from "./Shop.ts"
import * as Tools from "./Tools.ts"

// ===== Models =====

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

/**
 * The task's options.
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  catalog: Schema.optionalKey(Task.PathOption),
  catalogSeed: Schema.optionalKey(Schema.Int),
  products: Schema.optionalKey(Count),
  pageSize: Schema.optionalKey(Count),
  maxResults: Schema.optionalKey(Count),
  titleChars: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(8))),
  maxSteps: Schema.optionalKey(Count),
  toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type Options = typeof Options.Type

/**
 * The one-line system prompt (every byte of it is in every sequence).
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Shop: search, click, select, buy."

/**
 * The agent settings the task suggests: five actions make a purchase (search, click, two selects, buy), which
 * fit in 1,024 bytes of the byte-level tokenizer with the default pages.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaults: Task.Defaults = {
  systemPrompt,
  renderTools: false,
  maxTurns: 8,
  maxNewTokens: 128,
  maxContextTokens: 1024
}

// ===== Constructors =====

/**
 * The catalogue source of the options.
 *
 * @category getters
 * @since 0.1.0
 */
export const source = (options: Options): Catalog.Source =>
  options.catalog !== undefined
    ? { _tag: "File", path: options.catalog }
    : {
      _tag: "Generated",
      seed: options.catalogSeed ?? Catalog.defaultSource.seed,
      size: options.products ?? Catalog.defaultSource.size
    }

/**
 * The shop settings of the options.
 *
 * @category getters
 * @since 0.1.0
 */
export const settings = (options: Options): Shop.Settings => ({
  pageSize: options.pageSize ?? Shop.defaultSettings.pageSize,
  maxResults: options.maxResults ?? Shop.defaultSettings.maxResults,
  titleChars: options.titleChars ?? Shop.defaultSettings.titleChars,
  maxSteps: options.maxSteps ?? Shop.defaultSettings.maxSteps
})

/**
 * The reward of a format weight: WebShop's score, or `score + w·toolCallFormat`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (formatWeight: number) =>
  ToolCallFormat.withFormat(Score.webshop, formatWeight)

const state = Effect.flatMap(Shop.Shop, (shop) => Effect.map(shop.state, (s) => [s, shop.settings] as const))

/**
 * The task with its options.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options = {}): Task.Task =>
  Task.make("webshop", {
    description: "Buy the product an instruction asks for in a generated web shop (WebShop)",
    row: Goal.Row,
    tools: Tools.all,
    reward: reward(options.toolCallFormat ?? 0),
    environment: Shop.provider(settings(options)),
    layer: Catalog.layer(source(options)),
    episode: {
      start: () => Effect.flatMap(Shop.Shop, (shop) => shop.reset),
      step: () =>
        Effect.map(state, ([s, set]) => {
          const end = Shop.ended(s, set)
          return end === undefined ? undefined : { end }
        })
    },
    defaults
  })

/**
 * The task as a config names it (`"task": "webshop"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("webshop", Options, make)
