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

    it("reinforce++: γ < 1 discounts policy tokens; an observation between turns carries the return through", () => {
      const input = {
        ...outcome([0, 0], [0, 1], 3),
        tokenRewards: Float64Array.of(1, 0, 2, 0, 0, 4),
        responseMask: Uint8Array.of(1, 0, 1, 1, 1, 1)
      }
      const { returns } = run("reinforce++", input, { gamma: 0.5 })
      // row 0: t2 = 2; t1 is an observation (0, skipped); t0 = 1 + 0.5·2 = 2
      close(returns, [2, 0, 2, 1, 2, 4])
    })

    it("reinforce++: the outcome reward reaches the first turn of a multi-turn trajectory", () => {
      // [call, call, tool reply, tool reply, answer, answer] with reward 1 at the end, and a row that earned 0: the
      // call's tokens get the same advantage as the answer's (verl issue #7278 gave them a return of 0).
      const input = {
        ...outcome([1, 0], [0, 1], 6),
        responseMask: Uint8Array.of(1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1)
      }
      const { advantages, returns } = run("reinforce++", input)
      close(returns, [1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0])
      const a = 0.5 / Math.sqrt(2 / 7 + 1e-8)
      close(advantages, [a, a, 0, 0, a, a, -a, -a, 0, 0, -a, -a])
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

  describe("token-level estimators against reference loops", () => {
    /** Whitening written plainly: mean and Bessel-corrected variance of the masked values. */
    const whiten = (values: ReadonlyArray<number>, mask: ReadonlyArray<number>) => {
      const xs = values.filter((_, i) => mask[i] === 1)
      const m = mean(xs)
      const v = xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length > 1 ? xs.length - 1 : 1)
      return values.map((x, i) => (mask[i] === 1 ? (x - m) / Math.sqrt(v + 1e-8) : 0))
    }
    const arbitraryRows = fc.record({
      length: fc.integer({ min: 1, max: 6 }),
      rows: fc.array(
        fc.record({
          group: fc.integer({ min: 0, max: 2 }),
          include: fc.boolean(),
          cells: fc.array(
            fc.record({
              r: fc.double({ min: -2, max: 2, noNaN: true }),
              m: fc.boolean(),
              v: fc.double({ min: -1, max: 1, noNaN: true })
            }),
            { minLength: 6, maxLength: 6 }
          )
        }),
        { minLength: 2, maxLength: 6 }
      ),
      gamma: fc.double({ min: 0.5, max: 1, noNaN: true }),
      lambda: fc.double({ min: 0.5, max: 1, noNaN: true })
    })
    const toInput = (x: typeof arbitraryRows extends fc.Arbitrary<infer A> ? A : never): Advantage.Input => {
      const { length, rows } = x
      return {
        batch: rows.length,
        length,
        tokenRewards: Float64Array.from(rows.flatMap((row) => row.cells.slice(0, length).map((c) => c.r))),
        responseMask: Uint8Array.from(rows.flatMap((row) => row.cells.slice(0, length).map((c) => (c.m ? 1 : 0)))),
        groupIndex: Int32Array.from(rows.map((row) => row.group)),
        include: Uint8Array.from(rows.map((row) => (row.include ? 1 : 0))),
        values: Float64Array.from(rows.flatMap((row) => row.cells.slice(0, length).map((c) => c.v)))
      }
    }
    const effectiveMask = (input: Advantage.Input) =>
      Array.from(input.responseMask, (m, i) => (m === 1 && input.include![Math.floor(i / input.length)] === 1 ? 1 : 0))

    it("reinforce++ equals discounted returns over response tokens (observations skipped) whitened", () =>
      fc.assert(fc.property(arbitraryRows, (x) => {
        const input = toInput(x)
        const mask = effectiveMask(input)
        const returns: Array<number> = []
        for (let b = 0; b < input.batch; b++) {
          const row: Array<number> = []
          let g = 0
          for (let t = input.length - 1; t >= 0; t--) {
            const i = b * input.length + t
            if (input.responseMask[i] === 1) g = input.tokenRewards[i]! + x.gamma * g
            row.unshift(input.responseMask[i] === 1 ? g : 0)
          }
          returns.push(...row)
        }
        const out = run("reinforce++", input, { gamma: x.gamma })
        close(out.returns, returns, 1e-9)
        close(out.advantages, whiten(returns, mask), 1e-6)
      })))

    it("reinforce++-baseline equals group-centred scores whitened over included response tokens", () =>
      fc.assert(fc.property(arbitraryRows, (x) => {
        const input = toInput(x)
        const mask = effectiveMask(input)
        const scores = x.rows.map((row) => row.cells.slice(0, x.length).reduce((a, c) => a + c.r, 0))
        const centred = scores.map((s, b) => {
          const peers = scores.filter((_, j) => x.rows[j]!.include && x.rows[j]!.group === x.rows[b]!.group)
          return s - (peers.length > 1 ? mean(peers) : 0)
        })
        const broadcastScores = Array.from(mask, (m, i) => (m === 1 ? centred[Math.floor(i / x.length)]! : 0))
        close(run("reinforce++-baseline", input).advantages, whiten(broadcastScores, mask), 1e-6)
      })))

    it("gae equals plain GAE over each row's response tokens only (observation tokens skipped)", () =>
      fc.assert(fc.property(arbitraryRows, (x) => {
        const input = toInput(x)
        const mask = effectiveMask(input)
        const raw = new Array<number>(input.batch * input.length).fill(0)
        for (let b = 0; b < input.batch; b++) {
          // compress to the response positions, run textbook GAE, scatter back
          const idx = Array.from({ length: input.length }, (_, t) => b * input.length + t).filter((i) => mask[i] === 1)
          let next = 0
          let adv = 0
          for (let k = idx.length - 1; k >= 0; k--) {
            const i = idx[k]!
            const delta = input.tokenRewards[i]! + x.gamma * next - input.values![i]!
            adv = delta + x.gamma * x.lambda * adv
            next = input.values![i]!
            raw[i] = adv
          }
        }
        close(run("gae", input, { gamma: x.gamma, lambda: x.lambda }).advantages, whiten(raw, mask), 1e-6)
      })))
  })

  describe("bad input", () => {
    it.effect("unknown estimator, shape mismatch, missing values and NaN rewards are typed errors", () =>
      Effect.gen(function*() {
        const good = outcome([1, 0], [0, 0])
        const unknown = yield* Effect.flip(Advantage.compute("ppo" as Advantage.Estimator, good))
        assert.strictEqual(unknown.reason._tag, "UnknownEstimator")
        assert.include(unknown.reason._tag === "UnknownEstimator" ? unknown.reason.known : [], "grpo")
        const shape = yield* Effect.flip(Advantage.compute("grpo", { ...good, groupIndex: Int32Array.of(0) }))
        assert.strictEqual(shape.reason._tag, "ShapeMismatch")
        const values = yield* Effect.flip(Advantage.compute("gae", good))
        assert.strictEqual(values.reason._tag, "MissingValues")
        const nan = yield* Advantage.compute("grpo", { ...good, tokenRewards: Float64Array.of(1, NaN) }).pipe(
          Effect.as(undefined),
          Effect.catchReason("AdvantageError", "NotFinite", ({ array, index }) => Effect.succeed({ array, index }))
        )
        assert.deepStrictEqual(nan, { array: "tokenRewards", index: 1 })
      }))
  })
})
