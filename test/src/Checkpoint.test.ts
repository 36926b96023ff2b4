/**
 * Checkpoints: what a save refuses (non-finite weights or moments: nothing is written) and what a load refuses (a
 * missing commit marker, a truncated tensor file, NaN weights, weights that are not the ones saved).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Safetensors from "../../src/Safetensors.ts"

const specs = [{ name: "a", shape: [2, 2] }, { name: "b", shape: [3] }]

const state = (a: ArrayLike<number> = [1, 2, 3, 4]): Checkpoint.State => ({
  weights: [
    { name: "a", shape: [2, 2], data: Float32Array.from(a) },
    { name: "b", shape: [3], data: Float32Array.from([5, 6, 7]) }
  ],
  optimizer: {
    step: 3,
    m: new Map([["a", new Float32Array(4)], ["b", new Float32Array(3)]]),
    v: new Map([["a", new Float32Array(4)], ["b", new Float32Array(3)]])
  },
  policyVersion: 3,
  rngState: []
})

describe("Checkpoint", () => {
  it.effect("a save with a non-finite weight or moment is refused and writes nothing", () =>
    Effect.gen(function*() {
      const dir = join(mkdtempSync(join(tmpdir(), "checkpoint-")), "step-1")
      const error = yield* Effect.flip(Checkpoint.save(dir, state([1, Number.NaN, 3, 4])))
      assert.strictEqual(error.reason._tag, "NonFinite")
      assert.include(error.message, "a[1] = NaN")
      assert.isFalse(existsSync(dir) && readdirSync(dir).length > 0, "nothing written")
      const moments = state()
      moments.optimizer.v.set("b", Float32Array.from([0, Infinity, 0]))
      assert.include((yield* Effect.flip(Checkpoint.save(dir, moments))).message, "b[1] = Infinity")
      assert.isUndefined(Checkpoint.firstNonFinite([["x", Float32Array.from([0, -1, 3e38])]]))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a load checks what it read: a truncated file, NaN weights and altered weights are typed errors", () =>
    Effect.gen(function*() {
      const base = mkdtempSync(join(tmpdir(), "checkpoint-"))
      const saved = (name: string) =>
        Effect.as(Checkpoint.save(join(base, name), state()), join(base, name))
      const intact = yield* saved("intact")
      const loaded = yield* Checkpoint.load(intact, specs)
      assert.deepStrictEqual(Array.from(loaded.weights.get("a")!), [1, 2, 3, 4])
      assert.strictEqual(loaded.weightsHash, Checkpoint.fingerprint(loaded.weights))

      const truncated = yield* saved("truncated")
      const bytes = readFileSync(join(truncated, "model.safetensors"))
      writeFileSync(join(truncated, "model.safetensors"), bytes.subarray(0, bytes.length - 5))
      const corrupt = yield* Effect.flip(Checkpoint.load(truncated, specs))
      assert.strictEqual(corrupt.reason._tag, "Corrupt")
      assert.strictEqual(corrupt.path, join(truncated, "model.safetensors"))
      assert.strictEqual((corrupt.reason.cause as { _tag?: string })._tag, "SafetensorsError") // why it is unreadable
      const missing = yield* Checkpoint.load(join(truncated, "nowhere"), specs).pipe(
        Effect.as(""),
        Effect.catchReason("CheckpointError", "NotFound", (reason) => Effect.succeed(reason.message))
      )
      assert.strictEqual(missing, `no checkpoint at ${join(truncated, "nowhere")}`)

      const rewrite = (dir: string, a: ArrayLike<number>) =>
        writeFileSync(join(dir, "model.safetensors"), Safetensors.serialize(state(a).weights, { format: "pt" }))
      const nan = yield* saved("nan")
      rewrite(nan, [1, 2, Number.NaN, 4])
      const nanError = yield* Effect.flip(Checkpoint.load(nan, specs))
      assert.strictEqual(nanError.reason._tag, "NonFinite")
      assert.include(nanError.message, "a[2] = NaN")

      const altered = yield* saved("altered")
      rewrite(altered, [1, 2, 3, 4.000001])
      const alteredError = yield* Effect.flip(Checkpoint.load(altered, specs))
      assert.strictEqual(alteredError.reason._tag, "Corrupt")
      assert.include(alteredError.message, "does not hold the weights saved")

      // A checkpoint written before the state file carried a fingerprint still loads (nothing to compare with).
      const legacy = yield* saved("legacy")
      const stateFile = join(legacy, "trainer_state.json")
      const { weightsHash: _, ...old } = JSON.parse(readFileSync(stateFile, "utf8"))
      writeFileSync(stateFile, JSON.stringify(old))
      rewrite(legacy, [1, 2, 3, 5])
      assert.deepStrictEqual(Array.from((yield* Checkpoint.load(legacy, specs)).weights.get("a")!), [1, 2, 3, 5])
    }).pipe(Effect.provide(NodeServices.layer)))
})
