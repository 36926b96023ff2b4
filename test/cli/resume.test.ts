/**
 * `agentfly train --resume` and `agentfly eval --checkpoint` on the real parts (tiny Qwen2 policy on onnxruntime,
 * calculator task), against damaged checkpoints: a truncated newest checkpoint makes the resume fall back to the
 * previous one (saying so) and end with the unbroken run's weights; a checkpoint with NaN weights, or weights that
 * are not the journal's, is refused with a typed error; a changed seed is refused unless forced.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { readFileSync, truncateSync, writeFileSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as Eval from "../../cli/eval.ts"
import * as Train from "../../cli/train.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Safetensors from "../../src/Safetensors.ts"

const stepsIn = (run: string) =>
  Effect.map(Journal.read(join(run, "journal.jsonl")), (r) =>
    r.entries.flatMap((e) => (e.entry.kind === "step" ? [e.entry.step] : [])))

describe("agentfly train --resume", () => {
  it.live("falls back from a truncated checkpoint, refuses NaN or altered weights and a changed seed", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "resume-"))
      yield* Generate.write({ dir: join(dir, "data"), seed: 4, train: 16, heldOut: 4, validation: 2, demos: 4, noise: 0 })
      writeFileSync(join(dir, "config.json"), JSON.stringify({
        seed: 5,
        output: "run",
        model: { path: "model", preset: "tiny", initSeed: 2 },
        data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
        task: "calculator",
        agent: { systemPrompt: "Use the calculator tool.", renderTools: false, maxTurns: 2, numChains: 2, maxNewTokens: 24 },
        algorithm: { steps: 3, groupsPerStep: 2, lr: 0.01, entropyCoef: 0.01, advantage: "reinforce++" },
        eval: { every: 3, size: 2 },
        checkpoint: { every: 1, keep: 3 }
      }))
      const config = join(dir, "config.json")
      const lines: Array<string> = []
      const quiet = { write: (t: string) => void lines.push(t), tty: false }
      const a = join(dir, "a")
      const b = join(dir, "b")
      const reference = yield* Train.run({ config, output: a, ...quiet })
      yield* Train.run({ config, output: b, ...quiet })

      // The newest checkpoint cut short: the resume goes on from step 2, says so, and replays step 3 exactly.
      truncateSync(join(b, "checkpoints", "step-000003", "model.safetensors"), 1000)
      lines.length = 0
      const resumed = yield* Train.run({ config, output: b, resume: true, ...quiet })
      assert.strictEqual(resumed.summary.fromStep, 2)
      assert.match(lines.join(""), /resuming from step-000002 \(step 2\), the newest intact checkpoint; refused: step-000003: /)
      assert.strictEqual(resumed.summary.fingerprint, reference.summary.fingerprint)
      assert.deepStrictEqual(yield* stepsIn(b), [1, 2, 3])

      // NaN weights: refused by eval and by a resume (which falls back to step 2 again).
      const specs = Qwen2.parameters((yield* ModelFolder.load(join(dir, "model"))).config)
      const ckpt = (step: number) => join(b, "checkpoints", `step-00000${step}`)
      const rewrite = (step: number, edit: (w: Map<string, Float32Array>) => void, restamp: boolean) =>
        Effect.gen(function*() {
          const loaded = yield* Checkpoint.load(ckpt(step), specs)
          const weights = new Map([...loaded.weights].map(([k, v]) => [k, Float32Array.from(v)]))
          edit(weights)
          writeFileSync(
            join(ckpt(step), "model.safetensors"),
            Safetensors.serialize(specs.map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })), { format: "pt" })
          )
          if (restamp) {
            // Forge the state file's fingerprint too: only the journal can tell.
            const stateFile = join(ckpt(step), "trainer_state.json")
            writeFileSync(stateFile, JSON.stringify({ ...JSON.parse(readFileSync(stateFile, "utf8")), weightsHash: Checkpoint.fingerprint(weights) }))
          }
        })
      const first = specs[0]!.name
      yield* rewrite(3, (w) => void (w.get(first)![0] = Number.NaN), false)
      const nan = yield* Effect.flip(Eval.run({ config, checkpoint: ckpt(3), ...quiet }))
      assert.strictEqual((nan as Checkpoint.CheckpointError).reason, "NonFinite")
      assert.include((nan as Error).message, `${first}[0] = NaN`)

      yield* rewrite(2, (w) => void (w.get(first)![0] = w.get(first)![0]! + 0.5), true)
      const altered = yield* Effect.flip(Eval.run({ config, checkpoint: ckpt(2), ...quiet }))
      assert.strictEqual((altered as Checkpoint.CheckpointError).reason, "Corrupt")
      assert.include((altered as Error).message, "are not the ones the run's journal recorded")
      lines.length = 0
      const fallback = yield* Train.run({ config, output: b, resume: true, ...quiet })
      assert.strictEqual(fallback.summary.fromStep, 1)
      assert.match(lines.join(""), /refused: step-000003: .*NaN.*; step-000002: its weights \(fingerprint/)
      assert.strictEqual(fallback.summary.fingerprint, reference.summary.fingerprint)

      // Another seed is another run.
      const reseeded = yield* Effect.flip(Train.run({ config, output: b, resume: true, seed: 6, ...quiet }))
      assert.strictEqual((reseeded as { reason: string }).reason, "Resume")
      assert.include((reseeded as Error).message, "seed: 5 → 6")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 180_000)
})
