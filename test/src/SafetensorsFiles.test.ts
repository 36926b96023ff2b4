import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Layer, PlatformError } from "effect"
import {
  closeSync,
  ftruncateSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
  writeSync
} from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as FloatCodec from "../../src/internal/floatCodec.ts"
import * as Safetensors from "../../src/Safetensors.ts"

const tempDir = () => mkdtempSync(join(tmpdir(), "safetensors-files-"))

/** Deterministic values spanning many magnitudes and both signs, with odd lengths. */
const values = (count: number, seed: number): Float32Array => {
  const out = new Float32Array(count)
  let s = seed >>> 0 || 1
  for (let i = 0; i < count; i++) {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5
    out[i] = ((s >>> 0) / 4294967296 - 0.5) * Math.pow(2, (i % 40) - 20)
  }
  return out
}

const tensors = [
  { name: "embed", shape: [7, 5], data: values(35, 1) },
  { name: "norm", shape: [3], data: values(3, 2) },
  { name: "proj", shape: [5, 9], data: values(45, 3) },
  { name: "head", shape: [2, 11], data: values(22, 4) }
]
const expected = tensors.map(({ name, shape }) => ({ name, shape }))

/** A safetensors file built by hand: header at the front, `data` after it. */
const handMade = (header: Record<string, unknown>, data: Uint8Array): Uint8Array => {
  const json = new TextEncoder().encode(JSON.stringify(header))
  const out = new Uint8Array(8 + json.length + data.length)
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true)
  out.set(json, 8)
  out.set(data, 8 + json.length)
  return out
}

/** The reference narrowing, one value at a time through a DataView, as PyTorch rounds (nearest, ties to even). */
const referenceBf16 = (x: number): number => {
  const view = new DataView(new ArrayBuffer(4))
  view.setFloat32(0, x)
  const u = view.getUint32(0)
  if (Number.isNaN(x)) return (u >>> 16) | 0x40
  const lower = u & 0xffff, upper = u >>> 16
  const up = lower > 0x8000 || (lower === 0x8000 && (upper & 1) === 1)
  return (upper + (up ? 1 : 0)) & 0xffff
}

const fromBf16 = (bits: number): number => {
  const view = new DataView(new ArrayBuffer(4))
  view.setUint32(0, bits << 16)
  return view.getFloat32(0)
}

