/**
 * Shopping goals and their instructions, drawn from the catalogue as WebShop draws its synthetic goals: a target
 * product, some of its attributes, one value of each of its option dimensions, and a price bound a little above
 * its price ("i want a slim fit cotton t-shirt, size m, color red, under 30 dollars").
 *
 * A goal is what the reward compares a purchase with (`Score.ts`); any product that meets it scores as well as the
 * target. A dataset row is `{ question: instruction, goal }`.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Sampling from "../../src/Sampling.ts"
import type * as Catalog from "./Catalog.ts"
import * as Taxonomy from "./Taxonomy.ts"

// ===== Models =====

/**
 * What the buyer wants (WebShop's goal: `asin`, `query`, `name`, `product_category`, `attributes`,
 * `goal_options`, `price_upper`).
 *
 * @category models
 * @since 0.1.0
 */
export const Goal = Schema.Struct({
  /** The product the goal was drawn from. */
  asin: Schema.String,
  type: Schema.String,
  category: Schema.Array(Schema.String),
  /** The target's title (WebShop's goal `name`, read by the type match). */
  title: Schema.String,
  attributes: Schema.Array(Schema.String),
  /** One value per option dimension. */
  options: Schema.Record(Schema.String, Schema.String),
  /** The price bound in dollars (the price must be at most this). */
  price: Schema.Number
})
export type Goal = typeof Goal.Type

/**
 * A dataset row of the task.
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Schema.Struct({ goal: Goal })

/**
 * A row as the generator writes it.
 *
 * @category models
 * @since 0.1.0
 */
export type Instruction = {
  readonly question: string
  readonly goal: Goal
}

// ===== Constructors =====

/** WebShop's price bounds are multiples of 10. */
const priceBound = (price: number, next: () => number): number => {
  // WebShop: the larger of two of the four next multiples of 10 above the price.
  const above = [1, 2, 3, 4].map((k) => 10 * (Math.floor(price / 10) + k))
  const a = Math.floor(next() * 4)
  let b = Math.floor(next() * 3)
  if (b >= a) b++
  return Math.max(above[a]!, above[b]!)
}

/**
 * How an option is said: "size m", "color red", or the value alone when it names its dimension ("6 pack").
 *
 * @category getters
 * @since 0.1.0
 */
export const optionPhrase = (dim: string, value: string): string =>
  value.split(" ").includes(dim) ? value : `${dim} ${value}`

const isPlural = (type: string): boolean => Taxonomy.types.find((t) => t.name === type)?.plural === true

/**
 * The instruction of a goal: "i want a {attributes} {type}, {options}, under {price} dollars".
 *
 * @category getters
 * @since 0.1.0
 */
export const instruction = (goal: Goal): string => {
  const head = `${goal.attributes.join(" ")} ${goal.type}`
  const article = isPlural(goal.type) ? "" : /^[aeiou]/.test(head) ? "an " : "a "
  const options = Object.entries(goal.options).map(([dim, value]) => `, ${optionPhrase(dim, value)}`).join("")
  return `i want ${article}${head}${options}, under ${goal.price} dollars`
}

/**
 * A goal drawn from a product: 1–2 of its attributes, one value of each option dimension, a price bound above its
 * price.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromProduct = (product: Catalog.Product, next: () => number): Goal => {
  const count = Math.min(product.attributes.length, next() < 0.5 ? 1 : 2)
  const chosen: Array<string> = []
  while (chosen.length < count) {
    const a = product.attributes[Math.floor(next() * product.attributes.length)]!
    if (!chosen.includes(a)) chosen.push(a)
  }
  const options: Record<string, string> = {}
  for (const [dim, values] of Object.entries(product.options)) {
    if (values.length > 0) options[dim] = values[Math.floor(next() * values.length)]!
  }
  return {
    asin: product.id,
    type: product.type,
    category: product.category,
    title: product.title,
    attributes: chosen,
    options,
    price: priceBound(product.price, next)
  }
}

/**
 * Splits of instructions over disjoint target products (each product is the target of at most one row, and no two
 * rows share an instruction), drawn in the order of `sizes`' keys with one seeded stream.
 *
 * **Gotchas**
 *
 * The total of the sizes must not exceed the catalogue's size.
 *
 * @category constructors
 * @since 0.1.0
 */
export const splits = <const Names extends string>(
  products: ReadonlyArray<Catalog.Product>,
  seed: number,
  sizes: { readonly [K in Names]: number }
): { [K in Names]: Array<Instruction> } => {
  const next = Sampling.mulberry32(seed)
  const order = products.map((_, i) => i)
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1))
    const swap = order[i]!
    order[i] = order[j]!
    order[j] = swap
  }
  const seen = new Set<string>()
  let cursor = 0
  const out = {} as { [K in Names]: Array<Instruction> }
  for (const name of Object.keys(sizes) as Array<Names>) {
    const rows: Array<Instruction> = []
    while (rows.length < sizes[name] && cursor < order.length) {
      const goal = fromProduct(products[order[cursor++]!]!, next)
      const question = instruction(goal)
      if (seen.has(question)) continue
      seen.add(question)
      rows.push({ question, goal })
    }
    out[name] = rows
  }
  return out
}
