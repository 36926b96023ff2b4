/**
 * Checkpoints: what a save refuses (non-finite weights or moments: nothing is written) and what a load refuses (a
 * missing commit marker, a truncated tensor file, NaN weights, weights that are not the ones saved).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Checkpoint from "../../src/Checkpoint.ts"

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
      assert.strictEqual(error.reason, "NonFinite")
      assert.include(error.message, "a[1] = NaN")
      assert.isFalse(existsSync(dir) && readdirSync(dir).length > 0, "nothing written")
      const moments = state()
      moments.optimizer.v.set("b", Float32Array.from([0, Infinity, 0]))
      assert.include((yield* Effect.flip(Checkpoint.save(dir, moments))).message, "b[1] = Infinity")
      assert.isUndefined(Checkpoint.firstNonFinite([["x", Float32Array.from([0, -1, 3e38])]]))
    }).pipe(Effect.provide(NodeServices.layer)))
})
