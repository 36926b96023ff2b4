/**
 * WebShop's score of a purchase against a goal (Yao et al. 2022, §3.2; `web_agent_site/engine/goal.py`
 * `get_reward`), reimplemented:
 *
 * ```
 * score = r_type · (attributes matched + options matched + [price ≤ bound]) / (|attributes| + |options| + 1)
 * ```
 *
 * - **Attributes**: a goal attribute matches when one of the product's attributes has a token-set ratio above 85
 *   with it, or else when it appears in the product's title or description.
 * - **Options**: each purchased option matches when its value is one of the goal's values (exactly for `size`,
 *   by token-set ratio above 85 for the others), or else appears in the title or description.
 * - **Type** (`r_type`): 1 when the product's type is the goal's (WebShop's `query` match), or their category
 *   paths share at least two levels, or more than 20 % of the goal title's words are in the product's title; else
 *   0.5; then 0.1 when under 10 % of those words match and 0 when none does.
 *
 * Three departures, all stated: WebShop's fall-back looks for substrings (so the size `s` "appears" in "slim fit"
 * and every size would match); here it looks for whole words. WebShop keeps only the nouns of the titles (spaCy's
 * part-of-speech tagger) for the title match; here every word but a few stop words counts. Its token-set ratio is
 * `thefuzz`'s, here reimplemented on the same definition (the indel similarity of the sorted token intersection and
 * differences), and its colour normalisation is not needed (the generated values are already normal).
 *
 * The reward (`webshop`) reads the chain's purchase from its {@link Shop.Shop} and the goal from the row; nothing
 * bought scores 0. Its metrics are the components: `r_type`, `r_att`, `r_option`, `r_price`, `bought`, `steps`,
 * and `acc` (a score of 1: WebShop's success rate).
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Reward from "../../src/Reward.ts"
import type * as Catalog from "./Catalog.ts"
import * as Goal from "./Goal.ts"
import * as Shop from "./Shop.ts"

// ===== Fuzzy matching =====

/** thefuzz's default processing: lower case, anything but letters and digits becomes a space. */
const tokens = (text: string): Array<string> =>
  text.toLowerCase().replace(/[^\p{L}\p{N}]+/gu, " ").trim().split(" ").filter((t) => t !== "")

/** The length of the longest common subsequence of two strings. */
const lcs = (a: string, b: string): number => {
  let previous = new Array<number>(b.length + 1).fill(0)
  for (let i = 1; i <= a.length; i++) {
    const row = new Array<number>(b.length + 1).fill(0)
    for (let j = 1; j <= b.length; j++) {
      row[j] = a[i - 1] === b[j - 1] ? previous[j - 1]! + 1 : Math.max(previous[j]!, row[j - 1]!)
    }
    previous = row
  }
  return previous[b.length]!
}

/**
 * The indel similarity of two strings in [0, 100] (`fuzz.ratio`): 100 · 2 · LCS / (|a| + |b|).
 *
 * @category getters
 * @since 0.1.0
 */
export const ratio = (a: string, b: string): number =>
  a.length + b.length === 0 ? 0 : (200 * lcs(a, b)) / (a.length + b.length)

/**
 * The token-set ratio of two texts in [0, 100] (`fuzz.token_set_ratio`): 100 when the tokens of one are a subset
 * of the other's (and they share one), else the best ratio between the sorted intersection and each side.
 *
 * @category getters
 * @since 0.1.0
 */
export const tokenSetRatio = (a: string, b: string): number => {
  const ta = new Set(tokens(a))
  const tb = new Set(tokens(b))
  const common = [...ta].filter((t) => tb.has(t)).sort()
  const onlyA = [...ta].filter((t) => !tb.has(t)).sort()
  const onlyB = [...tb].filter((t) => !ta.has(t)).sort()
  if (common.length > 0 && (onlyA.length === 0 || onlyB.length === 0)) return 100
  const sect = common.join(" ")
  const withA = [sect, ...onlyA].filter((s) => s !== "").join(" ")
  const withB = [sect, ...onlyB].filter((s) => s !== "").join(" ")
  return Math.max(ratio(sect, withA), ratio(sect, withB), ratio(withA, withB))
}

// ===== Components =====

