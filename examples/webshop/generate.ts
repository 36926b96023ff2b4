/**
 * Writes the web-shop task's data: `train.jsonl`, `heldout.jsonl` and `validation.jsonl` (instructions with their
 * goals, over disjoint target products), `demos.jsonl` (the oracle's successful visits, rolled out through the
 * task's own tools, environment and reward by `Rollout.runTaskChat`, for the SFT warm-up) and `products.jsonl`
 * (the catalogue the rows refer to, in the format the task's `catalog` option reads). Seeded: the same options
 * always write the same bytes.
 *
 *   npx tsx examples/webshop/generate.ts [OUT_DIR] [SEED] [NOISE]
 *
 * Demonstrations are the visits the oracle completes within the task's 1,024-token context (as the model will
 * read them: Qwen2.5's template on the byte-level tokenizer, no tool schemas). `SEED` draws the instructions; the
 * catalogue is the task's default (seed 1, 10,000 products) unless `catalogSeed` / `products` say otherwise, and a run
 * must then pass the same values as task options. `NOISE` is the share of demonstrations that first open a wrong result
 * and go back (`ShopOracle.policy`'s `detour`); a detour costs ≈ 300 bytes, so some of them no longer fit the
 * 1,024-byte context and are left out.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import * as Catalog from "../../environments/webshop/Catalog.ts"
import * as Goal from "../../environments/webshop/Goal.ts"
import * as ShopOracle from "../../environments/webshop/ShopOracle.ts"
import * as WebShopTask from "../../environments/webshop/WebShopTask.ts"
import * as Dataset from "../../src/Dataset.ts"
import { main } from "../generator.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  /** Instructions the oracle plays for demonstrations (those it solves within the budgets are written). */
  readonly demos: number
  readonly noise: number
  readonly catalogSeed: number
  readonly products: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 2026,
  train: 4000,
  heldOut: 500,
  validation: 200,
  demos: 1000,
  noise: 0,
  catalogSeed: Catalog.defaultSource.seed,
  products: Catalog.defaultSource.size
}

/**
 * Generates and writes the five files under `options.dir` (created if missing); returns the rows written per file.
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("webshop.generate.write")(function*(options: Options) {
  const products = Catalog.generate(options.catalogSeed, options.products)
  const { heldOut, train, validation, demos } = Goal.splits(products, options.seed, {
    heldOut: options.heldOut,
    train: options.train,
    validation: options.validation,
    demos: options.demos
  })
  const task = WebShopTask.make({ catalogSeed: options.catalogSeed, products: options.products })
  const visits = yield* ShopOracle.rollout({ task, rows: demos, policy: ShopOracle.policy({ detour: options.noise }) })
  // Trajectories finish out of order; the rows' order keeps the file's bytes a function of the options.
  const byQuestion = new Map(visits.map((t) => [Oracle.text(t.messages.find((m) => m.role === "user")), t]))
  // The chain lets the purchase's own observation overrun the context budget; a demonstration must fit the model.
  const budget = task.defaults.maxContextTokens ?? Number.POSITIVE_INFINITY
  const length = ShopOracle.contextLength()
  const played = demos.flatMap((row) => byQuestion.get(row.question) ?? [])
  const solved = Oracle.demonstrations(played).filter((demo) => length(demo.messages) <= budget)
  return yield* Dataset.writeSplits(options.dir, { train, heldOut, validation, demos: solved, products })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
