/**
 * WebShop's score, reimplemented: the token-set ratio it matches attributes and options with, each component on
 * hand-made purchases (the goal's own product scores 1; a wrong size, a missing option, a price over the bound,
 * another type cost what WebShop's formula says), and the `webshop` reward reading a chain's purchase.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Catalog from "../../../environments/webshop/Catalog.ts"
import type * as Goal from "../../../environments/webshop/Goal.ts"
import * as Score from "../../../environments/webshop/Score.ts"
import * as Shop from "../../../environments/webshop/Shop.ts"
import { trajectoryOf } from "../../utils/trajectories.ts"

const shirt: Catalog.Product = {
  id: "BSHRT",
  title: "Acme slim fit cotton t-shirt",
  type: "t-shirt",
  category: ["fashion", "tops", "t-shirts"],
  attributes: ["cotton", "slim fit", "machine wash"],
  options: { size: ["s", "m", "l"], color: ["red", "navy"] },
  price: 19.99
}
const hoodie: Catalog.Product = {
  id: "BHOOD",
  title: "Zeta cotton pullover hoodie",
  type: "hoodie",
  category: ["fashion", "tops", "hoodies"],
  attributes: ["cotton", "pullover"],
  options: { size: ["m"], color: ["red"] },
  price: 25
}
const headphones: Catalog.Product = {
  id: "BHEAD",
  title: "Nova wireless headphones",
  type: "headphones",
  category: ["electronics", "audio", "headphones"],
  attributes: ["wireless"],
  options: { color: ["red"] },
  price: 25
}
const goal: Goal.Goal = {
  asin: "BSHRT",
  type: "t-shirt",
  category: ["fashion", "tops", "t-shirts"],
  title: "Acme slim fit cotton t-shirt",
  attributes: ["cotton", "slim fit"],
  options: { size: "m", color: "red" },
  price: 30
}

describe("webshop score", () => {
  it("token-set ratio: 100 for a subset, high for a typo, low for other words", () => {
    assert.strictEqual(Score.tokenSetRatio("cotton", "organic cotton"), 100)
    assert.strictEqual(Score.tokenSetRatio("Slim-Fit", "slim fit"), 100)
    assert.strictEqual(Score.tokenSetRatio("light blue", "blue"), 100)
    assert.isAbove(Score.tokenSetRatio("polyster", "polyester"), 85)
    assert.isBelow(Score.tokenSetRatio("wireless", "cotton"), 50)
    assert.strictEqual(Score.tokenSetRatio("", "cotton"), 0)
    assert.strictEqual(Score.ratio("abc", "abc"), 100)
  })

  it("the goal's product with the goal's options scores 1, every component 1", () => {
    const c = Score.score(shirt, { size: "m", color: "red" }, goal)
    assert.strictEqual(c.score, 1)
    assert.deepInclude(c, { rType: 1, rAtt: 1, rOption: 1, rPrice: 1, queryMatch: true, categoryMatch: true })
  })

  it("each miss costs its share: (attributes + options + price) / (|attributes| + |options| + 1)", () => {
    // A wrong size: 2 attributes + 1 option + price of 5. The size is matched exactly: "s" is not "m", and the
    // title's "slim" does not count as mentioning "s" (WebShop's substring test would).
    assert.closeTo(Score.score(shirt, { size: "s", color: "red" }, goal).score, 4 / 5, 1e-12)
    // No option selected.
    assert.closeTo(Score.score(shirt, {}, goal).score, 3 / 5, 1e-12)
    assert.strictEqual(Score.score(shirt, {}, goal).rOption, 0)
    // Over the price bound.
    const dear = Score.score({ ...shirt, price: 31 }, { size: "m", color: "red" }, goal)
    assert.closeTo(dear.score, 4 / 5, 1e-12)
    assert.strictEqual(dear.rPrice, 0)
    // An attribute only in the description still counts (WebShop's fall-back); one nowhere does not.
    const plain = { ...shirt, attributes: ["cotton"], title: "Acme t-shirt" }
    assert.closeTo(Score.score(plain, { size: "m", color: "red" }, goal).score, 4 / 5, 1e-12)
    const described = { ...plain, description: "A slim fit shirt." }
    assert.strictEqual(Score.score(described, { size: "m", color: "red" }, goal).score, 1)
  })

  it("type: another type in the same branch keeps r_type 1; another category with no title word scores 0", () => {
    const h = Score.score(hoodie, { size: "m", color: "red" }, goal)
    assert.deepInclude(h, { queryMatch: false, categoryMatch: true, rType: 1 })
    assert.closeTo(h.score, 4 / 5, 1e-12, "cotton, m, red, price; not slim fit")
    const e = Score.score(headphones, { color: "red" }, goal)
    assert.deepInclude(e, { queryMatch: false, categoryMatch: false, titleScore: 0, rType: 0 })
    assert.strictEqual(e.score, 0)
    // Another category but a title that shares words: 0.5 (some words) or 1 (over 20 % of them).
    const named = { ...headphones, title: "Acme t-shirt headphones" }
    assert.strictEqual(Score.typeReward(named, goal).rType, 1)
    const oneWord = { ...headphones, title: "Acme wireless headphones" }
    assert.strictEqual(Score.typeReward(oneWord, goal).titleScore, 1 / 6, "acme of acme, slim, fit, cotton, t, shirt")
    assert.strictEqual(Score.typeReward(oneWord, goal).rType, 0.5)
  })

  it.effect("the webshop reward scores the chain's purchase: 0 when nothing was bought, else the score", () =>
    Effect.gen(function*() {
      const shop = yield* Shop.Shop
      const row = { goal }
      const before = yield* Score.webshop.evaluate({ trajectory: trajectoryOf([]), row })
      assert.strictEqual(before._tag === "Scored" && before.reward, 0)
      assert.strictEqual(before.metrics["reward/webshop/bought"], 0)
      yield* shop.act({ _tag: "search", q: "cotton t-shirt" })
      yield* shop.act({ _tag: "click", id: "bshrt" })
      yield* shop.act({ _tag: "select", o: "size: m" })
      yield* shop.act({ _tag: "buy" })
      const after = yield* Score.webshop.evaluate({ trajectory: trajectoryOf([]), row })
      assert.strictEqual(after._tag === "Scored" && after.reward, 4 / 5)
      assert.deepInclude(after.metrics, {
        "reward/webshop/bought": 1,
        "reward/webshop/acc": 0,
        "reward/webshop/r_option": 0.5,
        "reward/webshop/r_att": 1,
        "reward/webshop/r_type": 1,
        "reward/webshop/r_price": 1,
        "reward/webshop/steps": 4
      })
      const invalid = yield* Effect.flip(Score.webshop.evaluate({ trajectory: trajectoryOf([]), row: {} }))
      assert.strictEqual(invalid.reason._tag, "InvalidRow")
    }).pipe(
      Effect.provide(Shop.layer().pipe(Layer.provide(Layer.succeed(Catalog.Catalog, Catalog.make([shirt, hoodie])))))
    ))
})