describe("Safetensors files", () => {
  it.effect("writeSharded then readIndex/readTensors round-trips F32 bit for bit, in one file or in shards", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const single = yield* Safetensors.writeSharded(dir, "model", tensors, { metadata: { format: "pt" } })
      assert.deepStrictEqual(single.files, [join(dir, "model.safetensors")])
      assert.isUndefined(single.index)
      const one = yield* Safetensors.readFloat32Files(dir, expected)
      for (const t of tensors) assert.deepStrictEqual(one.get(t.name), t.data)

      // 200 data bytes a shard: embed (140) | norm (12) + proj (180) would pass it | proj | head.
      const sharded = yield* Safetensors.writeSharded(dir, "model", tensors, { maxShardBytes: 200 })
      assert.deepStrictEqual(sharded.files.map((f) => f.slice(dir.length + 1)), [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors"
      ])
      const index = JSON.parse(readFileSync(join(dir, "model.safetensors.index.json"), "utf8"))
      assert.deepStrictEqual(index.weight_map, {
        embed: "model-00001-of-00003.safetensors",
        norm: "model-00001-of-00003.safetensors",
        proj: "model-00002-of-00003.safetensors",
        head: "model-00003-of-00003.safetensors"
      })
      assert.strictEqual(index.metadata.total_size, 4 * (35 + 3 + 45 + 22))
      // The single file of the earlier save is gone: no stale weights beside the index.
      assert.notInclude(readdirSync(dir), "model.safetensors")
      const read = yield* Safetensors.readFloat32Files(dir, expected)
      for (const t of tensors) assert.deepStrictEqual(read.get(t.name), t.data)

      // Back to one file: the index is removed first and the old shards after.
      yield* Safetensors.writeSharded(dir, "model", tensors)
      assert.deepStrictEqual(readdirSync(dir).sort(), ["model.safetensors"])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("BF16 is narrowed with round-to-nearest-even and widened back exactly; F16 and F64 are read too", () =>
    Effect.gen(function*() {
      const special = Float32Array.from([
        1 + 2 ** -8, // a tie: rounds to the even 1
        1 + 3 * 2 ** -8, // a tie: rounds up to the even 1 + 2^-6
        1 + 2 ** -8 + 2 ** -20, // past the tie: rounds up
        -0,
        Infinity,
        -Infinity,
        NaN,
        3.4e38, // rounds past the largest BF16: Infinity, as PyTorch does
        1e-40 // subnormal
      ])
      const all = [...tensors, { name: "special", shape: [special.length], data: special }]
      const dir = tempDir()
      yield* Safetensors.writeSharded(dir, "model", all, { dtype: "BF16", maxShardBytes: 64 })
      const read = yield* Safetensors.readFloat32Files(dir, all.map(({ name, shape }) => ({ name, shape })))
      for (const t of all) {
        const got = read.get(t.name)!
        t.data.forEach((x, i) => assert.deepStrictEqual(got[i], fromBf16(referenceBf16(x)), `${t.name}[${i}]`))
      }
      assert.deepStrictEqual(Array.from(read.get("special")!.subarray(0, 3)), [1, 1 + 2 ** -6, 1 + 2 ** -7])
      assert.isTrue(Object.is(read.get("special")![3], -0))
      assert.isTrue(Number.isNaN(read.get("special")![6]!))
      assert.strictEqual(read.get("special")![7], Infinity)

      // F16 and F64 on disk (odd counts, odd offsets), as the in-memory reader widens them.
      const f16 = Uint16Array.from([0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555])
      const f64 = Float64Array.from([0.1, -2.5, 1e-3])
      const bytes = handMade({
        __metadata__: { format: "pt" },
        h: { dtype: "F16", shape: [5], data_offsets: [0, 10] },
        d: { dtype: "F64", shape: [3], data_offsets: [10, 34] }
      }, new Uint8Array([...new Uint8Array(f16.buffer), ...new Uint8Array(f64.buffer)]))
      writeFileSync(join(dir, "mixed.safetensors"), bytes)
      const specs = [{ name: "h", shape: [5] }, { name: "d", shape: [3] }]
      const fromDisk = yield* Safetensors.readFloat32Files(dir, specs, "mixed")
      const inMemory = yield* Safetensors.readFloat32(yield* Safetensors.parse(bytes), "m", specs)
      assert.deepStrictEqual(fromDisk.get("h"), inMemory.get("h"))
      assert.deepStrictEqual(Array.from(fromDisk.get("h")!.subarray(0, 4)), [1, -2, 2 ** -24, Infinity])
      assert.deepStrictEqual(fromDisk.get("d"), Float32Array.from(f64))
      assert.closeTo(fromDisk.get("h")![4]!, 1 / 3, 1e-3)
    }).pipe(Effect.provide(NodeServices.layer)))

  it("the fast BF16 kernels agree with the per-value reference on every odd length", () => {
    for (const n of [1, 2, 3, 17, 1000]) {
      const x = values(n, n)
      const bits = new Uint16Array(n)
      FloatCodec.narrowBf16(x, bits)
      x.forEach((v, i) => assert.strictEqual(bits[i], referenceBf16(v)))
      const back = new Float32Array(n + 3)
      FloatCodec.widenBf16(bits, back, 2)
      bits.forEach((b, i) => assert.strictEqual(back[i + 2], fromBf16(b)))
      assert.strictEqual(back[0], 0)
      assert.strictEqual(back[n + 2], 0)
    }
  })

  it.effect("a tensor past 2 GiB of a sparse 2.2 GB file is read (no whole-file buffer, no 2 GiB ceiling)", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const file = join(dir, "model.safetensors")
      const far = 2_200_000_000
      const near = Float32Array.from([1, 2, 3]), farValues = Float32Array.from([4.5, -6, 7.25, 8])
      const header = handMade({
        near: { dtype: "F32", shape: [3], data_offsets: [0, 12] },
        far: { dtype: "F32", shape: [2, 2], data_offsets: [far, far + 16] }
      }, new Uint8Array(near.buffer))
      const fd = openSync(file, "w")
      writeSync(fd, header)
      const dataStart = header.length - 12
      ftruncateSync(fd, dataStart + far + 16)
      writeSync(fd, new Uint8Array(farValues.buffer), 0, 16, dataStart + far)
      closeSync(fd)
      const specs = [{ name: "near", shape: [3] }, { name: "far", shape: [2, 2] }]
      const read = yield* Safetensors.readFloat32Files(dir, specs)
      assert.deepStrictEqual(read.get("near"), near)
      assert.deepStrictEqual(read.get("far"), farValues)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a failed read names its cause: no such file, a directory, permission, truncation, a bad header", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const reason = <R>(effect: Effect.Effect<unknown, Safetensors.SafetensorsError, R>) =>
        Effect.map(Effect.flip(effect), (e) => [e.reason._tag, e.message, e.file, e.tensor] as const)

      const missing = yield* reason(Safetensors.readHeader(join(dir, "nope.safetensors")))
      assert.deepStrictEqual(missing.slice(0, 3), [
        "NotFound",
        `cannot read ${join(dir, "nope.safetensors")}: no such file`,
        join(dir, "nope.safetensors")
      ])
      const directory = yield* reason(Safetensors.readHeader(dir))
      assert.deepStrictEqual(directory.slice(0, 2), ["NotAFile", `cannot read ${dir}: it is a directory`])

      // Tests run as root here, where chmod cannot deny a read: the platform's answer is faked instead.
      const denied = yield* reason(Safetensors.readHeader("/secret.safetensors")).pipe(
        Effect.provide(FileSystem.layerNoop({
          stat: (path) =>
            Effect.fail(PlatformError.systemError({
              _tag: "PermissionDenied",
              module: "FileSystem",
              method: "stat",
              pathOrDescriptor: path
            }))
        }))
      )
      assert.deepStrictEqual(denied.slice(0, 2), [
        "PermissionDenied",
        "cannot read /secret.safetensors: permission denied"
      ])

      yield* Safetensors.writeSharded(dir, "model", tensors)
      const whole = readFileSync(join(dir, "model.safetensors"))
      writeFileSync(join(dir, "model.safetensors"), whole.subarray(0, whole.length - 30))
      const truncated = yield* reason(Safetensors.readFloat32Files(dir, expected))
      assert.strictEqual(truncated[0], "Corrupt")
      assert.match(truncated[1], /tensor "head" spans bytes \[332, 420\) outside the 390 data bytes \(truncated\?\)/)
      assert.strictEqual(truncated[3], "head")

      const badJson = new Uint8Array(whole)
      badJson[9] = "!".charCodeAt(0)
      writeFileSync(join(dir, "model.safetensors"), badJson)
      const header = yield* reason(Safetensors.readFloat32Files(dir, expected))
      const notJson = `${join(dir, "model.safetensors")}: the header is not valid JSON`
      assert.deepStrictEqual(header.slice(0, 2), ["Corrupt", notJson])

      const huge = new Uint8Array(16)
      new DataView(huge.buffer).setBigUint64(0, 2n ** 40n, true)
      writeFileSync(join(dir, "model.safetensors"), huge)
      const length = yield* reason(Safetensors.readFloat32Files(dir, expected))
      assert.strictEqual(length[0], "Corrupt")
      assert.match(length[1], /header length 1099511627776 exceeds the file size 16/)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a sharded checkpoint: a missing shard, a tensor in two shards, a wrong index are typed errors", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      yield* Safetensors.writeSharded(dir, "model", tensors, { maxShardBytes: 200 })
      const indexFile = join(dir, "model.safetensors.index.json")
      const index = readFileSync(indexFile, "utf8")
      const shard = (k: number) => join(dir, `model-0000${k}-of-00003.safetensors`)
      const failure = Effect.flip(Safetensors.readFloat32Files(dir, expected))

      const third = readFileSync(shard(3))
      writeFileSync(join(dir, "aside"), third)
      rmSync(shard(3))
      const missing = yield* failure
      assert.strictEqual(missing.reason._tag, "NotFound")
      assert.strictEqual(missing.file, shard(3))
      assert.strictEqual(missing.message, `${indexFile} lists shard model-00003-of-00003.safetensors, which is missing`)

      // The third shard also holds "proj", which the second shard holds: one tensor in two shards.
      writeFileSync(shard(3), Safetensors.serialize([tensors[2]!, tensors[3]!]))
      const twice = yield* failure
      assert.strictEqual(twice.reason._tag, "DuplicateTensor")
      assert.strictEqual(twice.tensor, "proj")
      assert.deepStrictEqual(twice.reason._tag === "DuplicateTensor" && twice.reason.files, [shard(2), shard(3)])

      writeFileSync(shard(3), third)
      const { norm: _, ...unlisted } = JSON.parse(index).weight_map
      writeFileSync(indexFile, JSON.stringify({ weight_map: unlisted }))
      const notListed = yield* failure
      assert.strictEqual(notListed.reason._tag, "Corrupt")
      assert.strictEqual(notListed.message, `${shard(1)}: tensor "norm" is not listed in ${indexFile}`)
      writeFileSync(indexFile, index.replace(`"norm": "model-00001`, `"norm": "model-00002`))
      const wrongShard = yield* failure
      assert.strictEqual(wrongShard.reason._tag, "MissingTensor")
      assert.include(wrongShard.message, `"norm" in model-00002-of-00003.safetensors, which does not hold it`)
      writeFileSync(indexFile, "{ half")
      assert.strictEqual((yield* failure).reason._tag, "Corrupt")
      writeFileSync(indexFile, index.replace(`"model-00001-of-00003.safetensors"`, `"../elsewhere.safetensors"`))
      assert.match((yield* failure).message, /shard "\.\.\/elsewhere\.safetensors" is not a file name beside the index/)

      // Intact again, the model's expectations are checked before any data is read.
      writeFileSync(indexFile, index)
      const shape = yield* Effect.flip(
        Safetensors.readFloat32Files(dir, expected.map((e) => e.name === "proj" ? { ...e, shape: [9, 5] } : e))
      )
      assert.strictEqual(shape.reason._tag, "ShapeMismatch")
      assert.strictEqual(shape.file, shard(2))
      const extra = yield* Effect.flip(Safetensors.readFloat32Files(dir, expected.slice(0, 3)))
      assert.strictEqual(extra.reason._tag, "UnexpectedTensor")
      assert.strictEqual(extra.tensor, "head")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("files are streamed: no whole-file read, each positioned read at most 16 MiB (1 MiB for BF16)", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const big = values(5_000_001, 9) // 20 MB of F32: more than one chunk
      const specs = [{ name: "big", shape: [5_000_001] }, { name: "norm", shape: [3] }]
      const written = [{ ...specs[0]!, data: big }, { ...specs[1]!, data: values(3, 2) }]
      yield* Safetensors.writeSharded(dir, "model", written)
      yield* Safetensors.writeSharded(dir, "half", written, { dtype: "BF16" })
      const reads: Array<number> = []
      const fs = yield* FileSystem.FileSystem
      // The platform's file system, recording every read and refusing whole-file reads.
      const recording = FileSystem.FileSystem.of({
        ...fs,
        readFile: () => Effect.die("a whole-file read"),
        open: (path, options) =>
          Effect.map(fs.open(path, options), (file) =>
            Object.create(file, {
              read: {
                value: (buffer: Uint8Array, opts?: FileSystem.File.ReadOptions) => {
                  reads.push(buffer.length)
                  return file.read(buffer, opts)
                }
              }
            }) as FileSystem.File)
      })
      const layer = Layer.succeed(FileSystem.FileSystem)(recording)
      const f32 = yield* Safetensors.readFloat32Files(dir, specs).pipe(Effect.provide(layer))
      assert.deepStrictEqual(f32.get("big"), big)
      assert.strictEqual(Math.max(...reads), 16 * 1024 * 1024)
      reads.length = 0
      const bf16 = yield* Safetensors.readFloat32Files(dir, specs, "half").pipe(Effect.provide(layer))
      assert.strictEqual(bf16.get("big")![4_999_999], fromBf16(referenceBf16(big[4_999_999]!)))
      // 16-bit data goes through a 1 MiB scratch buffer: ten reads for its 10 MB.
      assert.strictEqual(Math.max(...reads), 1024 * 1024)
      assert.isAtLeast(reads.length, 10)
    }).pipe(Effect.provide(NodeServices.layer)))
})
