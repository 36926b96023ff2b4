import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import * as Sampling from "../../src/Sampling.ts"

const logits = Float32Array.from([1.5, -0.5, 3.0, 0.2, 2.9, -4])

describe("Sampling", () => {
  it("greedy picks the argmax with the plain log-softmax", () => {
    const s = Sampling.sample(logits, { temperature: 0 }, Sampling.rng(1))
    assert.strictEqual(s.tokenId, 2)
    assert.closeTo(s.logprob, Sampling.logSoftmax(logits)[2]!, 1e-12)
  })

  it("sampling frequencies follow softmax(logits / temperature), and logprobs are taken at that temperature", () => {
    const t = 0.7, r = Sampling.rng(123), counts = new Array<number>(logits.length).fill(0), n = 40_000
    const expected = Sampling.logSoftmax(logits, t)
    for (let i = 0; i < n; i++) {
      const s = Sampling.sample(logits, { temperature: t }, r)
      counts[s.tokenId]!++
      assert.closeTo(s.logprob, expected[s.tokenId]!, 1e-9)
    }
    expected.forEach((lp, i) => {
      const p = Math.exp(lp), sd = Math.sqrt((p * (1 - p)) / n)
      assert.closeTo(counts[i]! / n, p, 5 * sd + 1e-4, `token ${i}`)
    })
  })

  it("an engine's log-sum-exp of the row is the normaliser at temperatures 0 and 1, ignored at any other", () => {
    const lse = Sampling.logSumExp(logits)
    for (const temperature of [0, 1, 0.7]) {
      for (let seed = 0; seed < 20; seed++) {
        const plain = Sampling.sample(logits, { temperature }, Sampling.rng(seed))
        assert.deepStrictEqual(Sampling.sample(logits, { temperature }, Sampling.rng(seed), lse), plain)
      }
    }
    // A visibly different normaliser: where it is used, the logprob moves by it.
    const greedy = Sampling.sample(logits, { temperature: 0 }, Sampling.rng(3), lse + 0.25)
    assert.closeTo(greedy.logprob, Sampling.sample(logits, { temperature: 0 }, Sampling.rng(3)).logprob - 0.25, 1e-12)
    const warm = Sampling.sample(logits, { temperature: 0.7 }, Sampling.rng(3), lse + 0.25)
    assert.deepStrictEqual(warm, Sampling.sample(logits, { temperature: 0.7 }, Sampling.rng(3)))
  })

  it("top-k and top-p restrict the support but not the reported logprob", () => {
    const r = Sampling.rng(5)
    const seen = new Set<number>()
    for (let i = 0; i < 2000; i++) seen.add(Sampling.sample(logits, { temperature: 1, topK: 2 }, r).tokenId)
    assert.deepStrictEqual([...seen].sort(), [2, 4])
    const nucleus = new Set<number>()
    // p(2) ≈ 0.43, p(4) ≈ 0.39: top-p 0.5 keeps exactly those two
    for (let i = 0; i < 2000; i++) nucleus.add(Sampling.sample(logits, { temperature: 1, topP: 0.5 }, r).tokenId)
    assert.deepStrictEqual([...nucleus].sort(), [2, 4])
    const s = Sampling.sample(logits, { temperature: 1, topK: 1 }, r)
    assert.strictEqual(s.tokenId, 2)
    assert.closeTo(s.logprob, Sampling.logSoftmax(logits)[2]!, 1e-12)
  })

  it("a seed fixes the stream; different seeds differ", () => {
    const draw = (seed: number) => Array.from({ length: 8 }, ((r) => () => r.next())(Sampling.rng(seed)))
    assert.deepStrictEqual(draw(9), draw(9))
    assert.notDeepEqual(draw(9), draw(10))
    assert.notDeepEqual(draw(2 ** 40), draw(0))
  })

  it("property: every sample is a valid token with a logprob ≤ 0 inside the top-k set", () => {
    fc.assert(fc.property(
      fc.array(fc.float({ min: -20, max: 20, noNaN: true }), { minLength: 1, maxLength: 50 }),
      fc.double({ min: 0.05, max: 3, noNaN: true }),
      fc.integer({ min: 0, max: 60 }),
      fc.double({ min: 0, max: 1, noNaN: true }),
      fc.integer(),
      (row, temperature, topK, topP, seed) => {
        const s = Sampling.sample(row, { temperature, topK, topP }, Sampling.rng(seed))
        assert.isTrue(Number.isInteger(s.tokenId) && s.tokenId >= 0 && s.tokenId < row.length)
        assert.isAtMost(s.logprob, 1e-9)
        if (topK > 0) assert.isBelow(row.filter((v) => v > row[s.tokenId]!).length, topK)
      }
    ))
  })
})
