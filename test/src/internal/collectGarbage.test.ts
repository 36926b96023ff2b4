import { assert, describe, it } from "@effect/vitest"
import * as ort from "onnxruntime-node"
import * as CollectGarbage from "../../../src/internal/collectGarbage.ts"
import * as Graph from "../../../src/onnx/Graph.ts"

describe("collectGarbage", () => {
  it("release detaches the arrays' buffers and leaves those of `keep` (and views sharing them) alone", () => {
    const gone = new Float32Array(1024).fill(1)
    const alsoGone = new Float32Array(16)
    const kept = new Float32Array(64).fill(2)
    const view = new Float32Array(kept.buffer, 16, 4)
    CollectGarbage.release([gone, alsoGone, view, alsoGone], new Set([kept.buffer]))
    assert.strictEqual(gone.length, 0)
    assert.strictEqual(alsoGone.length, 0)
    assert.strictEqual(view.length, 4)
    assert.strictEqual(kept.length, 64)
    assert.strictEqual(kept[63], 2)
  })

  it("onnxruntime-node returns a copy of a pre-allocated output; release frees it, not ours", async () => {
    const g = Graph.make("neg")
    const x = g.input("x", "float32", [8])
    g.output(g.op("Neg", [x]), "float32", [8])
    const session = await ort.InferenceSession.create(Graph.toModelBytes(g))
    const into = new Float32Array(8)
    const name = g.outputs[0]!.name
    const out = await session.run(
      { x: new ort.Tensor("float32", Float32Array.from({ length: 8 }, (_, i) => i), [8]) },
      { [name]: new ort.Tensor("float32", into, [8]) }
    )
    const copy = out[name]!.data as Float32Array
    // The reason for `release`: the output is a second array beside the caller's (were it the same, `keep` saves it).
    assert.notStrictEqual(copy.buffer, into.buffer)
    assert.deepStrictEqual([...copy], [...into])
    CollectGarbage.release([copy], new Set([into.buffer]))
    assert.strictEqual(copy.length, 0)
    assert.deepStrictEqual([...into], [-0, -1, -2, -3, -4, -5, -6, -7])
    await session.release()
  })
})
