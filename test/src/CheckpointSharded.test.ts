/**
 * Checkpoints of any size: weights and moments are written as Hugging Face shards past the shard limit, read back
 * bit for bit; a checkpoint written before sharding (one file each) still loads; a half-written or damaged sharded
 * checkpoint is a typed error naming the file at fault.
 */
import { NodeServices } from "@effect/platform-node"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as Safetensors from "../../src/Safetensors.ts"

const shapes = [["embed", [6, 4]], ["norm", [4]], ["proj", [4, 5]], ["head", [3, 4]]] as const
const specs = shapes.map(([name, shape]) => ({ name, shape }))

const filled = (count: number, seed: number) => Float32Array.from({ length: count }, (_, i) => Math.sin(seed * 31 + i))

const state = (): Checkpoint.State => ({
  weights: shapes.map(([name, shape], k) => ({ name, shape, data: filled(shape.reduce((a, b) => a * b, 1), k) })),
  optimizer: {
    step: 12,
    m: new Map(shapes.map(([name, shape], k) => [name, filled(shape.reduce((a, b) => a * b, 1), 10 + k)])),
    v: new Map(shapes.map(([name, shape], k) => [name, filled(shape.reduce((a, b) => a * b, 1), 20 + k).map(Math.abs)]))
  },
  policyVersion: 7,
  rngState: [1, 2, 3]
})

const made: Array<string> = []
const tempDir = () => {
  const parent = mkdtempSync(join(tmpdir(), "checkpoint-sharded-"))
  made.push(parent)
  return join(parent, "step-000012")
}
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true })
})