/**
 * The parts of a score.
 *
 * @category models
 * @since 0.1.0
 */
export interface Components {
  readonly score: number
  readonly rType: number
  readonly queryMatch: boolean
  readonly categoryMatch: boolean
  readonly titleScore: number
  readonly attributeMatches: number
  readonly rAtt: number
  readonly optionMatches: number
  /** Undefined when the goal has no options. */
  readonly rOption: number | undefined
  readonly rPrice: number
}

const stopWords = new Set(["a", "an", "the", "and", "or", "for", "with", "of", "in", "on", "to", "by"])

const titleWords = (title: string): Set<string> => new Set(tokens(title).filter((t) => !stopWords.has(t)))

/** The words the attribute and option matches fall back to: the title's and the description's. */
const haystack = (product: Catalog.Product): string =>
  ` ${tokens(`${product.title} ${product.description ?? ""}`).join(" ")} `

/** Whether a phrase's words appear, in order and whole, in a haystack. */
const mentions = (text: string, phrase: string): boolean => {
  const words = tokens(phrase)
  return words.length > 0 && text.includes(` ${words.join(" ")} `)
}

/**
 * WebShop's type reward.
 *
 * @category getters
 * @since 0.1.0
 */
export const typeReward = (product: Catalog.Product, goal: Goal.Goal) => {
  const queryMatch = product.type === goal.type
  const categoryMatch = product.category.filter((c) => goal.category.includes(c)).length >= 2
  const wanted = titleWords(goal.title)
  const have = titleWords(product.title)
  const titleScore = wanted.size === 0 ? 0.2 : [...wanted].filter((w) => have.has(w)).length / wanted.size
  let rType = queryMatch || categoryMatch || titleScore > 0.2 ? 1 : 0.5
  if (titleScore < 0.1) rType = 0.1
  if (titleScore === 0) rType = 0
  return { rType, queryMatch, categoryMatch, titleScore }
}

/**
 * The score of buying `product` with `options` for `goal`, with its parts.
 *
 * @category getters
 * @since 0.1.0
 */
export const score = (
  product: Catalog.Product,
  options: Readonly<Record<string, string>>,
  goal: Goal.Goal
): Components => {
  const type = typeReward(product, goal)
  const text = haystack(product)
  const attributeMatches = goal.attributes.filter((g) =>
    product.attributes.some((p) => tokenSetRatio(p, g) > 85) || mentions(text, g)
  ).length
  const wanted = Object.values(goal.options)
  const optionMatches = Object.entries(options).filter(([dim, value]) =>
    (dim.toLowerCase() === "size" ? wanted.includes(value) : wanted.some((g) => tokenSetRatio(g, value) > 85)) ||
    mentions(text, value)
  ).length
  const rPrice = goal.price <= 0 || product.price <= goal.price ? 1 : 0
  const parts = goal.attributes.length + wanted.length + 1
  return {
    score: (type.rType * (attributeMatches + optionMatches + rPrice)) / parts,
    ...type,
    attributeMatches,
    rAtt: goal.attributes.length === 0 ? 1 : attributeMatches / goal.attributes.length,
    optionMatches,
    rOption: wanted.length === 0 ? undefined : optionMatches / wanted.length,
    rPrice
  }
}

// ===== Reward =====

/**
 * WebShop's score of the chain's purchase (0 when nothing was bought), with its components as metrics.
 *
 * @category constructors
 * @since 0.1.0
 */
export const webshop = Reward.make("webshop", {
  row: Goal.Row,
  dependencies: [Shop.Shop],
  score: ({ row }) =>
    Effect.map(Effect.flatMap(Shop.Shop, (shop) => shop.state), (state) => {
      if (state.purchase === undefined) {
        return { reward: 0, metrics: { bought: 0, acc: 0, steps: state.steps } }
      }
      const c = score(state.purchase.product, state.purchase.options, row.goal)
      return {
        reward: c.score,
        metrics: {
          bought: 1,
          acc: c.score >= 1 - 1e-9 ? 1 : 0,
          r_type: c.rType,
          r_att: c.rAtt,
          ...(c.rOption === undefined ? {} : { r_option: c.rOption }),
          r_price: c.rPrice,
          steps: state.steps
        }
      }
    })
})
