/**
 * `agentfly train --resume` and `agentfly eval --checkpoint` on the real parts (tiny Qwen2 policy on onnxruntime,
 * calculator task), against damaged checkpoints: a truncated newest checkpoint makes the resume fall back to the
 * previous one (saying so) and end with the unbroken run's weights; a checkpoint with NaN weights, or weights that
 * are not the journal's, is refused with a typed error; a changed seed is refused unless forced. And against
 * signals, in a child process as a user sends them: SIGTERM during the warm-up and Ctrl-C (SIGINT) during RL stop
 * the run saying what was saved and how to resume, and the resume finishes it.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readFileSync, truncateSync, writeFileSync } from "node:fs"
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
import { agentfly, calculatorRun } from "../utils/agentfly.ts"

const stepsIn = (run: string) =>
  Effect.map(Journal.read(join(run, "journal.jsonl")), (r) =>
    r.entries.flatMap((e) => (e.entry.kind === "step" ? [e.entry.step] : [])))

describe("agentfly train --resume", () => {
  it.live(
    "falls back from a truncated checkpoint, refuses NaN or altered weights and a changed seed",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "resume-"))
        yield* Generate.write({
          dir: join(dir, "data"),
          seed: 4,
          train: 16,
          heldOut: 4,
          validation: 2,
          demos: 4,
          noise: 0
        })
        writeFileSync(
          join(dir, "config.json"),
          JSON.stringify({
            seed: 5,
            output: "run",
            model: { path: "model", preset: "tiny", initSeed: 2 },
            data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
            task: "calculator",
            agent: {
              systemPrompt: "Use the calculator tool.",
              renderTools: false,
              maxTurns: 2,
              numChains: 2,
              maxNewTokens: 24
            },
            algorithm: { steps: 3, groupsPerStep: 2, lr: 0.01, entropyCoef: 0.01, advantage: "reinforce++" },
            eval: { every: 3, size: 2 },
            checkpoint: { every: 1, keep: 3 }
          })
        )
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
        assert.match(
          lines.join(""),
          /resuming from step-000002 \(step 2\), the newest intact checkpoint; refused: step-000003: /
        )
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
              Safetensors.serialize(specs.map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })), {
                format: "pt"
              })
            )
            if (restamp) {
              // Forge the state file's fingerprint too: only the journal can tell.
              const stateFile = join(ckpt(step), "trainer_state.json")
              writeFileSync(
                stateFile,
                JSON.stringify({
                  ...JSON.parse(readFileSync(stateFile, "utf8")),
                  weightsHash: Checkpoint.fingerprint(weights)
                })
              )
            }
          })
        const first = specs[0]!.name
        yield* rewrite(3, (w) => void (w.get(first)![0] = Number.NaN), false)
        const nan = yield* Effect.flip(Eval.run({ config, checkpoint: ckpt(3), ...quiet }))
        assert.strictEqual((nan as Checkpoint.CheckpointError).reason._tag, "NonFinite")
        assert.include((nan as Error).message, `${first}[0] = NaN`)

        yield* rewrite(2, (w) => void (w.get(first)![0] = w.get(first)![0]! + 0.5), true)
        const altered = yield* Effect.flip(Eval.run({ config, checkpoint: ckpt(2), ...quiet }))
        assert.strictEqual((altered as Checkpoint.CheckpointError).reason._tag, "Corrupt")
        assert.include((altered as Error).message, "are not the ones the run's journal recorded")
        lines.length = 0
        const fallback = yield* Train.run({ config, output: b, resume: true, ...quiet })
        assert.strictEqual(fallback.summary.fromStep, 1)
        assert.match(lines.join(""), /refused: step-000003: .*NaN.*; step-000002: its weights \(fingerprint/)
        assert.strictEqual(fallback.summary.fingerprint, reference.summary.fingerprint)

        // Another seed is another run.
        const reseeded = yield* Effect.flip(Train.run({ config, output: b, resume: true, seed: 6, ...quiet }))
        assert.strictEqual((reseeded as { reason: { _tag: string } }).reason._tag, "Resume")
        assert.include((reseeded as Error).message, "seed: 5 → 6")
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)),
    180_000
  )

  it.live(
    "SIGTERM in the warm-up and SIGINT in RL stop the run cleanly, saying what a resume starts from",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "interrupt-"))
        yield* Generate.write({
          dir: join(dir, "data"),
          seed: 4,
          train: 16,
          heldOut: 4,
          validation: 2,
          demos: 64,
          noise: 0
        })
        const config = join(dir, "config.json")
        writeFileSync(
          config,
          JSON.stringify(calculatorRun(
            {
              seed: 5,
              output: "run",
              // The format term gives the chains of a warmed-up policy rewards that differ: every RL step trains.
              task: { name: "calculator", options: { toolCallFormat: 0.2 } },
              // Two learner threads (the default), busy with SFT steps the whole warm-up.
              warmup: { data: "data/demos.jsonl", steps: 60, batchSize: 8, lr: 0.003 },
              algorithm: { steps: 4, groupsPerStep: 2, lr: 0.01, advantage: "reinforce++" },
              eval: { every: 4, size: 2 },
              checkpoint: { every: 2 }
            },
            { maxNewTokens: 64 }
          ))
        )
        const records = () => {
          const file = join(dir, "run", "metrics.jsonl")
          if (!existsSync(file)) return []
          return readFileSync(file, "utf8").split("\n").filter((l) => l.endsWith("}")).map((l) => JSON.parse(l))
        }
        const resumeLine = `to resume: agentfly train ${config} --resume`

        const warm = yield* agentfly(["train", config], () => records().length >= 2, "SIGTERM")
        assert.strictEqual(warm.code, 130, warm.output)
        assert.include(warm.output, "SIGTERM: stopping")
        assert.notInclude(warm.output, "Napi")
        assert.match(
          warm.output,
          /interrupted during the warm-up, after its step \d+ of 60: no checkpoint yet \(the first, step-000000, is written when the warm-up ends\), so a resume starts the run over/
        )
        assert.include(warm.output, resumeLine)

        const rl = yield* agentfly(
          ["train", config, "--resume"],
          () => records().some((r) => r.phase === "train"),
          "SIGINT"
        )
        assert.strictEqual(rl.code, 130, rl.output)
        assert.include(rl.output, "SIGINT: stopping")
        assert.match(rl.output, /has no checkpoint yet .*: the run starts over/)
        assert.notInclude(rl.output, "Napi")
        assert.match(
          rl.output,
          /interrupted after step [1-4] of 4: its newest checkpoint is \S+step-00000[024] \(step [024]\), which a resume continues from/
        )
        assert.include(rl.output, resumeLine)

        const done = yield* agentfly(["train", config, "--resume"])
        assert.strictEqual(done.code, 0, done.output)
        assert.match(done.output, /resuming \S+ from step-00000[024]/)
        assert.match(done.output, /trained [1-4] of 4 steps/)
        assert.deepStrictEqual(yield* stepsIn(join(dir, "run")), [1, 2, 3, 4])
      }).pipe(Effect.provide(NodeServices.layer)),
    300_000
  )
})
