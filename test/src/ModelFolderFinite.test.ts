/**
 * A model folder whose weights hold a NaN or ±Infinity is refused where it is read (so serve, train, eval and the
 * gateway refuse it), naming the tensor, the first bad index and how many the tensor holds; the check is one pass
 * that reports the first tensor in the model's parameter order.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import * as Finite from "../../src/internal/finite.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"

/** A tiny folder whose `tensor` has `values` written at the given indices. */
const poisoned = (poison: ReadonlyArray<readonly [tensor: string, index: number, value: number]>) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const dir = `${yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-finite-" })}/tiny`
    const config = yield* ModelFolder.init(dir, { preset: "tiny", seed: 3 })
    const weights = Qwen2.initWeights(config, 3)
    for (const [tensor, index, value] of poison) weights.get(tensor)![index] = value
    yield* ModelFolder.writeModel(dir, config, weights)
    return dir
  })

describe("ModelFolder: non-finite weights", () => {
  it.effect("a NaN in one tensor is refused, naming the tensor, its first bad index and the count", () =>
    Effect.gen(function*() {
      const tensor = "model.layers.1.mlp.up_proj.weight"
      const dir = yield* poisoned([[tensor, 41, NaN], [tensor, 7, NaN], [tensor, 900, Infinity]])
      const e = yield* Effect.flip(ModelFolder.load(dir))
      assert.strictEqual(e._tag, "ModelFolderError")
      assert.strictEqual(e.file, `${dir}/model.safetensors`)
      assert.strictEqual(e.reason._tag, "InvalidWeights")
      assert.deepStrictEqual(e.reason._tag === "InvalidWeights" && [e.reason.tensor, e.reason.index, e.reason.count], [
        tensor,
        7,
        3
      ])
      assert.strictEqual(
        e.message,
        `${dir}/model.safetensors: tensor "${tensor}" holds 3 non-finite values (the first: ${tensor}[7] = NaN); ` +
          "weights with NaN or ±Infinity cannot sample or train"
      )
      assert.notInclude(e.message, "\n", "one line")
      // readWeights alone (what a caller with its own config uses) refuses the same.
      const config = yield* ModelFolder.readConfig(dir)
      const alone = (yield* Effect.flip(ModelFolder.readWeights(dir, config))).reason
      assert.deepStrictEqual(alone._tag === "InvalidWeights" && alone.tensor, tensor)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.effect("±Infinity is refused as NaN is; the first tensor in parameter order is the one named", () =>
    Effect.gen(function*() {
      const later = "model.norm.weight", earlier = "model.layers.0.self_attn.q_proj.weight"
      const dir = yield* poisoned([[later, 0, -Infinity], [earlier, 5, Infinity]])
      const e = yield* Effect.flip(ModelFolder.load(dir))
      assert.deepStrictEqual(e.reason._tag === "InvalidWeights" && [e.reason.tensor, e.reason.index], [earlier, 5])
      assert.include(e.message, `holds 1 non-finite value (the first: ${earlier}[5] = Infinity)`)
      const onlyLast = yield* poisoned([[later, 2, -Infinity]])
      assert.include((yield* Effect.flip(ModelFolder.load(onlyLast))).message, `${later}[2] = -Infinity`)
      // The unpoisoned folder still loads: finite extremes are weights like any other.
      const extremes = yield* poisoned([[later, 0, 3.4e38], [later, 1, -3.4e38], [later, 2, 1e-45]])
      assert.strictEqual((yield* ModelFolder.load(extremes)).weights.get(later)![0], Math.fround(3.4e38))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it("firstNonFinite: undefined when all are finite; the first tensor with one, its index and count", () => {
    const a = Float32Array.of(1, -2, 0), b = Float32Array.of(0, NaN, 1, Infinity, -Infinity)
    assert.isUndefined(Finite.firstNonFinite([["a", a]]))
    assert.deepStrictEqual(Finite.firstNonFinite([["a", a], ["b", b], ["c", Float32Array.of(NaN)]]), {
      tensor: "b",
      index: 1,
      value: NaN,
      count: 3
    })
  })
})
