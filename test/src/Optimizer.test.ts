import { assert, describe, it } from "@effect/vitest"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as Optimizer from "../../src/Optimizer.ts"

describe("Optimizer", () => {
  it("AdamW: the first step moves each weight by lr·sign(g) (bias correction), plus decoupled decay", () => {
    const params = new Map([["w", Float32Array.of(1, -2, 0.5)], ["norm.weight", Float32Array.of(1)]])
    const grads = new Map([["w", Float32Array.of(0.3, -4, 0)], ["norm.weight", Float32Array.of(2)]])
    const state = Optimizer.makeState(params)
    const config = { beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.1 }
    Optimizer.step(params, grads, state, 0.01, config)
    const w = params.get("w")!
    // m̂ = g, v̂ = g² → update lr·g/|g|; decay multiplies by (1 − lr·λ) first
    assert.approximately(w[0]!, 1 * (1 - 0.001) - 0.01, 1e-6)
    assert.approximately(w[1]!, -2 * (1 - 0.001) + 0.01, 1e-6)
    assert.approximately(w[2]!, 0.5 * (1 - 0.001), 1e-6)
    assert.approximately(params.get("norm.weight")![0]!, 1 - 0.01, 1e-6) // norms are not decayed
    assert.strictEqual(state.step, 1)
  })

  it("AdamW matches a plain reference loop over several steps", () => {
    const n = 50
    const p = Float32Array.from({ length: n }, (_, i) => Math.sin(i))
    const ref = Array.from(p)
    const params = new Map([["w", p]])
    const state = Optimizer.makeState(params)
    const cfg = { beta1: 0.9, beta2: 0.98, eps: 1e-8, weightDecay: 0.01 }
    const m = new Array(n).fill(0)
    const v = new Array(n).fill(0)
    for (let t = 1; t <= 5; t++) {
      const g = Float32Array.from({ length: n }, (_, i) => Math.cos(i * t) * 0.1)
      Optimizer.step(params, new Map([["w", g]]), state, 1e-2, cfg)
      for (let i = 0; i < n; i++) {
        m[i] = 0.9 * m[i] + 0.1 * g[i]!
        v[i] = 0.98 * v[i] + 0.02 * g[i]! * g[i]!
        const mHat = m[i] / (1 - 0.9 ** t)
        const vHat = v[i] / (1 - 0.98 ** t)
        ref[i] = ref[i]! * (1 - 1e-2 * 0.01) - (1e-2 * mHat) / (Math.sqrt(vHat) + 1e-8)
      }
    }
    for (let i = 0; i < n; i++) assert.approximately(p[i]!, ref[i]!, 1e-5)
  })

  it("is deterministic: the same inputs give bit-identical weights", () => {
    const run = () => {
      const params = new Map([["a", Float32Array.from({ length: 64 }, (_, i) => i / 64)]])
      const state = Optimizer.makeState(params)
      for (let t = 0; t < 10; t++) {
        const g = new Map([["a", Float32Array.from({ length: 64 }, (_, i) => Math.sin(i + t))]])
        Optimizer.step(params, g, state, 1e-3, Optimizer.defaultConfig, Optimizer.clipScale(Optimizer.globalNorm(g), 1))
      }
      return params.get("a")!
    }
    assert.deepStrictEqual(Buffer.from(run().buffer), Buffer.from(run().buffer))
  })

  it("global-norm clipping scales to the cap and zeroes non-finite gradients", () => {
    const grads = new Map([["a", Float32Array.of(3)], ["b", Float32Array.of(4)]])
    assert.strictEqual(Optimizer.globalNorm(grads), 5)
    assert.approximately(Optimizer.clipScale(5, 1) * 5, 1, 1e-6)
    assert.strictEqual(Optimizer.clipScale(0.5, 1), 1)
    assert.strictEqual(Optimizer.clipScale(NaN, 1), 0)
  })
})

describe("LrSchedule", () => {
  it("linear warm-up then constant", () => {
    const s = LrSchedule.constant(2e-3, 100)
    assert.approximately(LrSchedule.at(s, 0), 2e-5, 1e-12)
    assert.approximately(LrSchedule.at(s, 49), 1e-3, 1e-12)
    assert.strictEqual(LrSchedule.at(s, 100), 2e-3)
    assert.strictEqual(LrSchedule.at(s, 10_000), 2e-3)
  })

  it("cosine decays from lr to minLr at totalSteps", () => {
    const s = LrSchedule.cosine(1, { warmupSteps: 10, totalSteps: 110, minLr: 0.1 })
    assert.approximately(LrSchedule.at(s, 10), 1, 1e-12)
    assert.approximately(LrSchedule.at(s, 60), 0.55, 1e-12)
    assert.approximately(LrSchedule.at(s, 110), 0.1, 1e-12)
    assert.approximately(LrSchedule.at(s, 500), 0.1, 1e-12)
    for (let t = 10; t < 110; t++) assert.isTrue(LrSchedule.at(s, t + 1) <= LrSchedule.at(s, t))
  })

  it("inUpdates: a schedule of 4 updates a learner step reaches its floor at the last learner step", () => {
    // 20 RL steps of 4 mini-batches: the optimiser takes 80 steps.
    const s = LrSchedule.inUpdates(LrSchedule.cosine(1e-3, { warmupSteps: 2, totalSteps: 20 }), 4)
    assert.strictEqual(s.warmupSteps, 8)
    assert.strictEqual(s.totalSteps, 80)
    assert.approximately(LrSchedule.at(s, 7), 1e-3, 1e-12) // the warm-up's end: 2 learner steps
    assert.isAbove(LrSchedule.at(s, 21), 5e-4) // after 5 learner steps the rate is still high
    assert.approximately(LrSchedule.at(s, 44), 5e-4, 1e-12) // halfway between the warm-up's end and the last step
    assert.strictEqual(LrSchedule.at(s, 80), 0)
    // One update a learner step: the same schedule, unchanged.
    const one = LrSchedule.cosine(1e-3, { warmupSteps: 2, totalSteps: 20 })
    assert.strictEqual(LrSchedule.inUpdates(one, 1), one)
  })
})
