import { assert, describe, it } from "@effect/vitest"
import * as AdamStep from "../../src/internal/adamStep.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as Optimizer from "../../src/Optimizer.ts"

/** A deterministic noisy gradient of ½·Σ cᵢ(wᵢ − w*ᵢ)² (curvatures 0.1–10): minibatch noise of relative size 0.5. */
const noisyQuadratic = (n: number) => {
  const target = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 1.7))
  const curvature = Float32Array.from({ length: n }, (_, i) => 10 ** (((i * 37) % n) / n * 2 - 1))
  const loss = (w: Float32Array) => {
    let sum = 0
    for (let i = 0; i < n; i++) sum += 0.5 * curvature[i]! * (w[i]! - target[i]!) ** 2
    return sum
  }
  const gradient = (w: Float32Array, t: number) =>
    Float32Array.from({ length: n }, (_, i) => {
      const noise = AdamStep.hash32((t * n + i) | 0) / 2 ** 32 - 0.5
      return curvature[i]! * (w[i]! - target[i]!) * (1 + noise) + 0.05 * noise
    })
  return { loss, gradient }
}

/** Losses after each of `steps` AdamW steps on {@link noisyQuadratic} with moments in `precision`. */
const quadraticRun = (precision: Optimizer.Precision, steps: number, config: Optimizer.Config) => {
  const n = 512
  const problem = noisyQuadratic(n)
  const params = new Map([["w", new Float32Array(n)]])
  const state = Optimizer.makeState(params, precision)
  const losses: Array<number> = []
  for (let t = 0; t < steps; t++) {
    Optimizer.step(params, new Map([["w", problem.gradient(params.get("w")!, t)]]), state, 1e-2, config)
    losses.push(problem.loss(params.get("w")!))
  }
  return { losses, state, params }
}

