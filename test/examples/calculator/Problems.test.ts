import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as fc from "fast-check"
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import * as Generate from "../../../examples/calculator/generate.ts"
import * as Problems from "../../../examples/calculator/Problems.ts"
import * as ModelConfig from "../../../src/model/ModelConfig.ts"
import * as Dataset from "../../../src/Dataset.ts"
import * as TrainConfig from "../../../src/TrainConfig.ts"

describe("calculator task", () => {
  it("evaluates with precedence and rejects anything outside the grammar", () => {
    assert.strictEqual(Problems.evaluate("25-31*86"), -2641)
    assert.strictEqual(Problems.evaluate("99*46*89"), 405306)
    assert.strictEqual(Problems.evaluate("78-45+33"), 66)
    for (const bad of ["", "1+", "(1+2)", "1/2", "2**3", "1 + 2", "-3"]) assert.isUndefined(Problems.evaluate(bad))
  })

  it("evaluate agrees with JavaScript arithmetic on generated expressions", () => {
    fc.assert(fc.property(fc.integer(), (seed) => {
      const row = Problems.question(Problems.rng(seed))
      assert.strictEqual(Problems.evaluate(row.expression), Function(`return ${row.expression}`)())
      assert.strictEqual(row.answer, String(Problems.evaluate(row.expression)))
      const operands = row.expression.split(/[+\-*]/).map(Number)
      assert.isTrue(operands.length === 2 || operands.length === 3)
      for (const n of operands) assert.isTrue(n >= 1 && n <= 99)
      assert.include(row.question, row.expression)
    }), { numRuns: 300 })
  })

  it("sums: six two-digit numbers added, in one shape, with the sum as the answer", () => {
    fc.assert(fc.property(fc.integer(), (seed) => {
      const row = Problems.question(Problems.rng(seed), "sums")
      const operands = row.expression.split("+").map(Number)
      assert.strictEqual(operands.length, 6)
      for (const n of operands) assert.isTrue(n >= 10 && n <= 99)
      assert.strictEqual(row.answer, String(operands.reduce((a, b) => a + b, 0)))
      assert.strictEqual(row.question, `What is ${row.expression}?`)
    }), { numRuns: 300 })
    const sums = Problems.splits({ seed: 7, train: 200, heldOut: 50, kind: "sums" })
    assert.notDeepEqual(sums.heldOut, Problems.splits({ seed: 7, train: 200, heldOut: 50 }).heldOut)
    assert.isFalse(sums.train.some((r) => sums.heldOut.some((h) => h.expression === r.expression)))
  })

  it("splits are seeded, sized as asked and have disjoint expressions", () => {
    const a = Problems.splits({ seed: 7, train: 500, heldOut: 100, validation: 60, demos: 300 })
    const b = Problems.splits({ seed: 7, train: 500, heldOut: 100, validation: 60, demos: 300 })
    assert.deepStrictEqual(a, b)
    assert.notDeepEqual(Problems.splits({ seed: 8, train: 500, heldOut: 100 }).heldOut, a.heldOut)
    const held = new Set(a.heldOut.map((r) => r.expression))
    const train = new Set(a.train.map((r) => r.expression))
    assert.strictEqual(held.size, 100)
    assert.strictEqual(train.size, 500)
    assert.strictEqual(new Set(a.validation.map((r) => r.expression)).size, 60)
    assert.isFalse(a.train.some((r) => held.has(r.expression)))
    const validation = new Set(a.validation.map((r) => r.expression))
    assert.isFalse(a.validation.some((r) => held.has(r.expression) || train.has(r.expression)))
    assert.strictEqual(new Set(a.demos.map((r) => r.expression)).size, 300)
    assert.isFalse(
      a.demos.some((r) => held.has(r.expression) || train.has(r.expression) || validation.has(r.expression)),
      "demonstrations are on questions of their own"
    )
    // The held-out split does not depend on the train size, and neither depends on the validation size.
    assert.deepStrictEqual(Problems.splits({ seed: 7, train: 50, heldOut: 100 }).heldOut, a.heldOut)
    const without = Problems.splits({ seed: 7, train: 500, heldOut: 100, validation: 60 })
    assert.deepStrictEqual([without.heldOut, without.train, without.validation], [a.heldOut, a.train, a.validation])
    assert.deepStrictEqual(without.demos, [])
  })

  it("noisy demonstrations keep the tool call and result, and change only the final answer", () => {
    const { train } = Problems.splits({ seed: 3, train: 400, heldOut: 10 })
    const demos = Generate.demonstrations(train, { seed: 3, noise: 0.5 })
    let corrupted = 0
    demos.forEach((demo, i) => {
      const gold = Problems.demonstration(train[i]!, i)
      assert.deepStrictEqual(demo.messages.slice(0, 4), gold.messages.slice(0, 4))
      const final = String(demo.messages[4]!.content)
      const m = /^The answer is (-?\d+)\.$/.exec(final)
      assert.isNotNull(m)
      if (m![1] !== train[i]!.answer) {
        corrupted++
        assert.strictEqual(m![1]!.length, train[i]!.answer.length)
        assert.isFalse(/^-?0\d/.test(m![1]!), "no leading zero")
      }
    })
    assert.isTrue(corrupted > 150 && corrupted < 250, `about half corrupted, got ${corrupted}`)
    assert.deepStrictEqual(Generate.demonstrations(train, { seed: 3, noise: 0 }), train.map(Problems.demonstration))
  })

  it.effect("the shipped configs decode, with the warm-up's validation split beside the other data files", () =>
    Effect.gen(function*() {
      for (const name of ["demo", "full"]) {
        const config = yield* TrainConfig.load(join(import.meta.dirname, `../../../examples/calculator/${name}.json`))
        // A context past the preset's positions fails the run at start.
        assert.strictEqual(config.model.preset, "tiny")
        assert.isAtMost(
          config.agent.maxContextTokens ?? ModelConfig.presets.tiny.maxPositionEmbeddings,
          ModelConfig.presets.tiny.maxPositionEmbeddings,
          name
        )
        const stopAt = config.warmup?.stopAt
        assert.isDefined(stopAt, name)
        assert.strictEqual(dirname(stopAt!.data), dirname(config.data.train))
        assert.strictEqual(basename(stopAt!.data), "validation.jsonl")
        assert.notStrictEqual(stopAt!.data, config.data.eval, "the stopping check never reads the held-out split")
      }
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("writes files that Dataset reads back: rows with answers, demonstrations with a tool call", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "calc-"))
      const counts = yield* Generate.write({
        dir,
        seed: 1,
        train: 50,
        heldOut: 20,
        validation: 10,
        demos: 30,
        noise: 0
      })
      assert.deepStrictEqual(counts, { train: 50, heldOut: 20, validation: 10, demos: 30 })
      assert.strictEqual((yield* Dataset.load(join(dir, "validation.jsonl"))).rows.length, 10)
      const train = yield* Dataset.load(join(dir, "train.jsonl"))
      assert.strictEqual(train.rows.length, 50)
      assert.deepStrictEqual(Object.keys(train.rows[0]!.fields).sort(), ["answer", "expression"])
      const demos = yield* Dataset.load(join(dir, "demos.jsonl"), { kind: "conversation" })
      assert.strictEqual(demos.rows.length, 30)
      const call = demos.rows[0]!.messages![2]!
      assert.strictEqual(call.role, "assistant")
      const question = String(demos.rows[0]!.messages![1]!.content)
      const args = call.role === "assistant" ? call.tool_calls![0]!.function.arguments as Record<string, unknown> : {}
      const expression = args["expression"]
      assert.include(question, String(expression), "the call's expression is the question's")
      assert.isFalse(train.rows.some((r) => r.fields["expression"] === expression), "a question RL does not see")
      const before = readFileSync(join(dir, "train.jsonl"), "utf8")
      yield* Generate.write({ dir, seed: 1, train: 50, heldOut: 20, validation: 10, demos: 30, noise: 0 })
      assert.strictEqual(readFileSync(join(dir, "train.jsonl"), "utf8"), before, "byte-identical for a seed")
      const bad = yield* Effect.flip(
        Generate.write({ dir, seed: 1, train: 5, heldOut: 2, validation: 0, demos: 0, noise: 0, kind: "sum" })
      )
      assert.include(String(bad), "unknown kind sum (known: mixed, sums)")
    }).pipe(Effect.provide(NodeServices.layer)))
})
