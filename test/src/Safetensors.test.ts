import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Safetensors from "../../src/Safetensors.ts"

const tensors = [
  { name: "a.weight", shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) },
  { name: "b", shape: [1], data: Float32Array.from([-0.5]) }
]

/** A file as the reference Python implementation lays it out, built by hand. */
const handMade = (header: Record<string, unknown>, data: Uint8Array): Uint8Array => {
  const json = new TextEncoder().encode(JSON.stringify(header))
  const out = new Uint8Array(8 + json.length + data.length)
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true)
  out.set(json, 8)
  out.set(data, 8 + json.length)
  return out
}

const expectError = (bytes: Uint8Array, reason: Safetensors.SafetensorsErrorReason["_tag"], pattern: RegExp) =>
  Effect.gen(function*() {
    const error = yield* Effect.flip(Safetensors.parse(bytes, "w.safetensors"))
    assert.strictEqual(error.reason._tag, reason)
    assert.match(error.message, pattern)
    assert.match(error.message, /w\.safetensors/)
  })

describe("Safetensors", () => {
  it.effect("round-trips tensors and metadata; the header is padded to 8 bytes", () =>
    Effect.gen(function*() {
      const bytes = Safetensors.serialize(tensors, { format: "pt" })
      const headerLength = Number(new DataView(bytes.buffer).getBigUint64(0, true))
      assert.strictEqual(headerLength % 8, 0)
      const file = yield* Safetensors.parse(bytes)
      assert.deepStrictEqual(file.metadata, { format: "pt" })
      assert.deepStrictEqual([...file.tensors.keys()], ["a.weight", "b"])
      const weights = yield* Safetensors.readFloat32(file, "m", tensors)
      assert.deepStrictEqual(weights.get("a.weight"), tensors[0]!.data)
      assert.deepStrictEqual(weights.get("b"), tensors[1]!.data)
    }))

  it.effect("reads a hand-made reference layout, including F16, BF16 and F64 tensors", () =>
    Effect.gen(function*() {
      const data = new Uint8Array(4 + 2 * 2 + 2 * 2 + 8)
      const view = new DataView(data.buffer)
      view.setFloat32(0, 3.25, true)
      view.setUint16(4, 0x3c00, true) // f16 1.0
      view.setUint16(6, 0xc100, true) // f16 -2.5
      view.setUint16(8, 0x3fc0, true) // bf16 1.5
      view.setUint16(10, 0xc000, true) // bf16 -2
      view.setFloat64(12, 0.1, true)
      const bytes = handMade({
        x: { dtype: "F32", shape: [], data_offsets: [0, 4] },
        h: { dtype: "F16", shape: [2], data_offsets: [4, 8] },
        bf: { dtype: "BF16", shape: [2], data_offsets: [8, 12] },
        d: { dtype: "F64", shape: [1], data_offsets: [12, 20] }
      }, data)
      const file = yield* Safetensors.parse(bytes, "ref")
      const w = yield* Safetensors.readFloat32(file, "ref", [
        { name: "x", shape: [] },
        { name: "h", shape: [2] },
        { name: "bf", shape: [2] },
        { name: "d", shape: [1] }
      ])
      assert.deepStrictEqual([...w.get("x")!], [3.25])
      assert.deepStrictEqual([...w.get("h")!], [1, -2.5])
      assert.deepStrictEqual([...w.get("bf")!], [1.5, -2])
      assert.closeTo(w.get("d")![0]!, 0.1, 1e-7)
    }))

  it.effect("corrupt files are typed errors naming the file and the tensor", () =>
    Effect.gen(function*() {
      const good = Safetensors.serialize(tensors)
      yield* expectError(good.subarray(0, 5), "Corrupt", /too short/)
      yield* expectError(good.subarray(0, 40), "Corrupt", /exceeds the file size/)
      yield* expectError(good.subarray(0, good.length - 4), "Corrupt", /"b" spans bytes/)
      yield* expectError(handMade({ x: 1 }, new Uint8Array(0)), "Corrupt", /"x" has a malformed header entry/)
      yield* expectError(handMade([] as never, new Uint8Array(0)), "Corrupt", /not a JSON object/)
      const bad = handMade({}, new Uint8Array(0))
      bad[8] = 0x7b + 1
      yield* expectError(bad, "Corrupt", /not valid JSON/)
      yield* expectError(
        handMade({ x: { dtype: "F32", shape: [3], data_offsets: [0, 8] } }, new Uint8Array(8)),
        "Corrupt",
        /needs 12 bytes/
      )
      yield* expectError(
        handMade({
          x: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
          y: { dtype: "F32", shape: [1], data_offsets: [4, 8] }
        }, new Uint8Array(8)),
        "Corrupt",
        /overlap/
      )
      const q4 = handMade({ x: { dtype: "Q4", shape: [1], data_offsets: [0, 1] } }, new Uint8Array(1))
      yield* expectError(q4, "Corrupt", /malformed/)
    }))

  it.effect("files that do not match the model: missing, misshapen, integer or unexpected tensors", () =>
    Effect.gen(function*() {
      const file = yield* Safetensors.parse(Safetensors.serialize(tensors))
      const check = (expected: ReadonlyArray<{ name: string; shape: ReadonlyArray<number> }>) =>
        Effect.flip(Safetensors.readFloat32(file, "model.safetensors", expected))
      const missing = yield* check([...tensors, { name: "c", shape: [1] }])
      assert.deepStrictEqual([missing.reason._tag, missing.tensor], ["MissingTensor", "c"])
      const shape = yield* check([{ name: "a.weight", shape: [3, 2] }, tensors[1]!])
      assert.deepStrictEqual([shape.reason._tag, shape.tensor], ["ShapeMismatch", "a.weight"])
      assert.deepStrictEqual(
        shape.reason._tag === "ShapeMismatch" ? [shape.reason.shape, shape.reason.expected] : [],
        [[2, 3], [3, 2]]
      )
      assert.match(shape.message, /has shape \[2, 3\], the model needs \[3, 2\]/)
      const extra = yield* check([tensors[0]!])
      assert.deepStrictEqual([extra.reason._tag, extra.tensor], ["UnexpectedTensor", "b"])
      const ints = yield* Safetensors.parse(
        handMade({ i: { dtype: "I64", shape: [1], data_offsets: [0, 8] } }, new Uint8Array(8))
      )
      const dtype = yield* Effect.flip(Safetensors.readFloat32(ints, "f", [{ name: "i", shape: [1] }]))
      assert.strictEqual(dtype.reason._tag, "DTypeMismatch")
      const dtypeOf = yield* Safetensors.readFloat32(ints, "f", [{ name: "i", shape: [1] }]).pipe(
        Effect.as(""),
        Effect.catchReason("SafetensorsError", "DTypeMismatch", (reason) => Effect.succeed(reason.dtype))
      )
      assert.strictEqual(dtypeOf, "I64")
    }))
})
