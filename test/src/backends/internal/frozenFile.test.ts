/**
 * The frozen base's file for the trainer's worker threads: its layout, its bytes, and a session that takes a weight
 * from it as an external-data initializer computing the same bits as one fed the weight as an input (with the
 * options that keep onnxruntime from copying it: no pre-packing, no constant folding of `Transpose(W)`).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, FileSystem, Scope } from "effect"
import * as ort from "onnxruntime-node"
import * as FrozenFile from "../../../../src/backends/internal/frozenFile.ts"
import * as Graph from "../../../../src/onnx/Graph.ts"
import * as Sampling from "../../../../src/Sampling.ts"

const random = (n: number, seed: number) => {
  const r = Sampling.rng(seed)
  return Float32Array.from({ length: n }, () => Sampling.normal(r))
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64")

/** `y = x @ Wᵀ`, W [out, in] as the model's projections hold it. */
const projection = (rows: number, inF: number, outF: number) => {
  const g = Graph.make("projection")
  const x = g.input("x", "float32", [rows, inF])
  const w = g.input("w", "float32", [outF, inF])
  g.node("MatMul", [x, g.op("Transpose", [w], { perm: Graph.ints([1, 0]) })], ["y"])
  g.output("y", "float32", [rows, outF])
  return g
}

describe("frozenFile", () => {
  it("layout: in order, each weight at a multiple of the alignment, none overlapping", () => {
    const { entries, bytes } = FrozenFile.layout([
      { name: "a", shape: [3] },
      { name: "b", shape: [2, 20_000] },
      { name: "c", shape: [] }
    ])
    assert.deepStrictEqual([...entries.values()].map((e) => [e.offset, e.length]), [
      [0, 12],
      [FrozenFile.alignment, 160_000],
      [FrozenFile.alignment * 4, 4]
    ])
    assert.strictEqual(bytes, FrozenFile.alignment * 4 + 4)
    for (const e of entries.values()) assert.strictEqual(e.location, FrozenFile.location)
    assert.strictEqual(FrozenFile.layout([]).bytes, 0)
  })

  it.effect("write: each weight's bytes at its offset; the folder is removed when the scope closes", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const parameters = [{ name: "a", shape: [5] }, { name: "b", shape: [3, 7] }]
      const weights = new Map([["a", random(5, 1)], ["b", random(21, 2)]])
      const { folder, bytes, data } = yield* Effect.scoped(Effect.gen(function*() {
        const file = yield* FrozenFile.write(parameters, weights)
        return { ...file, data: yield* fs.readFile(`${file.folder}/${FrozenFile.location}`) }
      }))
      assert.strictEqual(data.length, bytes)
      const floats = (from: number, bytes: number) =>
        new Float32Array(Uint8Array.from(data.subarray(from, from + bytes)).buffer)
      assert.strictEqual(bits(floats(FrozenFile.alignment, 84)), bits(weights.get("b")!))
      assert.strictEqual(bits(floats(0, 20)), bits(weights.get("a")!))
      assert.isFalse(yield* fs.exists(folder))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("acquire: one file per weights in the process, removed when the last scope holding it closes", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const parameters = [{ name: "w", shape: [4, 3] }]
      const weights = new Map([["w", random(12, 5)]])
      const other = new Map([["w", random(12, 5)]]) // the same values in other arrays: a file of its own
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      const a = yield* Scope.provide(FrozenFile.acquire(parameters, weights), first)
      const [b, c] = yield* Effect.all([
        Scope.provide(FrozenFile.acquire(parameters, weights), second),
        Scope.provide(FrozenFile.acquire(parameters, other), second)
      ], { concurrency: "unbounded" })
      assert.deepStrictEqual([a.written, b.written, c.written], [true, false, true])
      assert.strictEqual(b.file.folder, a.file.folder)
      assert.notStrictEqual(c.file.folder, a.file.folder)
      yield* Scope.close(first, Exit.void)
      assert.isTrue(yield* fs.exists(`${a.file.folder}/${FrozenFile.location}`)) // the second scope still holds it
      yield* Scope.close(second, Exit.void)
      assert.isFalse(yield* fs.exists(a.file.folder))
      assert.isFalse(yield* fs.exists(c.file.folder))
      const again = yield* Effect.scoped(FrozenFile.acquire(parameters, weights))
      assert.isTrue(again.written) // written anew once none held it
    }).pipe(Effect.provide(NodeServices.layer)))

  it("sessionOptions keeps the trainer's settings and adds the folder, no pre-packing, no constant folding", () => {
    const options = FrozenFile.sessionOptions({
      intraOpNumThreads: 1,
      extra: { session: { intra_op: { allow_spinning: "0" } } }
    }, "/some/folder")
    assert.strictEqual(options.intraOpNumThreads, 1)
    assert.deepStrictEqual(options.extra, {
      session: {
        intra_op: { allow_spinning: "0" },
        disable_prepacking: "1",
        model_external_initializers_file_folder_path: "/some/folder"
      },
      optimization: { disable_specified_optimizers: "ConstantFolding" }
    })
  })

  it("a symbolic dimension cannot become an initializer", () => {
    const g = Graph.make("symbolic")
    g.node("Identity", [g.input("w", "float32", ["batch", 4])], ["y"])
    g.output("y", "float32", ["batch", 4])
    assert.throws(() => FrozenFile.modelBytes(g, FrozenFile.layout([{ name: "w", shape: [2, 4] }])), /fixed dims/)
  })

  it.effect("a weight read from the file gives the bits of the same weight fed as an input", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const [rows, inF, outF] = [8, 96, 80]
      const g = projection(rows, inF, outF)
      const w = random(outF * inF, 3), x = random(rows * inF, 4)
      const options: ort.InferenceSession.SessionOptions = { intraOpNumThreads: 1, graphOptimizationLevel: "all" }
      const fed = yield* Effect.promise(() => ort.InferenceSession.create(Graph.toModelBytes(g), options))
      const expected = yield* Effect.promise(() =>
        fed.run({ x: new ort.Tensor("float32", x, [rows, inF]), w: new ort.Tensor("float32", w, [outF, inF]) })
      )
      const parameters = [{ name: "w", shape: [outF, inF] }]
      const file = yield* FrozenFile.write(parameters, new Map([["w", w]]))
      const mapped = yield* Effect.promise(() =>
        ort.InferenceSession.create(FrozenFile.modelBytes(g, file), FrozenFile.sessionOptions(options, file.folder))
      )
      assert.deepStrictEqual(mapped.inputNames, ["x"])
      const out = yield* Effect.promise(() => mapped.run({ x: new ort.Tensor("float32", x, [rows, inF]) }))
      assert.strictEqual(bits(out["y"]!.data as Float32Array), bits(expected["y"]!.data as Float32Array))
      // Linux: the session still maps the file after a run (a folded or pre-packed copy would have replaced it).
      if (yield* fs.exists("/proc/self/smaps")) {
        const smaps = yield* fs.readFileString("/proc/self/smaps")
        assert.isTrue(smaps.split("\n").some((line) => line.includes(file.folder)))
      }
      yield* Effect.promise(() => Promise.all([fed.release(), mapped.release()]))
    }).pipe(Effect.provide(NodeServices.layer), Effect.scoped))
})