describe("Checkpoint: sharded", () => {
  it.effect("past the shard limit weights and moments are shards with an index; they load back bit for bit", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const saved = state()
      // 100 bytes a shard: weights [embed 96] [norm 16, proj 80] [head 48]; moments m/v in pairs, six shards.
      yield* Checkpoint.save(dir, saved, { maxShardBytes: 100 })
      const files = yield* Checkpoint.files(dir)
      assert.deepStrictEqual(files, [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "optimizer-00001-of-00006.safetensors",
        "optimizer-00002-of-00006.safetensors",
        "optimizer-00003-of-00006.safetensors",
        "optimizer-00004-of-00006.safetensors",
        "optimizer-00005-of-00006.safetensors",
        "optimizer-00006-of-00006.safetensors",
        "model.safetensors.index.json",
        "optimizer.safetensors.index.json",
        "trainer_state.json"
      ])
      assert.sameMembers(readdirSync(dir), files)
      const loaded = yield* Checkpoint.load(dir, specs)
      for (const w of saved.weights) {
        assert.deepStrictEqual(loaded.weights.get(w.name), w.data)
        assert.deepStrictEqual(loaded.optimizer.m.get(w.name), saved.optimizer.m.get(w.name))
        assert.deepStrictEqual(loaded.optimizer.v.get(w.name), saved.optimizer.v.get(w.name))
      }
      assert.deepStrictEqual([loaded.optimizer.step, loaded.policyVersion, loaded.rngState], [12, 7, [1, 2, 3]])
      const hash = Checkpoint.fingerprint(new Map(saved.weights.map((w) => [w.name, w.data])))
      assert.strictEqual(loaded.weightsHash, hash)

      // Saved again in the same place with the default limit: one file each, the shards of the first save gone.
      yield* Checkpoint.save(dir, saved)
      assert.deepStrictEqual(yield* Checkpoint.files(dir), [
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json"
      ])
      assert.sameMembers(readdirSync(dir), ["model.safetensors", "optimizer.safetensors", "trainer_state.json"])
      assert.deepStrictEqual((yield* Checkpoint.load(dir, specs)).weights.get("proj"), saved.weights[2]!.data)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("bfloat16 moments are written as BF16 shards and load back bit for bit, as bits", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const f32 = state()
      const bf16 = (moments: ReadonlyMap<string, Optimizer.Moment>) =>
        new Map([...moments].map(([k, x]) => [k, Optimizer.convertMoment(x, "bfloat16")]))
      const saved = { ...f32, optimizer: { step: 12, m: bf16(f32.optimizer.m), v: bf16(f32.optimizer.v) } }
      // 50 bytes a shard: moments in BF16 take half the bytes of F32 ones (m.embed 48, then pairs of the others).
      yield* Checkpoint.save(dir, saved, { maxShardBytes: 50 })
      const index = yield* Safetensors.readIndex(dir, "optimizer")
      assert.isAbove(index.files.length, 1)
      assert.deepStrictEqual(new Set([...index.tensors.values()].map((t) => t.dtype)), new Set(["BF16"]))
      const model = yield* Safetensors.readIndex(dir, "model")
      assert.deepStrictEqual(new Set([...model.tensors.values()].map((t) => t.dtype)), new Set(["F32"]))
      const loaded = yield* Checkpoint.load(dir, specs)
      for (const { name } of specs) {
        assert.instanceOf(loaded.optimizer.m.get(name), Uint16Array)
        assert.deepStrictEqual(loaded.optimizer.m.get(name), saved.optimizer.m.get(name))
        assert.deepStrictEqual(loaded.optimizer.v.get(name), saved.optimizer.v.get(name))
      }
      // A non-finite bfloat16 moment (exponent bits all set) is refused at the save, as a float32 one is.
      saved.optimizer.v.get("norm")![1] = 0x7f80
      const refused = yield* Effect.flip(Checkpoint.save(tempDir(), saved))
      assert.match(refused.message, /norm\[1\] = ±Infinity is not finite/)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a checkpoint written before sharding (one whole-file serialisation each) loads as it did", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      const saved = state()
      yield* Checkpoint.save(dir, saved)
      // What the earlier save wrote, byte for byte: `serialize` of the weights and of the moments.
      writeFileSync(join(dir, "model.safetensors"), Safetensors.serialize(saved.weights, { format: "pt" }))
      const moments = saved.weights.flatMap((w) => [
        { name: `m.${w.name}`, shape: w.shape, data: saved.optimizer.m.get(w.name) as Float32Array },
        { name: `v.${w.name}`, shape: w.shape, data: saved.optimizer.v.get(w.name) as Float32Array }
      ])
      writeFileSync(join(dir, "optimizer.safetensors"), Safetensors.serialize(moments))
      const loaded = yield* Checkpoint.load(dir, specs)
      assert.deepStrictEqual(loaded.optimizer.v.get("head"), saved.optimizer.v.get("head"))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("half-written or damaged shards are Incomplete or Corrupt, naming the file", () =>
    Effect.gen(function*() {
      const dir = tempDir()
      yield* Checkpoint.save(dir, state(), { maxShardBytes: 100 })
      const failure = Effect.flip(Checkpoint.load(dir, specs))
      const indexFile = join(dir, "optimizer.safetensors.index.json")
      const index = readFileSync(indexFile)

      // A crash before the index was written: shards but no index, and no single file either.
      rmSync(indexFile)
      const noIndex = yield* failure
      assert.deepStrictEqual([noIndex.reason._tag, noIndex.path, noIndex.message], [
        "Incomplete",
        join(dir, "optimizer.safetensors"),
        `${join(dir, "optimizer.safetensors")} is missing`
      ])
      writeFileSync(indexFile, index)

      const shard = join(dir, "optimizer-00004-of-00006.safetensors")
      const bytes = readFileSync(shard)
      writeFileSync(shard, bytes.subarray(0, bytes.length - 4))
      const truncated = yield* failure
      assert.deepStrictEqual([truncated.reason._tag, truncated.path], ["Corrupt", shard])
      assert.match(truncated.message, /outside the \d+ data bytes \(truncated\?\)/)

      rmSync(shard)
      const missing = yield* failure
      assert.deepStrictEqual([missing.reason._tag, missing.path], ["Incomplete", shard])
      assert.include(missing.message, "lists shard optimizer-00004-of-00006.safetensors, which is missing")
      writeFileSync(shard, bytes)
      assert.strictEqual((yield* Checkpoint.load(dir, specs)).optimizer.step, 12)

      // A weight shard altered after the save: read, then refused by the saved fingerprint, naming the index.
      const first = join(dir, "model-00001-of-00003.safetensors")
      const weights = readFileSync(first)
      weights[weights.length - 1] = weights[weights.length - 1]! ^ 1
      writeFileSync(first, weights)
      const altered = yield* failure
      const named = join(dir, "model.safetensors.index.json")
      assert.deepStrictEqual([altered.reason._tag, altered.path], ["Corrupt", named])
      assert.include(altered.message, "does not hold the weights saved")
    }).pipe(Effect.provide(NodeServices.layer)))

  it("a copy of a checkpoint (a remote trainer's) takes only its files' names, shards first, the state file last", () => {
    const sharded = ["optimizer.safetensors", "model.safetensors.index.json", "model-00002-of-00002.safetensors",
      "model-00001-of-00002.safetensors"]
    assert.deepStrictEqual(Checkpoint.inWriteOrder(sharded), [
      "model-00001-of-00002.safetensors",
      "model-00002-of-00002.safetensors",
      "optimizer.safetensors",
      "model.safetensors.index.json",
      "trainer_state.json"
    ])
    assert.strictEqual(Checkpoint.missingPart([...sharded, "trainer_state.json"]), undefined)
    assert.strictEqual(Checkpoint.missingPart(["model.safetensors", "trainer_state.json"]), "optimizer.safetensors")
    assert.strictEqual(Checkpoint.missingPart(["optimizer.safetensors"]), "model.safetensors")
    for (const stranger of ["../model.safetensors", "model.safetensors/x", "notes.txt", "model.bin", "/etc/passwd"]) {
      assert.isFalse(Checkpoint.isFileName(stranger), stranger)
    }
    assert.isTrue(Checkpoint.isFileName("optimizer-00003-of-00004.safetensors"))
  })
})
