/**
 * LoRA in the learner: the adapter path's gradients against central differences (float64), only the adapters
 * trained (the base a frozen input), a fresh adapter computing the base's function, the merge equal to the adapted
 * graph, the PEFT checkpoint layout, and an exact resume from a saved checkpoint.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as ort from "onnxruntime-node"
import * as Autodiff from "../../src/autodiff/Autodiff.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as Lora from "../../src/Lora.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Graph from "../../src/onnx/Graph.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as Packing from "../../src/Packing.ts"
import * as Safetensors from "../../src/Safetensors.ts"
import * as Sampling from "../../src/Sampling.ts"
import { batchFeeds, check } from "../utils/gradcheck.ts"
import { randomWeights, tinyConfig } from "../utils/tinyModel.ts"

const config = tinyConfig({ vocabSize: 32, hiddenSize: 16, numHiddenLayers: 2, intermediateSize: 24 })
const all: Lora.Config = { rank: 4, alpha: 8, targets: [...Lora.moduleNames] }

/** An adapter with `B` non-zero too (a fresh one has `B` = 0, where `A`'s gradient is zero). */
const trainedAdapter = (settings: Lora.Config, seed: number) => {
  const adapter = Lora.init(config, { ...settings, seed })
  const r = Sampling.rng(seed + 1)
  for (const [name, data] of adapter) {
    if (name.endsWith("lora_B.weight")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.2
  }
  return adapter
}

const dataset = (): ReadonlyArray<Packing.Sequence> => {
  const r = Sampling.rng(42)
  return Array.from({ length: 4 }, (_, i) => {
    const n = 10 + i
    const tokenIds = Int32Array.from({ length: n }, () => Math.floor(r.next() * config.vocabSize))
    return { tokenIds, lossMask: Uint8Array.from({ length: n }, (_, t) => (t >= n / 2 ? 1 : 0)) }
  })
}

const bits = (w: ReadonlyMap<string, Float32Array>) =>
  [...w].map(([k, v]) => `${k}:${Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64")}`).join("|")

const trainerOptions = (base: Qwen2.Weights, settings: Lora.Config = all): OnnxTrainer.Options => ({
  model: OnnxTrainer.qwen2Lora(config, settings, base, "test/base"),
  weights: base,
  loss: Loss.sft,
  optimizer: Optimizer.defaultConfig,
  schedule: LrSchedule.constant(5e-3)
})

describe("Lora", () => {
  it("an unknown target is refused, naming the modules the model has", () => {
    const error = Lora.validate({ rank: 4, alpha: 8, targets: ["q_proj", "c_attn"] }, config)
    assert.isDefined(error)
    assert.include(error!.message, "\"c_attn\" is not a module")
    for (const m of Lora.moduleNames) assert.include(error!.message, m)
    assert.isUndefined(Lora.validate(all, config))
  })

  it("the adapter's tensors carry PEFT's names and shapes: lora_A [r, in], lora_B [out, r]", () => {
    const params = new Map(Lora.parameters(config, all).map((p) => [p.name, p.shape]))
    const hd = config.hiddenSize / config.numAttentionHeads
    assert.deepStrictEqual(params.get("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"), [4, 16])
    assert.deepStrictEqual(
      params.get("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"),
      [config.numKeyValueHeads * hd, 4]
    )
    assert.deepStrictEqual(params.get("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"), [4, 24])
    assert.deepStrictEqual(params.get("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"), [16, 4])
    assert.strictEqual(params.size, 2 * 7 * 2)
  })

  for (const dropout of [0, 0.5]) {
    const title = `the adapter path's gradients (dropout ${dropout}) match central differences in float64; ` +
      "the base gets none"
    it.effect(title, () =>
      Effect.gen(function*() {
        const B = 2, T = 5
        const settings: Lora.Config = {
          rank: 3,
          alpha: 6,
          dropout,
          targets: ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
        }
        const forward = Qwen2.trainingGraph(config, "lm", settings)
        const adapterNames = Lora.parameters(config, settings).map((p) => p.name)
        assert.deepStrictEqual([...forward.weightInputs].sort(), [...adapterNames].sort())
        const tg = yield* Autodiff.trainingGraph(forward, { batch: B, length: T, loss: Loss.sft, dtype: "float64" })
        assert.deepStrictEqual([...tg.gradients.keys()].sort(), [...adapterNames].sort())
        // No gradient output for any base weight: the frozen base is an input of the forward only.
        assert.isFalse(tg.graph.outputs.some((o) => o.name.startsWith("grad.model.")))
        const base = randomWeights(config, 5)
        const adapter = trainedAdapter(settings, 9)
        const feeds = batchFeeds(tg.lossInputs, Qwen2.positionIds, (mask, batch, length) =>
          Loss.aggregationWeights("token-mean", mask, batch, length, Loss.totals(mask, batch, length)))
        for (const spec of Qwen2.parameters(config)) {
          feeds[spec.name] = { dtype: "float64", dims: spec.shape, data: base.get(spec.name)! }
        }
        for (const spec of Lora.parameters(config, settings)) {
          feeds[spec.name] = { dtype: "float64", dims: spec.shape, data: adapter.get(spec.name)! }
        }
        // Dropout: one fixed mask input per adapted projection, as the trainer feeds them.
        const masks = Lora.dropoutMasks(config, settings, [{ rows: ["batch", "seq"], batch: B, length: T }], true, 5)
        assert.strictEqual(masks.size, dropout > 0 ? Lora.sites(config, settings).length : 0)
        assert.deepStrictEqual(
          tg.modelInputs.filter((n) => n.startsWith("lora_dropout.")).sort(),
          [...masks.keys()].sort()
        )
        for (const [name, m] of masks) feeds[name] = { dtype: "float64", dims: m.dims, data: m.data }
        const s = yield* Effect.promise(() =>
          ort.InferenceSession.create(Graph.toModelBytes(tg.graph), { graphOptimizationLevel: "disabled" })
        )
        const { worst } = yield* check(s, feeds, adapterNames, { samples: 4, h: 1e-5 })
        for (const w of adapterNames) assert.isBelow(worst[w]!, 1e-5, `${w}: ${worst[w]}`)
      }))
  }

  it("dropout masks: a p share of zeros, the rest 1/(1 − p), the same for a seed; ones when not training", () => {
    const settings: Lora.Config = { ...all, dropout: 0.25 }
    const shapes = [{ rows: ["batch", "seq"] as const, batch: 4, length: 32 }]
    const masks = Lora.dropoutMasks(config, settings, shapes, true, 11)
    const values = [...masks.values()].flatMap((m) => [...m.data])
    const zeros = values.filter((v) => v === 0).length / values.length
    assert.isTrue(Math.abs(zeros - 0.25) < 0.02, `zeros ${zeros}`)
    assert.isTrue(values.every((v) => v === 0 || Math.abs(v - 1 / 0.75) < 1e-6))
    const again = Lora.dropoutMasks(config, settings, shapes, true, 11)
    assert.deepStrictEqual([...again.values()].map((m) => [...m.data]), [...masks.values()].map((m) => [...m.data]))
    const evaluation = Lora.dropoutMasks(config, settings, shapes, false, 11)
    assert.isTrue([...evaluation.values()].every((m) => m.data.every((v) => v === 1)))
  })

  it.effect("a fresh adapter computes the base's function; a trained one the merged weights' function", () =>
    Effect.gen(function*() {
      const base = randomWeights(config, 3)
      const { microBatches } = yield* Packing.pack(dataset(), { tokenBudget: 64, aggregation: "token-mean" })
      const mb = microBatches[0]!
      const plain = yield* OnnxTrainer.make({ ...trainerOptions(base), model: OnnxTrainer.qwen2(config) })
      const fresh = yield* OnnxTrainer.make(trainerOptions(base))
      const reference = (yield* plain.logprobs(mb)).tokenLogprobs
      const adapted = (yield* fresh.logprobs(mb)).tokenLogprobs
      // `B` = 0: the update is exactly zero, so the sums are the base's to the bit.
      const b64 = (x: Float32Array) => Buffer.from(x.buffer).toString("base64")
      assert.strictEqual(b64(adapted), b64(reference))
      const adapter = trainedAdapter(all, 4)
      const trained = yield* OnnxTrainer.make({ ...trainerOptions(base), weights: adapter })
      const merged = yield* OnnxTrainer.make({
        ...trainerOptions(base),
        model: OnnxTrainer.qwen2(config),
        weights: Lora.merge(config, all, base, adapter)
      })
      const a = (yield* trained.logprobs(mb)).tokenLogprobs, b = (yield* merged.logprobs(mb)).tokenLogprobs
      let diff = 0, moved = 0
      for (let i = 0; i < a.length; i++) {
        diff = Math.max(diff, Math.abs(a[i]! - b[i]!))
        moved = Math.max(moved, Math.abs(a[i]! - reference[i]!))
      }
      assert.isBelow(diff, 1e-4)
      assert.isAbove(moved, 1e-2) // the adapter changes the function: the comparison above is not vacuous
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)

  it.effect("only the adapter trains: AdamW state for it alone, the base untouched, the loss falls", () =>
    Effect.gen(function*() {
      const base = randomWeights(config, 3)
      const before = bits(base)
      const t = yield* OnnxTrainer.make(trainerOptions(base))
      const { microBatches } = yield* Packing.pack(dataset(), { tokenBudget: 64, aggregation: "token-mean" })
      const losses: Array<number> = []
      for (let s = 0; s < 30; s++) {
        let loss = 0
        for (const mb of microBatches) loss += (yield* t.trainer.forwardBackward(mb)).loss
        yield* t.trainer.optimStep
        losses.push(loss)
      }
      assert.isBelow(losses.at(-1)!, losses[0]! * 0.8, `losses ${losses.map((l) => l.toFixed(3))}`)
      assert.strictEqual(bits(base), before)
      const grads = yield* t.gradients
      assert.deepStrictEqual([...grads.keys()].sort(), Lora.parameters(config, all).map((p) => p.name).sort())
      const weights = yield* t.trainer.weights
      // The base by reference (held once), then the adapter.
      assert.strictEqual(weights.get("model.embed_tokens.weight"), base.get("model.embed_tokens.weight"))
      assert.isTrue(Lora.hasAdapter(weights))
    }).pipe(Effect.provide(NodeServices.layer)), 120_000)

  it.effect("the frozen head in chunks of tokens gives the plain head's loss and adapter gradients", () =>
    Effect.gen(function*() {
      const base = randomWeights(config, 3)
      const { microBatches } = yield* Packing.pack(dataset(), { tokenBudget: 64, aggregation: "token-mean" })
      const mb = microBatches[0]!
      const run = (headChunk: number) =>
        Effect.gen(function*() {
          const t = yield* OnnxTrainer.make({ ...trainerOptions(base), headChunk })
          const r = yield* t.trainer.forwardBackward(mb)
          return { loss: r.loss, grads: yield* t.gradients }
        })
      const plain = yield* run(0), chunked = yield* run(5)
      // The chunked head's per-chunk Gemms are there: the comparison is not of two plain heads.
      const graphOf = (headChunk: number) =>
        Autodiff.trainingGraph(Qwen2.trainingGraph(config, "lm", all), {
          batch: mb.batch,
          length: mb.length,
          loss: Loss.sft,
          headChunk
        })
      const gemms = (g: Effect.Success<ReturnType<typeof graphOf>>) =>
        g.graph.nodes.filter((n) => n.op === "Gemm").length
      assert.isAbove(gemms(yield* graphOf(5)), gemms(yield* graphOf(0)))
      assert.isBelow(Math.abs(plain.loss - chunked.loss), 1e-5)
      let diff = 0, scale = 0
      for (const [name, g] of plain.grads) {
        const h = chunked.grads.get(name)!
        for (let i = 0; i < g.length; i++) {
          diff = Math.max(diff, Math.abs(g[i]! - h[i]!))
          scale = Math.max(scale, Math.abs(g[i]!))
        }
      }
      assert.isAbove(scale, 1e-4)
      assert.isBelow(diff, 1e-5 * Math.max(1, scale))
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped), 120_000)

  it.effect("with two worker threads the base is held once, in a file both threads map; they train as one thread", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const base = randomWeights(config, 3)
      const { microBatches } = yield* Packing.pack(dataset(), { tokenBudget: 64, aggregation: "token-mean" })
      const adapterBytes = Lora.parameters(config, all).reduce((n, p) => n + 4 * p.shape.reduce((a, b) => a * b), 0)
      const baseBytes = [...base.values()].reduce((n, w) => n + w.byteLength, 0)
      const run = (workers: number) =>
        Effect.gen(function*() {
          const t = yield* OnnxTrainer.make({ ...trainerOptions(base), workers })
          for (const mb of microBatches) yield* t.trainer.forwardBackward(mb)
          const gradients = yield* t.gradients
          const held = yield* t.threads.held
          const { file, writes } = yield* t.threads.frozen
          // Linux: the mappings of the file in this process (every worker's sessions map it; none copies it).
          const smaps = (yield* fs.exists("/proc/self/smaps")) ? yield* fs.readFileString("/proc/self/smaps") : ""
          const mappings = file === undefined ? 0 : smaps.split("\n").filter((l) => l.includes(file.folder)).length
          yield* t.threads.close("5 seconds") // the next call starts fresh threads: the file is not written again
          yield* t.trainer.optimStep
          for (let s = 1; s < 3; s++) {
            for (const mb of microBatches) yield* t.trainer.forwardBackward(mb)
            yield* t.trainer.optimStep
          }
          const after = yield* t.threads.frozen
          const weights = Lora.adapterOf(yield* t.trainer.weights)
          return { gradients, held, file, writes: [writes, after.writes], mappings, weights }
        }).pipe(Effect.scoped)
      const one = yield* run(1), two = yield* run(2)
      assert.isUndefined(one.file)
      assert.deepStrictEqual(one.writes, [0, 0])
      assert.deepStrictEqual(two.held, [adapterBytes, adapterBytes]) // each thread: the adapter, never the base
      assert.deepStrictEqual(two.writes, [1, 1])
      assert.isAtLeast(two.file!.bytes, baseBytes)
      if (two.mappings > 0 || process.platform === "linux") assert.isAtLeast(two.mappings, 2)
      assert.isFalse(yield* fs.exists(two.file!.folder)) // removed when the trainer's scope closed
      const maxDiff = (a: ReadonlyMap<string, Float32Array>, b: ReadonlyMap<string, Float32Array>) => {
        let diff = 0, scale = 0
        for (const [name, w] of a) {
          const v = b.get(name)!
          for (let i = 0; i < w.length; i++) {
            diff = Math.max(diff, Math.abs(w[i]! - v[i]!))
            scale = Math.max(scale, Math.abs(w[i]!))
          }
        }
        return { diff, scale }
      }
      const g = maxDiff(one.gradients, two.gradients)
      assert.isAbove(g.scale, 1e-4)
      assert.isBelow(g.diff, 1e-5 * Math.max(1, g.scale)) // float summation order only
      assert.isBelow(maxDiff(one.weights, two.weights).diff, 1e-5)
      assert.isAbove(maxDiff(one.weights, Lora.init(config, all)).diff, 1e-3) // the adapter moved
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped), 120_000)

  it.effect("a checkpoint is a PEFT adapter folder, and a resume from it continues to the same bits", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped()
      const base = randomWeights(config, 3)
      const { microBatches } = yield* Packing.pack(dataset(), { tokenBudget: 64, aggregation: "token-mean" })
      const steps = (t: Effect.Success<ReturnType<typeof OnnxTrainer.make>>, n: number) =>
        Effect.gen(function*() {
          for (let s = 0; s < n; s++) {
            for (const mb of microBatches) yield* t.trainer.forwardBackward(mb)
            yield* t.trainer.optimStep
          }
        })
      // With dropout: the masks a step draws must be the same after the resume.
      const withDropout: Lora.Config = { ...all, dropout: 0.1 }
      const unbroken = yield* OnnxTrainer.make(trainerOptions(base, withDropout))
      yield* steps(unbroken, 3)
      yield* unbroken.trainer.save(dir, { policyVersion: 3, rngState: [] })
      yield* steps(unbroken, 3)

      const config_ = JSON.parse(yield* fs.readFileString(`${dir}/adapter_config.json`))
      assert.strictEqual(config_.peft_type, "LORA")
      assert.strictEqual(config_.task_type, "CAUSAL_LM")
      assert.strictEqual(config_.r, 4)
      assert.strictEqual(config_.lora_dropout, 0.1)
      assert.strictEqual(config_.lora_alpha, 8)
      assert.strictEqual(config_.base_model_name_or_path, "test/base")
      assert.deepStrictEqual(config_.target_modules, [...Lora.moduleNames])
      const header = yield* Safetensors.readHeader(`${dir}/adapter_model.safetensors`)
      const names = [...header.tensors.keys()]
      assert.strictEqual(names.length, Lora.parameters(config, all).length)
      for (const name of names) {
        assert.match(name, /^base_model\.model\.model\.layers\.\d+\.(self_attn|mlp)\.[a-z_]+_proj\.lora_[AB]\.weight$/)
      }
      const a = header.tensors.get("base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight")!
      assert.deepStrictEqual([a.dtype, [...a.shape]], ["F32", [4, config.hiddenSize]])
      const loaded = yield* Lora.load(dir, config)
      assert.deepStrictEqual(loaded.config.targets, [...Lora.moduleNames])

      // A new process: the base from its folder, the adapter and AdamW's moments from the checkpoint.
      const resumed = yield* OnnxTrainer.make(trainerOptions(randomWeights(config, 3), withDropout))
      const meta = yield* resumed.trainer.load(dir)
      assert.strictEqual(meta.policyVersion, 3)
      yield* steps(resumed, 3)
      const strip = (w: ReadonlyMap<string, Float32Array>) => new Map([...w].filter(([k]) => k.includes("lora_")))
      assert.strictEqual(bits(strip(yield* resumed.trainer.weights)), bits(strip(yield* unbroken.trainer.weights)))
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped), 120_000)
})
