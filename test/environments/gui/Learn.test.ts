/**
 * A vision policy trains on the GUI task through `Train.run`, end to end: a `tiny-vl` folder is initialised from the
 * preset (tower config, `visual.*` weights, preprocessor config), the warm-up learner sees the demonstrations'
 * screens (its first loss moves when only their pixels change), the sampler sees the environment's screens (at the
 * first RL step the learner's logprobs, computed with the images, equal the sampler's: approximate KL ≈ 0), the
 * checkpoints hold the tower and a resume replays a step exactly.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Train from "../../../actors/Train.ts"
import * as Eval from "../../../cli/eval.ts"
import * as Generate from "../../../examples/gui/generate.ts"
import * as GuiTask from "../../../environments/gui/GuiTask.ts"

/** One line of metrics.jsonl. */
interface Logged {
  readonly phase: string
  readonly step: number
  readonly figures: Readonly<Record<string, number>>
}

const metrics = (run: string): ReadonlyArray<Logged> =>
  readFileSync(join(run, "metrics.jsonl"), "utf8").trim().split("\n").map((line) => JSON.parse(line) as Logged)

/** The tensor names of a safetensors file (its JSON header). */
const tensorNames = (file: string): ReadonlyArray<string> => {
  const bytes = readFileSync(file)
  const length = Number(bytes.readBigUInt64LE(0))
  return Object.keys(JSON.parse(bytes.subarray(8, 8 + length).toString("utf8"))).filter((k) => k !== "__metadata__")
}

/** A 64×64 PNG of one colour, as a `data:` URL: a screen of the same size (same pads) that shows nothing. */
const blank = (() => {
  const canvas = createCanvas(64, 64)
  const context = canvas.getContext("2d")
  context.fillStyle = "#808080"
  context.fillRect(0, 0, 64, 64)
  return `data:image/png;base64,${canvas.toBuffer("image/png").toString("base64")}`
})()

describe("a tiny-vl policy on the GUI task through Train.run", () => {
  it.live("images reach the warm-up learner, the sampler and the RL learner; checkpoints keep the tower", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "gui-learn-"))
      yield* Generate.write({
        ...Generate.defaults,
        dir: join(dir, "data"),
        seed: 7,
        train: 8,
        heldOut: 2,
        validation: 0,
        demos: 8,
        noise: 0,
        kinds: ["click"]
      }).pipe(Effect.provide(NodeServices.layer))
      // The same demonstrations with every screen replaced by a blank one of the same size: same ids, other pixels.
      const demos = readFileSync(join(dir, "data", "demos.jsonl"), "utf8")
      writeFileSync(join(dir, "data", "blank.jsonl"), demos.replace(/data:image\/png;base64,[A-Za-z0-9+/=]+/g, blank))
      assert.notStrictEqual(readFileSync(join(dir, "data", "blank.jsonl"), "utf8"), demos)
      const quiet = { write: () => {}, tty: false }
      const config = (output: string, demoFile: string) => ({
        seed: 1,
        output,
        model: { path: "model", preset: "tiny-vl" as const, initSeed: 1 },
        data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
        agent: { numChains: 2, maxTurns: 2, maxNewTokens: 16 },
        warmup: { data: demoFile, steps: 2, batchSize: 4, lr: 0.002 },
        // A non-group-relative estimator with an entropy bonus trains whatever the untrained policy's rewards.
        algorithm: {
          steps: 2,
          groupsPerStep: 1,
          microBatchSize: 4,
          lr: 0.001,
          advantage: "reinforce++" as const,
          entropyCoef: 0.01
        },
        eval: { every: 100, size: 2 },
        checkpoint: { every: 1, keep: 3 }
      })
      const run = yield* Train.run({ task: GuiTask.make(), dir, config: config("a", "data/demos.jsonl"), ...quiet })
      const a = join(dir, "a")
      const logged = metrics(a)
      const warm = (ms: ReadonlyArray<Logged>) => ms.find((m) => m.phase === "warmup" && m.step === 1)!
      // Pixels reach the warm-up learner: blank screens, same tokens, give another first loss.
      yield* Train.run({ task: GuiTask.make(), dir, config: config("b", "data/blank.jsonl"), ...quiet })
      const first = warm(logged).figures["warmup/loss"]!
      const blanked = warm(metrics(join(dir, "b"))).figures["warmup/loss"]!
      assert.isTrue(Number.isFinite(first) && Number.isFinite(blanked))
      assert.isAbove(Math.abs(first - blanked), 1e-4, `warm-up loss ${first} with screens, ${blanked} with blank ones`)
      // The rollouts' prompts hold the environment's screens as image spans of 16 pads (64×64, 8-pixel patches, 2×2).
      const sample = JSON.parse(readFileSync(join(a, "samples.jsonl"), "utf8").split("\n")[0]!) as {
        spans: Array<{ tokens: Array<string>; image?: { width: number; height: number } }>
      }
      const images = sample.spans.filter((s) => s.image !== undefined)
      assert.isAbove(images.length, 0)
      assert.deepStrictEqual(images.map((s) => [s.image!.width, s.tokens.length]), images.map(() => [64, 16]))
      // The sampler saw the screens: the learner's logprobs (with the images) are the sampler's at step 1.
      const step1 = logged.find((m) => m.phase === "train" && m.step === 1)!.figures
      assert.strictEqual(step1["learner/optimizer_steps"], 1)
      assert.isBelow(Math.abs(step1["learner/approx_kl"]!), 1e-4, JSON.stringify(step1))
      // Checkpoints hold the tower; a resume from step 1 replays step 2 exactly.
      const names = tensorNames(join(a, "checkpoints", "step-000002", "model.safetensors"))
      assert.include(names, "visual.patch_embed.proj.weight")
      assert.include(names, "visual.merger.mlp.2.weight")
      rmSync(join(a, "checkpoints", "step-000002"), { recursive: true })
      const again = config("a", "data/demos.jsonl")
      const resumed = yield* Train.run({ task: GuiTask.make(), dir, config: again, resume: true, ...quiet })
      assert.strictEqual(resumed.summary.fromStep, 1)
      assert.strictEqual(resumed.summary.fingerprint, run.summary.fingerprint)
      // `agentfly eval` runs the checkpoint's tower on the screens (it refused the folder's visual.* weights).
      writeFileSync(join(dir, "eval.json"), JSON.stringify({ ...again, task: "gui" }))
      const scored = yield* Eval.run({
        config: join(dir, "eval.json"),
        checkpoint: join(a, "checkpoints", "step-000002"),
        write: () => {}
      }).pipe(Effect.provide(NodeServices.layer))
      assert.strictEqual(scored.questions, 2)
      assert.strictEqual(scored.figures["eval/trajectories"], 2)
    }), { timeout: 240_000 })
})
