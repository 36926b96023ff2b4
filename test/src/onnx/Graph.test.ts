import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ort from "onnxruntime-node"
import * as Graph from "../../../src/onnx/Graph.ts"

const run = (graph: Graph.Graph, feeds: Record<string, ort.Tensor>) =>
  Effect.promise(async () => {
    const session = await ort.InferenceSession.create(Graph.toModelBytes(graph))
    const out = await session.run(feeds)
    await session.release()
    return out
  })

describe("Graph", () => {
  it.effect("a small graph with initializers, attributes and named outputs runs in onnxruntime", () =>
    Effect.gen(function*() {
      const g = Graph.make("small")
      const x = g.input("x", "float32", ["batch", 3])
      const w = g.initializer("w", Graph.float32([3, 2], [1, 2, 3, 4, 5, 6]))
      const b = g.constant(Graph.float32([2], [0.5, -100]))
      const y = g.op("Add", [g.op("MatMul", [x, w]), b])
      const relu = g.op("Relu", [y])
      const [first, second] = g.opN("Split", [relu, g.constant(Graph.int64([2], [1, 1]))], 2, { axis: Graph.int(1) })
      const soft = g.node("Softmax", [relu], ["probs"], { axis: Graph.int(-1) })[0]!
      g.output(first!, "float32", ["batch", 1])
      g.output(second!, "float32", ["batch", 1])
      g.output(soft, "float32", ["batch", 2])
      assert.deepStrictEqual(Graph.problems(g), [])
      assert.strictEqual(g.nodes.length, 5)
      assert.deepStrictEqual(g.nodes[2]!.inputs, [y])

      const out = yield* run(g, { x: new ort.Tensor("float32", Float32Array.from([1, 1, 1, -1, 0, 2]), [2, 3]) })
      // rows: [1,1,1]·w = [9, 12]; [-1,0,2]·w = [9, 10]
      assert.deepStrictEqual(Array.from(out[first!]!.data as Float32Array), [9.5, 9.5])
      assert.deepStrictEqual(Array.from(out[second!]!.data as Float32Array), [0, 0])
      const probs = out["probs"]!.data as Float32Array
      assert.closeTo(probs[0]!, 1 / (1 + Math.exp(-9.5)), 1e-6)
    }))

  it.effect("int64 tensors, negative int attributes, float attributes and bool outputs encode correctly", () =>
    Effect.gen(function*() {
      const g = Graph.make("ints")
      const ids = g.input("ids", "int64", ["n"])
      const table = g.initializer("table", Graph.float32([4, 2], [0, 1, 10, 11, 20, 21, 30, 31]))
      const rows = g.op("Gather", [table, ids], { axis: Graph.int(0) })
      const last = g.op("Gather", [rows, g.constant(Graph.int64([], [-1]))], { axis: Graph.int(-1) })
      const big = g.op("Greater", [last, g.constant(Graph.float32([], [15]))])
      const leaky = g.op("LeakyRelu", [g.op("Neg", [last])], { alpha: Graph.float(0.25) })
      const shape = g.op("Shape", [rows])
      const perm = g.op("Transpose", [rows], { perm: Graph.ints([1, 0]) })
      const filled = g.op("ConstantOfShape", [shape], { value: Graph.tensor(Graph.float32([1], [7])) })
      for (const [n, t] of [[last, "float32"], [big, "bool"], [leaky, "float32"], [shape, "int64"], [perm, "float32"], [
        filled,
        "float32"
      ]] as const) {
        g.output(n, t, [])
      }
      const out = yield* run(g, { ids: new ort.Tensor("int64", BigInt64Array.from([3n, 0n, 2n]), [3]) })
      assert.deepStrictEqual(Array.from(out[last]!.data as Float32Array), [31, 1, 21])
      assert.deepStrictEqual(Array.from(out[big]!.data as Uint8Array, Boolean), [true, false, true])
      assert.deepStrictEqual(Array.from(out[leaky]!.data as Float32Array), [-7.75, -0.25, -5.25])
      assert.deepStrictEqual(Array.from(out[shape]!.data as BigInt64Array), [3n, 2n])
      assert.deepStrictEqual(Array.from(out[perm]!.data as Float32Array), [30, 0, 20, 31, 1, 21])
      assert.deepStrictEqual(Array.from(out[filled]!.data as Float32Array), [7, 7, 7, 7, 7, 7])
    }))

  it("fresh names never collide with declared names, and problems() reports undefined values", () => {
    const g = Graph.make("names")
    g.input("Add_0", "float32", [1])
    const a = g.op("Add", ["Add_0", "Add_0"])
    assert.notStrictEqual(a, "Add_0")
    g.op("Mul", [a, "missing"])
    g.output("nowhere", "float32", [1])
    assert.deepStrictEqual(Graph.problems(g), [
      `node 1 (Mul) reads undefined value "missing"`,
      `output "nowhere" is never produced`
    ])
    assert.throws(() => g.initializer("bad", Graph.float32([2, 2], [1, 2, 3])), /need 4 elements/)
  })

  it("large raw tensors round-trip bit-exactly through the encoder", () =>
    Effect.runPromise(Effect.gen(function*() {
      const g = Graph.make("big")
      const data = Float32Array.from({ length: 300_000 }, (_, i) => Math.sin(i) * 1e3)
      const w = g.initializer("w", { dtype: "float32", dims: [300_000], data })
      g.output(g.op("Identity", [w]), "float32", [300_000])
      const out = yield* run(g, {})
      const got = Object.values(out)[0]!.data as Float32Array
      assert.deepStrictEqual(got, data)
    })))
})
