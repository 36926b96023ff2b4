/**
 * The web shop's catalogue: seeded generation of ≥ 10,000 products that follow the taxonomy's rules, the JSON Lines
 * format a user's catalogue is read in (with bad lines reported by number), and the BM25 index.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Catalog from "../../../environments/webshop/Catalog.ts"
import * as Taxonomy from "../../../environments/webshop/Taxonomy.ts"

const products = Catalog.generate(1, 10_000)

describe("webshop catalogue", () => {
  it("is seeded: the same seed gives the same products, another seed others; ids are distinct", () => {
    assert.deepStrictEqual(Catalog.generate(1, 500), products.slice(0, 500))
    assert.notStrictEqual(JSON.stringify(Catalog.generate(2, 500)), JSON.stringify(products.slice(0, 500)))
    assert.strictEqual(products.length, 10_000)
    assert.strictEqual(new Set(products.map((p) => p.id)).size, products.length)
    const types = new Set(products.map((p) => p.type))
    assert.strictEqual(types.size, Taxonomy.types.length, "every type has products")
  })

  it("follows the taxonomy: an option value names one dimension and is never an attribute", () => {
    for (const type of Taxonomy.types) {
      const values = Object.values(type.options).flat()
      assert.strictEqual(new Set(values).size, values.length, `${type.name}: a value in two dimensions`)
      const attributes = type.attributes.flatMap((slot) => slot.split("|"))
      for (const v of values) assert.notInclude(attributes, v, `${type.name}: ${v} is an option and an attribute`)
    }
    for (const p of products.slice(0, 2000)) {
      const type = Taxonomy.types.find((t) => t.name === p.type)!
      assert.isTrue(p.title.endsWith(` ${p.type}`), p.title)
      assert.isTrue(p.price > type.price[0] - 1 && p.price < type.price[1], `${p.id} price ${p.price}`)
      // One alternative per slot: "slim fit" and "relaxed fit" never both.
      for (const slot of type.attributes.filter((s) => s.includes("|"))) {
        assert.isAtMost(slot.split("|").filter((a) => p.attributes.includes(a)).length, 1, `${p.id}: ${slot}`)
      }
      for (const [dim, values] of Object.entries(p.options)) {
        assert.isAtLeast(values.length, 2)
        for (const v of values) assert.include(type.options[dim], v)
      }
    }
  })

  it.effect("JSON Lines round trip; a bad line is reported with its number, as are duplicates and empty files", () =>
    Effect.gen(function*() {
      const some = products.slice(0, 50)
      assert.deepStrictEqual(yield* Catalog.parse("p.jsonl", Catalog.toJsonl(some)), some)
      const good = JSON.stringify(products[0])
      const bad = (text: string) => Effect.flip(Catalog.parse("p.jsonl", text))
      const notJson = yield* bad(`${good}\n\n{oops\n`)
      assert.strictEqual(notJson.line, 3)
      assert.match(notJson.message, /not a product/)
      const noTitle = yield* bad(`${good}\n${JSON.stringify({ ...products[1], title: undefined })}\n`)
      assert.strictEqual(noTitle.line, 2)
      const lowerId = yield* bad(JSON.stringify({ ...products[1], id: "b-1" }))
      assert.strictEqual(lowerId.line, 1)
      const duplicate = yield* bad(`${good}\n${good}\n`)
      assert.match(duplicate.message, /duplicate id/)
      assert.strictEqual(duplicate.line, 2)
      assert.match((yield* bad("\n\n")).message, /no products/)
    }))

  it.effect("a catalogue file builds the same shop as the generated catalogue it was written from", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "webshop-catalog-"))
      writeFileSync(join(dir, "products.jsonl"), Catalog.toJsonl(products.slice(0, 300)))
      const file = (name: string) => Catalog.layer({ _tag: "File", path: join(dir, name) })
      const fromFile = yield* Effect.provide(Catalog.Catalog, file("products.jsonl"))
      const generated = Catalog.make(Catalog.generate(1, 300))
      assert.strictEqual(fromFile.size, 300)
      for (const q of ["cotton t-shirt", "wireless headphones black", "organic honey 16 oz"]) {
        assert.deepStrictEqual(fromFile.search(q, 10), generated.search(q, 10), q)
      }
      const missing = yield* Effect.flip(Effect.provide(Catalog.Catalog, file("nope")))
      assert.match(missing.message, /cannot read/)
    }))

  it("search ranks products with the query's attributes and options first", () => {
    const catalog = Catalog.make(products)
    const hits = catalog.search("waterproof hooded jacket size m color navy", 50)
    assert.strictEqual(hits.length, 50)
    const top = catalog.get(hits[0]!.id)!
    assert.strictEqual(top.type, "jacket")
    assert.includeMembers([...top.attributes], ["waterproof", "hooded"])
    assert.include(top.options["color"], "navy")
    for (let i = 1; i < hits.length; i++) assert.isAtMost(hits[i]!.score, hits[i - 1]!.score)
    assert.deepStrictEqual(catalog.search("  ", 10), [])
    assert.deepStrictEqual(catalog.search("zzzqqq", 10), [])
  })
})
