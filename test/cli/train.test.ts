/**
 * `agentfly train` end to end on the real parts (tiny Qwen2 policy on onnxruntime, byte tokenizer, calculator
 * tool, mathEqual reward): a run killed with SIGKILL mid-training and resumed ends with the same weights as an
 * uninterrupted run, and its journal lists every learner step and checkpoint exactly once.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import { agentfly, calculatorRun, metricsOf } from "../utils/agentfly.ts"

/** Runs `agentfly train ARGS…` in a child process (see `test/utils/agentfly.ts`). */
const train = (args: ReadonlyArray<string>, killWhen?: () => boolean) => agentfly(["train", ...args], killWhen)

const entries = (dir: string) =>
  Effect.map(Journal.read(join(dir, "journal.jsonl")), (r) => r.entries.map((e) => e.entry))

const stepsIn = (journal: ReadonlyArray<Journal.Entry>) =>
  journal.flatMap((e) => (e.kind === "step" ? [e.step] : []))

describe("agentfly train", () => {
  it.live(
    "SIGKILL mid-training, then --resume: every step once, same final weights as an uninterrupted run",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "train-resume-"))
        yield* Generate.write({
          dir: join(dir, "data"),
          seed: 5,
          train: 64,
          heldOut: 4,
          validation: 4,
          demos: 64,
          noise: 0
        })
        writeFileSync(
          join(dir, "config.json"),
          JSON.stringify(calculatorRun(
            {
              seed: 11,
              output: "run",
              // Validation checks after warm-up steps 1 and 2 publish warm-up versions to the real engine (a target of
              // 1 is out of reach, so the warm-up runs all 3 steps).
              warmup: {
                data: "data/demos.jsonl",
                steps: 3,
                batchSize: 4,
                lr: 0.003,
                stopAt: { data: "data/validation.jsonl", accuracy: 1, every: 1, size: 2 }
              },
              // An entropy bonus under a non-group-relative estimator makes every RL step move the weights, whatever
              // the (mostly zero) rewards of an untrained policy: resuming exactly is then a real test. The KL term
              // makes the resumed run depend on restoring the reference policy (the post-warm-up weights) from the
              // checkpoint.
              algorithm: {
                steps: 6,
                groupsPerStep: 2,
                microBatchSize: 4,
                lr: 0.001,
                advantage: "reinforce++",
                entropyCoef: 0.01,
                klCoef: 0.5
              },
              eval: { every: 100, size: 2 },
              checkpoint: { every: 2, keep: 2 }
            },
            { numChains: 2 }
          ))
        )
        const config = join(dir, "config.json")
        const a = join(dir, "a")
        const b = join(dir, "b")

        const full = yield* train([config, "--output", a])
        assert.strictEqual(full.code, 0, full.output)
        const reference = yield* entries(a)
        assert.deepStrictEqual(stepsIn(reference), [1, 2, 3, 4, 5, 6])

        // Kill -9 once step 3 is journaled (after checkpoint 2, before checkpoint 4).
        const killed = yield* train([config, "--output", b], () => {
          const path = join(b, "journal.jsonl")
          return existsSync(path) && readFileSync(path, "utf8").includes(`"kind":"step","step":3`)
        })
        assert.strictEqual(killed.signal, "SIGKILL", killed.output)
        const partial = stepsIn(yield* entries(b))
        assert.isTrue(partial.length >= 3 && partial.length < 6, `killed mid-run after steps ${partial}`)

        const resumed = yield* train([config, "--output", b, "--resume"])
        assert.strictEqual(resumed.code, 0, resumed.output)
        // The closing line covers the whole run, not only the resumed part.
        assert.match(resumed.output, /held-out accuracy [\d.]+ ± [\d.]+ \(step 0\) → [\d.]+ ± [\d.]+ \(step 6\)/)
        const journal = yield* entries(b)
        assert.deepStrictEqual(stepsIn(journal), [1, 2, 3, 4, 5, 6], "every learner step exactly once")
        const checkpoints = journal.flatMap((e) => (e.kind === "checkpoint" ? [e.step] : []))
        assert.deepStrictEqual(checkpoints, [0, 2, 4, 6], "every checkpoint exactly once")
        const starts = journal.flatMap((e) => (e.kind === "start" ? [e.fromStep] : []))
        assert.deepStrictEqual(starts, [0, 2])
        const hashes = (j: ReadonlyArray<Journal.Entry>) => j.flatMap((e) => (e.kind === "step" ? [e.weightsHash] : []))
        assert.deepStrictEqual(hashes(journal), hashes(reference), "the same weights after every step")
        assert.strictEqual(new Set(hashes(reference)).size, 6, "every step changed the weights")
        const weights = (run: string) => readFileSync(join(run, "checkpoints", "step-000006", "model.safetensors"))
        assert.isTrue(weights(a).equals(weights(b)), "bit-identical final checkpoints")
        assert.isTrue(existsSync(join(b, "report.html")))
        const referenceOf = (run: string) =>
          readFileSync(join(run, "checkpoints", "step-000006", "reference.safetensors"))
        assert.isTrue(referenceOf(a).equals(referenceOf(b)), "the resumed run kept the reference policy")
        assert.isFalse(referenceOf(a).equals(weights(a)), "the reference is not the current policy")
        const kl = readFileSync(join(a, "metrics.jsonl"), "utf8").split("\n")
          .filter((l) => l.includes(`"phase":"train"`))
          .map((l) => JSON.parse(l).figures["learner/kl"] as number)
        assert.strictEqual(kl[0], 0, "step 1 trains the reference policy itself")
        assert.isTrue(kl.slice(1).every((x) => x > 0), `KL to the reference after step 1: ${kl}`)
        const checks = readFileSync(join(a, "metrics.jsonl"), "utf8").split("\n")
          .filter((l) => l.includes(`"phase":"warmup"`))
          .map((l) => JSON.parse(l).figures["warmup/validation_accuracy"] as number | undefined)
        assert.strictEqual(checks.length, 3, "the unreachable target kept all 3 warm-up steps")
        assert.isTrue(checks[0] === 0 && checks[1] === 0 && checks[2] === undefined, `checks: ${checks}`)

        // Engines fed the published weights as inputs (`engine.weights`), killed and resumed the same way: the same
        // weights after every step as the uninterrupted run with the default engines (issue 41 point 6).
        const fed = join(dir, "config-inputs.json")
        writeFileSync(fed, JSON.stringify({ ...JSON.parse(readFileSync(config, "utf8")), engine: { weights: "inputs" } }))
        const c = join(dir, "c")
        const killedFed = yield* train([fed, "--output", c], () => {
          const path = join(c, "journal.jsonl")
          return existsSync(path) && readFileSync(path, "utf8").includes(`"kind":"step","step":3`)
        })
        assert.strictEqual(killedFed.signal, "SIGKILL", killedFed.output)
        const resumedFed = yield* train([fed, "--output", c, "--resume"])
        assert.strictEqual(resumedFed.code, 0, resumedFed.output)
        assert.deepStrictEqual(hashes(yield* entries(c)), hashes(reference), "fed as inputs: the same weights")
        rmSync(dir, { recursive: true, force: true })
      }).pipe(Effect.provide(NodeServices.layer)),
    300_000
  )

  it.live(
    "a mistyped config key or an invalid dataset row stops the run at once, naming the key or the line",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "train-bad-"))
        writeFileSync(join(dir, "rows.jsonl"), `{"question":"What is 1+1?","answer":"2"}\n{"answer":"3"}\n`)
        const base = {
          output: "run",
          model: { path: "model", preset: "tiny" },
          data: { train: "rows.jsonl" },
          task: "calculator",
          algorithm: { steps: 1 }
        }
        writeFileSync(join(dir, "typo.json"), JSON.stringify({ ...base, algorithm: { steps: 1, lrr: 0.1 } }))
        const typo = yield* train([join(dir, "typo.json")])
        assert.strictEqual(typo.code, 1)
        assert.include(typo.output, `algorithm.lrr: unknown key (did you mean "lr"?)`)
        assert.isFalse(existsSync(join(dir, "run")), "nothing written")
        writeFileSync(join(dir, "rows.json"), JSON.stringify(base))
        const row = yield* train([join(dir, "rows.json")])
        assert.strictEqual(row.code, 1)
        assert.include(row.output, `rows.jsonl:2: a row needs a \`question\` or \`messages\``)
        // A row without the field the task's row Schema requires (the calculator's \`answer\`), by line.
        writeFileSync(
          join(dir, "noanswer.jsonl"),
          `{"question":"What is 1+1?","answer":"2"}\n{"question":"What is 2+2?"}\n`
        )
        writeFileSync(join(dir, "noanswer.json"), JSON.stringify({ ...base, data: { train: "noanswer.jsonl" } }))
        const noAnswer = yield* train([join(dir, "noanswer.json")])
        assert.strictEqual(noAnswer.code, 1)
        assert.match(noAnswer.output, /noanswer\.jsonl:2: .*answer/)
        assert.isFalse(existsSync(join(dir, "model")), "no model folder for a run that cannot start")
        // A context budget past the model's positions would crash onnxruntime mid-run (a RoPE Gather out of range).
        writeFileSync(join(dir, "ok.jsonl"), `{"question":"What is 1+1?","answer":"2"}\n`)
        writeFileSync(
          join(dir, "long.json"),
          JSON.stringify({
            ...base,
            data: { train: "ok.jsonl" },
            agent: { maxContextTokens: 1024 }
          })
        )
        const long = yield* train([join(dir, "long.json")])
        assert.strictEqual(long.code, 1)
        assert.include(long.output, "agent.maxContextTokens is 1024, more than the model's 512 positions")
        // Left unset, the budget is the model's positions, and the run's recorded config says so.
        writeFileSync(
          join(dir, "unset.json"),
          JSON.stringify({
            ...base,
            data: { train: "ok.jsonl" },
            agent: { numChains: 2, maxNewTokens: 8, renderTools: false },
            algorithm: { steps: 1, groupsPerStep: 1 }
          })
        )
        const unset = yield* train([join(dir, "unset.json")])
        // An untrained policy's 2 chains score equal rewards: the one step has no signal, and a run that trained
        // nothing is not a success.
        assert.strictEqual(unset.code, 1, unset.output)
        assert.include(unset.output, "trained 0 of 1 step (1 skipped: no learning signal")
        assert.include(unset.output, "no step trained: every group's rewards were equal in its one step")
        const recorded = JSON.parse(readFileSync(join(dir, "run", "config.json"), "utf8"))
        assert.strictEqual(recorded.agent.maxContextTokens, 512)

        // With the calculator's tool schemas rendered, no prompt fits the 512 positions: refused before any rollout
        // (it used to run and report only that every group's rewards were equal).
        writeFileSync(
          join(dir, "crowded.json"),
          JSON.stringify({
            ...base,
            output: "crowded",
            data: { train: "ok.jsonl" },
            agent: { numChains: 2, maxNewTokens: 8 },
            algorithm: { steps: 1, groupsPerStep: 1 }
          })
        )
        const crowded = yield* train([join(dir, "crowded.json")])
        assert.strictEqual(crowded.code, 1, crowded.output)
        assert.include(crowded.output, "no prompt fits the context")
        assert.include(crowded.output, "agent.renderTools: false")
      }).pipe(Effect.provide(NodeServices.layer)),
    300_000
  ) // five CLI starts: ~25 s quiet, 165 s at load 10

  it.live(
    "model.from: a run starts from another run's checkpoint (one warm-up shared by RL variants)",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "train-from-"))
        yield* Generate.write({
          dir: join(dir, "data"),
          seed: 5,
          train: 64,
          heldOut: 8,
          validation: 4,
          demos: 64,
          noise: 0
        })
        const settings = {
          seed: 11,
          algorithm: { steps: 1, groupsPerStep: 2, lr: 0.001, advantage: "reinforce++", entropyCoef: 0.01 },
          eval: { every: 1, size: 8 }
        }
        writeFileSync(join(dir, "base.json"), JSON.stringify(calculatorRun({ ...settings, output: "base" })))
        const base = yield* train([join(dir, "base.json")])
        assert.strictEqual(base.code, 0, base.output)
        // No warm-up of its own: it starts where the base's warm-up ended (its step-0 checkpoint).
        const variantOf = (from: string) => {
          const { warmup: _, ...config } = calculatorRun({
            ...settings,
            output: "variant",
            model: { path: "model", preset: "tiny", initSeed: 3, from }
          })
          return config
        }
        writeFileSync(join(dir, "variant.json"), JSON.stringify(variantOf("base/checkpoints/step-000000")))
        const variant = yield* train([join(dir, "variant.json")])
        assert.strictEqual(variant.code, 0, variant.output)
        assert.include(variant.output, "starting from the weights of")
        assert.notInclude(variant.output, "[warmup]")
        // Its RL step starts from the base's RL start: the same rollouts, the same loss, the same weights after it.
        const trainStep = (output: string) => metricsOf(join(dir, output)).find((m) => m.phase === "train")!.figures
        assert.strictEqual(trainStep("variant")["learner/loss"], trainStep("base")["learner/loss"])
        const hash = (output: string, step: string) =>
          JSON.parse(readFileSync(join(dir, output, "checkpoints", step, "trainer_state.json"), "utf8")).weightsHash
        assert.strictEqual(hash("variant", "step-000001"), hash("base", "step-000001"))
        assert.notStrictEqual(hash("base", "step-000001"), hash("base", "step-000000"))
        // A checkpoint that is not one is a config error naming the key, before anything runs.
        writeFileSync(
          join(dir, "bad.json"),
          JSON.stringify({ ...variantOf("base/checkpoints/step-999999"), output: "bad" })
        )
        const bad = yield* train([join(dir, "bad.json")])
        assert.strictEqual(bad.code, 1, bad.output)
        assert.include(bad.output, "model.from: ")
        assert.include(bad.output, "no such checkpoint")
      }).pipe(Effect.provide(NodeServices.layer)),
    300_000
  )
})
