/**
 * One visit to the shop, action by action: compact pages, WebShop's navigation (results pages, items, back), option
 * selection, the purchase that ends the visit, refused actions that leave the page as it was, and the step limit.
 * Then the task's provider: every chain its own visit, none left open once the chains end.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import * as Catalog from "../../../environments/webshop/Catalog.ts"
import * as Goal from "../../../environments/webshop/Goal.ts"
import * as Shop from "../../../environments/webshop/Shop.ts"

const products = Catalog.generate(1, 10_000)
const catalog = Catalog.make(products)
const settings = Shop.defaultSettings

const run = (state: Shop.State, action: Shop.Action) => Shop.act(state, catalog, settings, action)
const text = (outcome: Shop.Outcome) => (outcome.ok ? outcome.text : `refused: ${outcome.error}`)
const bytes = (s: string) => Buffer.byteLength(s, "utf8")

describe("webshop visit", () => {
  it("pages stay within a few hundred bytes", () => {
    const { rows } = Goal.splits(products, 3, { rows: 200 })
    let longest = 0
    for (const row of rows) {
      const state = Shop.initial()
      const results = text(run(state, { _tag: "search", q: row.question }))
      const item = text(run(state, { _tag: "click", id: state.hits[0]! }))
      assert.match(item, /\n\[buy\] \[back\]$/)
      longest = Math.max(longest, bytes(results), bytes(item))
    }
    assert.isAtMost(longest, 300)
  })

  it("search, pages, an item, options, buy: WebShop's navigation", () => {
    const state = Shop.initial()
    const results = run(state, { _tag: "search", q: "waterproof hooded jacket navy" })
    assert.isTrue(results.ok)
    const lines = text(results).split("\n")
    assert.match(lines[0]!, /^page 1\/17$/, "50 results, 3 a page")
    assert.lengthOf(lines, 5)
    assert.match(lines[1]!, /^\[B[A-Z0-9]{4}\] .+ jacket \$\d+\.\d\d$/)
    assert.strictEqual(lines[4], "[next]")
    assert.strictEqual(text(run(state, { _tag: "click", id: "next" })).split("\n")[4], "[prev] [next]")
    assert.match(text(run(state, { _tag: "click", id: "prev" })), /^page 1\/17\n/)
    const id = state.hits[1]!
    // Ids are case-insensitive and may keep their brackets.
    const item = text(run(state, { _tag: "click", id: `[${id.toLowerCase()}]` }))
    const product = catalog.get(id)!
    assert.strictEqual(state.page, "item")
    assert.include(item, product.attributes.join(", "))
    const [dim, values] = Object.entries(product.options)[0]!
    assert.include(item, `${dim}: ${values.join(", ")}`)
    assert.strictEqual(text(run(state, { _tag: "select", o: values[0]! })), `${dim}: ${values[0]}`)
    assert.strictEqual(text(run(state, { _tag: "select", o: `${dim}: ${values[1]}` })), `${dim}: ${values[1]}`)
    assert.deepStrictEqual(state.selected, { [dim]: values[1] })
    assert.strictEqual(text(run(state, { _tag: "buy" })), `bought ${id}, ${dim}: ${values[1]}`)
    assert.deepStrictEqual(state.purchase, { product, options: { [dim]: values[1]! } })
    assert.strictEqual(Shop.ended(state, settings), "bought")
    assert.match(text(run(state, { _tag: "search", q: "hat" })), /^refused: the order is placed/)
  })

  it("refused actions say why and leave the page as it was; back goes up a level", () => {
    const state = Shop.initial()
    const roomy = { ...settings, maxSteps: 50 }
    const run = (state: Shop.State, action: Shop.Action) => Shop.act(state, catalog, roomy, action)
    assert.match(text(run(state, { _tag: "click", id: "B0000" })), /^refused: nothing to click yet: search first/)
    assert.match(text(run(state, { _tag: "select", o: "m" })), /^refused: no item open/)
    assert.match(text(run(state, { _tag: "buy" })), /^refused: no item open/)
    assert.match(text(run(state, { _tag: "search", q: "   " })), /^refused: search needs words/)
    run(state, { _tag: "search", q: "cotton t-shirt" })
    const page = { ...state }
    assert.match(text(run(state, { _tag: "click", id: "BNOPE" })), /^refused: "BNOPE" is not on this page/)
    assert.match(text(run(state, { _tag: "click", id: "prev" })), /^refused: no prev page/)
    assert.match(text(run(state, { _tag: "click", id: state.hits[5]! })), /is not on this page/, "results of page 2")
    assert.deepStrictEqual({ ...state, steps: 0 }, { ...page, steps: 0 })
    run(state, { _tag: "click", id: state.hits[0]! })
    assert.match(text(run(state, { _tag: "click", id: "next" })), /^refused: "next" is not a button here/)
    assert.match(text(run(state, { _tag: "select", o: "purple" })), /^refused: no option "purple" \(size: .*; color: /)
    assert.match(text(run(state, { _tag: "click", id: "back" })), /^page 1\//)
    assert.strictEqual(state.page, "results")
    assert.strictEqual(text(run(state, { _tag: "click", id: "back" })), "start page: search")
    assert.strictEqual(state.page, "start")
    assert.strictEqual(text(run(state, { _tag: "search", q: "zzqqxx" })), `no results for "zzqqxx" [back]`)
  })

  it("the step limit counts every action, refused ones too, and ends the visit", () => {
    const limited = { ...settings, maxSteps: 3 }
    const state = Shop.initial()
    Shop.act(state, catalog, limited, { _tag: "buy" })
    Shop.act(state, catalog, limited, { _tag: "search", q: "mug" })
    assert.strictEqual(Shop.ended(state, limited), undefined)
    Shop.act(state, catalog, limited, { _tag: "click", id: state.hits[0]! })
    assert.strictEqual(Shop.ended(state, limited), "out_of_steps")
    const after = Shop.act(state, catalog, limited, { _tag: "buy" })
    assert.deepStrictEqual(after, { ok: false, error: "no steps left (3 per visit)" })
    assert.isUndefined(state.purchase)
  })

  it.effect("the provider gives every chain its own visit and counts them open until the chains end", () =>
    Effect.gen(function*() {
      const provider = yield* Shop.provider(settings)
      const a = yield* Scope.make()
      const b = yield* Scope.make()
      const shopA = Context.get(yield* Scope.provide(provider.acquire({ chainId: "a", groupId: "g" }), a), Shop.Shop)
      const shopB = Context.get(yield* Scope.provide(provider.acquire({ chainId: "b", groupId: "g" }), b), Shop.Shop)
      yield* shopA.act({ _tag: "search", q: "wireless mouse" })
      const opened = yield* shopA.act({ _tag: "click", id: (yield* shopA.state).hits[0]! })
      assert.match(opened, /mouse/)
      // The other chain has searched nothing: its visit is still on the start page.
      assert.strictEqual((yield* shopB.state).page, "start")
      const refused = yield* Effect.flip(shopB.act({ _tag: "buy" }))
      assert.deepInclude(refused, { _tag: "EnvError", env: "webshop", method: "buy" })
      assert.strictEqual(refused.reason._tag, "InvalidAction")
      assert.deepStrictEqual(yield* provider.stats!, { "env/webshop/visits": 2, "env/webshop/open": 2 })
      yield* Scope.close(a, Exit.void)
      assert.deepStrictEqual(yield* provider.stats!, { "env/webshop/visits": 2, "env/webshop/open": 1 })
      yield* Scope.close(b, Exit.void)
      assert.deepStrictEqual(yield* provider.stats!, { "env/webshop/visits": 2, "env/webshop/open": 0 })
    }).pipe(Effect.provide(Layer.succeed(Catalog.Catalog, catalog))))
})
