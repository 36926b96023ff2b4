import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as fc from "fast-check"
import * as Advantage from "../../src/Advantage.ts"

const close = (actual: ArrayLike<number>, expected: ArrayLike<number>, tol = 1e-9) => {
  assert.strictEqual(actual.length, expected.length)
  for (let i = 0; i < actual.length; i++) {
    assert.approximately(actual[i]!, expected[i]!, tol, `index ${i}: ${actual[i]} vs ${expected[i]}`)
  }
}

/** Outcome-only input: one reward per row on its last masked token. */
const outcome = (rewards: ReadonlyArray<number>, groups: ReadonlyArray<number>, length = 1, include?: Uint8Array) => {
  const batch = rewards.length
  const tokenRewards = new Float64Array(batch * length)
  rewards.forEach((r, b) => (tokenRewards[b * length + length - 1] = r))
  return {
    batch,
    length,
    tokenRewards,
    responseMask: new Uint8Array(batch * length).fill(1),
    groupIndex: Int32Array.from(groups),
    include
  }
}

// ----- plain reference loops, written independently of the fast paths -----

const mean = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0) / xs.length
const stdUnbiased = (xs: ReadonlyArray<number>) => {
  const m = mean(xs)
  return Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length - 1))
}

const referenceOutcome = (
  kind: "grpo" | "grpo-no-std" | "rloo",
  rewards: ReadonlyArray<number>,
  groups: ReadonlyArray<number>,
  include: ReadonlyArray<boolean>
): Array<number> =>
  rewards.map((r, i) => {
    if (!include[i]) return 0
    const peers = rewards.filter((_, j) => include[j] && groups[j] === groups[i])
    if (kind === "rloo") {
      if (peers.length === 1) return r
      const others = rewards.filter((_, j) => j !== i && include[j] && groups[j] === groups[i])
      return r - mean(others)
    }
    if (peers.length === 1) return kind === "grpo" ? r / (1 + 1e-6) : r
    return kind === "grpo" ? (r - mean(peers)) / (stdUnbiased(peers) + 1e-6) : r - mean(peers)
  })

const run = (estimator: Advantage.Estimator, input: Advantage.Input, config: Partial<Advantage.Config> = {}) =>
  Effect.runSync(Advantage.compute(estimator, input, config))