const widened = (m: Optimizer.Moment) => Optimizer.convertMoment(m, "float32") as Float32Array

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

  it("bfloat16 moments: the loss falls about as fast as with float32 moments", () => {
    const config = { ...Optimizer.defaultConfig, beta2: 0.999 }
    const f32 = quadraticRun("float32", 600, config)
    const bf16 = quadraticRun("bfloat16", 600, config)
    const first = f32.losses[0]!
    for (const at of [100, 200, 599]) {
      // Both fall far below the start (267 → 0.005), and bfloat16's curve stays within 5 % of float32's.
      assert.isBelow(f32.losses[at]!, first / 20, `float32 at ${at}`)
      const ratio = bf16.losses[at]! / f32.losses[at]!
      assert.approximately(ratio, 1, 0.05, `step ${at}: ${bf16.losses[at]} vs ${f32.losses[at]}`)
    }
    assert.instanceOf(bf16.state.m.get("w"), Uint16Array)
    assert.instanceOf(bf16.state.v.get("w"), Uint16Array)
  })

  it("bfloat16 moments: stochastic rounding keeps v's small increments that round-to-nearest loses", () => {
    // A constant gradient: v → g² with increments (1 − β2)·g²/v, below bfloat16's 2^-8 once v ≈ g²/2 at β2 0.999.
    const n = 2048, steps = 3000, beta2 = 0.999
    const params = new Map([["w", new Float32Array(n)]])
    const grads = new Map([["w", Float32Array.from({ length: n }, (_, i) => 0.5 + i / (4 * n))]])
    const state = Optimizer.makeState(params, "bfloat16")
    for (let t = 0; t < steps; t++) Optimizer.step(params, grads, state, 0, { ...Optimizer.defaultConfig, beta2 })
    const v = widened(state.v.get("w")!)
    const g = grads.get("w")!
    let ratio = 0
    for (let i = 0; i < n; i++) ratio += v[i]! / (g[i]! * g[i]! * (1 - beta2 ** steps))
    // The exact (float64) v over its bias correction is g²: stochastic rounding tracks it on average.
    assert.approximately(ratio / n, 1, 0.01)
    // Round-to-nearest stalls where the increment is below half a unit: at most (1 − β2)/2^-9 ≈ 0.51 of g².
    let rne = 0
    for (let t = 1; t <= steps; t++) {
      rne = Math.fround(beta2 * rne + (1 - beta2) * 0.25)
      rne = widened(Optimizer.convertMoment(Float32Array.of(rne), "bfloat16"))[0]!
    }
    assert.isBelow(rne / (0.25 * (1 - beta2 ** steps)), 0.6)
  })

  it("bfloat16 moments: deterministic, and a run resumed from a copy of its state is bit-identical", () => {
    const config = { ...Optimizer.defaultConfig, beta2: 0.999 }
    const a = quadraticRun("bfloat16", 40, config)
    const b = quadraticRun("bfloat16", 40, config)
    assert.deepStrictEqual(a.params.get("w"), b.params.get("w"))
    assert.deepStrictEqual(a.state.v.get("w"), b.state.v.get("w"))
    // Resume: stop after 20 steps, copy the state (what a checkpoint holds), go on from the copy.
    const n = 512, problem = noisyQuadratic(n)
    const params = new Map([["w", new Float32Array(n)]])
    let state = Optimizer.makeState(params, "bfloat16")
    for (let t = 0; t < 40; t++) {
      if (t === 20) {
        const copy = (moments: Map<string, Optimizer.Moment>) => new Map([["w", moments.get("w")!.slice()]])
        state = { step: state.step, m: copy(state.m), v: copy(state.v) }
        params.set("w", params.get("w")!.slice())
      }
      Optimizer.step(params, new Map([["w", problem.gradient(params.get("w")!, t)]]), state, 1e-2, config)
    }
    assert.deepStrictEqual(params.get("w"), a.params.get("w"))
  })

  it("bfloat16 moments: a split over slices (the learner's workers) gives the whole update's bits", () => {
    const n = 1000, config = Optimizer.defaultConfig
    const init = () =>
      new Map([["a", Float32Array.from({ length: n }, (_, i) => Math.sin(i))], ["b", new Float32Array(n)]])
    const grads = new Map([
      ["a", Float32Array.from({ length: n }, (_, i) => Math.cos(i) * 1e-3)],
      ["b", new Float32Array(n).fill(0.3)]
    ])
    const whole = init(), wholeState = Optimizer.makeState(whole, "bfloat16")
    for (let t = 0; t < 3; t++) Optimizer.step(whole, grads, wholeState, 1e-3, config)
    // Two slices, [0, 700) and [700, 2000) of the flat layout a | b, each updated alone with its offsets.
    const split = init(), splitState = Optimizer.makeState(split, "bfloat16")
    const cut = <A extends Float32Array | Uint16Array>(map: ReadonlyMap<string, A>, part: 0 | 1) =>
      new Map<string, A>(
        part === 0
          ? [["a", map.get("a")!.subarray(0, 700) as A]]
          : [["a", map.get("a")!.subarray(700) as A], ["b", map.get("b")!]]
      )
    for (let t = 0; t < 3; t++) {
      for (const part of [0, 1] as const) {
        const offsets = new Map(part === 0 ? [["a", 0]] : [["a", 700], ["b", n]])
        const state = { step: t, m: cut(splitState.m, part), v: cut(splitState.v, part) }
        AdamStep.step(cut(split, part), cut(grads, part), state, 1e-3, config, 1, AdamStep.defaultNoDecay, offsets)
      }
    }
    assert.deepStrictEqual(split, whole)
    assert.deepStrictEqual(splitState.v, wholeState.v)
  })

  it("stochastic rounding: unbiased between the two neighbours, exact on representable values", () => {
    const x = Float32Array.of(1 + 2 ** -9 + 2 ** -11) // between bfloat16's 1 and 1 + 2^-7, 5/16 of the way up
    const u = new Uint32Array(x.buffer)[0]!
    const lo = u >>> 16
    let up = 0
    const trials = 1 << 14
    for (let k = 0; k < trials; k++) if (AdamStep.roundStochastic(u, AdamStep.hash32(k) & 0xffff) === lo + 1) up++
    assert.approximately(up / trials, (u & 0xffff) / 65536, 0.02)
    assert.strictEqual(AdamStep.roundStochastic(0x3f800000, 0xffff), 0x3f80) // 1.0 stays 1.0
    assert.strictEqual(AdamStep.roundStochastic(0x7f800000, 0xffff), 0x7f80) // Infinity stays infinite
    assert.strictEqual(AdamStep.roundStochastic(0x7fc00001, 0) & 0x7fc0, 0x7fc0) // NaN stays NaN
  })

  it("convertMoment: bfloat16 → float32 → bfloat16 is exact; float32 → bfloat16 rounds to nearest", () => {
    const bits = Uint16Array.of(0x3f80, 0xbf81, 0x0001, 0x4049)
    assert.deepStrictEqual(Optimizer.convertMoment(Optimizer.convertMoment(bits, "float32"), "bfloat16"), bits)
    const nearest = Optimizer.convertMoment(Float32Array.of(1 + 2 ** -9), "bfloat16")
    assert.deepStrictEqual(widened(nearest), Float32Array.of(1))
    const same = Float32Array.of(1)
    assert.strictEqual(Optimizer.convertMoment(same, "float32"), same)
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