describe("Advantage", () => {
  describe("hand-checked verl examples", () => {
    it("grpo: group [1, 0, 1, 0] gives ±0.5 / sqrt(1/3)", () => {
      const { advantages } = run("grpo", outcome([1, 0, 1, 0], [0, 0, 0, 0]))
      const a = 0.5 / (Math.sqrt(1 / 3) + 1e-6)
      close(advantages, [a, -a, a, -a])
    })

    it("grpo: a group of one has mean 0 and std 1 (verl)", () => {
      const { advantages } = run("grpo", outcome([0.7], [3]))
      close(advantages, [0.7 / (1 + 1e-6)])
    })

    it("grpo-no-std (Dr.GRPO): rewards minus the group mean", () => {
      const { advantages } = run("grpo-no-std", outcome([1, 0, 0, 3, 5], [0, 0, 0, 1, 1]))
      close(advantages, [2 / 3, -1 / 3, -1 / 3, -1, 1])
    })

    it("rloo: r·n/(n−1) − mean·n/(n−1) equals r minus the mean of the others", () => {
      const { advantages } = run("rloo", outcome([1, 0, 0], [0, 0, 0]))
      close(advantages, [1, -0.5, -0.5])
    })

    it("reinforce++: discounted returns whitened over the batch", () => {
      // rows [0,0,1] and [0,0,0], γ = 1 → returns 1,1,1 / 0,0,0 → mean 0.5, unbiased var 0.3
      const input = outcome([1, 0], [0, 1], 3)
      const { advantages, returns } = run("reinforce++", input)
      close(returns, [1, 1, 1, 0, 0, 0])
      const a = 0.5 / Math.sqrt(0.3 + 1e-8)
      close(advantages, [a, a, a, -a, -a, -a])
    })

    it("reinforce++: γ < 1 discounts and a masked token resets the return", () => {
      const input = {
        ...outcome([0, 0], [0, 1], 3),
        tokenRewards: Float64Array.of(1, 0, 2, 0, 0, 4),
        responseMask: Uint8Array.of(1, 0, 1, 1, 1, 1)
      }
      const { returns } = run("reinforce++", input, { gamma: 0.5 })
      // row 0: t2 = 2; t1 = 0 + 0.5·2 = 1, then reset (mask 0); t0 = 1
      close(returns, [1, 1, 2, 1, 2, 4])
    })

    it("reinforce++-baseline: group-centred scores whitened over response tokens", () => {
      const input = outcome([1, 0], [0, 0], 2)
      const { advantages } = run("reinforce++-baseline", input)
      // centred 0.5, 0.5, −0.5, −0.5 → mean 0, unbiased var 1/3
      const a = 0.5 / Math.sqrt(1 / 3 + 1e-8)
      close(advantages, [a, a, -a, -a])
    })

    it("gae: TD(λ) by hand, and observation tokens are skipped", () => {
      const plain = run("gae", {
        batch: 1,
        length: 2,
        tokenRewards: Float64Array.of(0, 1),
        responseMask: Uint8Array.of(1, 1),
        groupIndex: Int32Array.of(0),
        values: Float64Array.of(0.5, 0.2)
      })
      // t1: δ = 1 − 0.2 = 0.8; t0: δ = 0.2 − 0.5 = −0.3, A = −0.3 + 0.8 = 0.5; returns = A + V = [1, 1]
      close(plain.returns, [1, 1])
      const w = 0.15 / Math.sqrt(0.045 + 1e-8)
      close(plain.advantages, [-w, w])
      const withObservation = run("gae", {
        batch: 1,
        length: 3,
        tokenRewards: Float64Array.of(0, 0, 1),
        responseMask: Uint8Array.of(1, 0, 1),
        groupIndex: Int32Array.of(0),
        values: Float64Array.of(0.5, 9, 0.2)
      })
      close(withObservation.advantages, [-w, 0, w])
    })

    it("gae: γ and λ below 1", () => {
      const { returns } = run("gae", {
        batch: 1,
        length: 2,
        tokenRewards: Float64Array.of(0, 1),
        responseMask: Uint8Array.of(1, 1),
        groupIndex: Int32Array.of(0),
        values: Float64Array.of(0.5, 0.2)
      }, { gamma: 0.9, lambda: 0.5 })
      // t1: δ = 0.8, A1 = 0.8; t0: δ = 0.9·0.2 − 0.5 = −0.32, A0 = −0.32 + 0.45·0.8 = 0.04
      close(returns, [0.54, 1])
    })
  })

  describe("exclusion of not-applicable and masked trajectories", () => {
    it("an excluded row gets 0 and does not move its group's baseline", () => {
      for (const estimator of ["grpo", "grpo-no-std", "rloo", "reinforce++-baseline"] as const) {
        const withExcluded = run(estimator, outcome([1, 0, 100], [0, 0, 0], 1, Uint8Array.of(1, 1, 0)))
        const without = run(estimator, outcome([1, 0], [0, 0]))
        close(withExcluded.advantages, [...without.advantages, 0])
      }
    })

    it("an excluded row does not enter batch whitening (reinforce++, gae)", () => {
      const withExcluded = run("reinforce++", outcome([1, 0, 50], [0, 1, 2], 2, Uint8Array.of(1, 1, 0)))
      const without = run("reinforce++", outcome([1, 0], [0, 1], 2))
      close(withExcluded.advantages, [...without.advantages, 0, 0])
    })
  })

  describe("against plain reference loops", () => {
    const arbitraryBatch = fc.array(
      fc.record({
        reward: fc.double({ min: -5, max: 5, noNaN: true }),
        group: fc.integer({ min: 0, max: 3 }),
        include: fc.boolean()
      }),
      { minLength: 1, maxLength: 24 }
    )

    for (const kind of ["grpo", "grpo-no-std", "rloo"] as const) {
      it(`${kind} equals the reference loop`, () =>
        fc.assert(fc.property(arbitraryBatch, (rows) => {
        const rewards = rows.map((r) => r.reward)
        const groups = rows.map((r) => r.group)
        const include = rows.map((r) => r.include)
        const { advantages } = run(kind, outcome(rewards, groups, 1, Uint8Array.from(include, Number)))
        close(advantages, referenceOutcome(kind, rewards, groups, include), 1e-6)
      })))
    }

    it("grpo-no-std advantages sum to zero within every group of two or more", () =>
      fc.assert(fc.property(arbitraryBatch, (rows) => {
      const { advantages } = run("grpo-no-std", outcome(rows.map((r) => r.reward), rows.map((r) => r.group)))
      for (let g = 0; g < 4; g++) {
        const members = rows.flatMap((r, i) => (r.group === g ? [advantages[i]!] : []))
        if (members.length > 1) assert.approximately(members.reduce((a, b) => a + b, 0), 0, 1e-9)
      }
    })))

    it("gae with γ = λ = 1 and zero values gives reward-to-go returns", () =>
      fc.assert(fc.property(
      fc.array(fc.double({ min: -2, max: 2, noNaN: true }), { minLength: 2, maxLength: 16 }),
      (rewards) => {
        const length = rewards.length
        const input = {
          batch: 1,
          length,
          tokenRewards: Float64Array.from(rewards),
          responseMask: new Uint8Array(length).fill(1),
          groupIndex: Int32Array.of(0),
          values: new Float64Array(length)
        }
        const { returns } = run("gae", input)
        const toGo = rewards.map((_, t) => rewards.slice(t).reduce((a, b) => a + b, 0))
        close(returns, toGo, 1e-9)
      }
    )))
  })

  describe("bad input", () => {
    it.effect("unknown estimator, shape mismatch, missing values and NaN rewards are typed errors", () =>
      Effect.gen(function*() {
        const good = outcome([1, 0], [0, 0])
        const unknown = yield* Effect.flip(Advantage.compute("ppo" as Advantage.Estimator, good))
        assert.strictEqual(unknown.reason, "UnknownEstimator")
        const shape = yield* Effect.flip(Advantage.compute("grpo", { ...good, groupIndex: Int32Array.of(0) }))
        assert.strictEqual(shape.reason, "ShapeMismatch")
        const values = yield* Effect.flip(Advantage.compute("gae", good))
        assert.strictEqual(values.reason, "MissingValues")
        const nan = yield* Effect.flip(Advantage.compute("grpo", { ...good, tokenRewards: Float64Array.of(1, NaN) }))
        assert.strictEqual(nan.reason, "NotFinite")
      }))
  })
})
