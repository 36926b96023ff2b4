import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result, Schema } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Report from "../../src/Report.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { charFormat } from "./fixtures/charFormat.ts"
import * as Toy from "./fixtures/toyPolicy.ts"
import * as RunSchedule from "../../src/RunSchedule.ts"
import * as TrainLoop from "../../actors/TrainLoop.ts"
import { Learner } from "../../actors/Learner.ts"
import { PolicyVersions } from "../../actors/PolicyVersions.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import { Sampler } from "../../src/Sampler.ts"

const rows = (n: number, prefix: string) =>
  Dataset.parse(prefix, Array.from({ length: n }, (_, i) => JSON.stringify({ question: `${prefix} ${i}` })).join("\n"))

const setup = (overrides: Record<string, unknown> = {}, algorithm: Record<string, unknown> = {}) =>
  Effect.gen(function*() {
    const output = mkdtempSync(join(tmpdir(), "trainer-"))
    const config = yield* TrainConfig.decode({
      output,
      seed: 3,
      model: { path: "unused" },
      data: { train: "unused" },
      agent: { numChains: 4, maxTurns: 2, maxNewTokens: 16 },
      algorithm: { steps: 8, groupsPerStep: 3, ...algorithm },
      eval: { every: 4 },
      checkpoint: { every: 3, keep: 2 },
      ...overrides
    })
    return {
      config,
      train: yield* rows(10, "train"),
      eval: yield* rows(20, "eval"),
      demos: yield* Dataset.parse(
        "demos",
        `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"A"}]}`,
        { kind: "conversation" }
      ),
      format: charFormat,
      task: Toy.task()
    }
  })

/** The toy task, but nothing counts as correct (a warm-up target out of reach). */
const neverCorrect: Task.Task = { ...Toy.task(), correct: () => false }

const steps = (output: string) =>
  Effect.map(
    Journal.read(join(output, "journal.jsonl")),
    (r) => r.entries.flatMap((e) => (e.entry.kind === "step" ? [e.entry.step] : []))
  )

/** The group entries of a run's journal. */
const journaledGroups = (output: string) =>
  Effect.map(
    Journal.read(join(output, "journal.jsonl")),
    (r) => r.entries.flatMap((e) => (e.entry.kind === "group" ? [e.entry] : []))
  )

const run = (options: TrainLoop.Options, toy: Toy.ToyOptions = {}) =>
  Effect.scoped(TrainLoop.run(options)).pipe(Effect.provide(Toy.layer(toy)))

describe("TrainLoop", () => {
  it.effect("a sampled evaluation with several answers per question: its figures are over all of them", () =>
    Effect.gen(function*() {
      const options = yield* setup({ eval: { every: 4, size: 5, samples: 3, temperature: 1 } }, { steps: 1 })
      const summary = yield* run(options)
      assert.strictEqual(summary.evals[0]!.figures["eval/trajectories"], 15)
      const one = yield* run(yield* setup({ eval: { every: 4, size: 5, temperature: 1 } }, { steps: 1 }))
      assert.strictEqual(one.evals[0]!.figures["eval/trajectories"], 5)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("sync: warm-up, RL steps that raise held-out accuracy, journal, checkpoints, metrics and report", () =>
    Effect.gen(function*() {
      const options = yield* setup({
        warmup: { data: "unused", steps: 3, batchSize: 2 },
        eval: { every: 4, temperature: 1 }
      })
      const summary = yield* run(options)
      const out = options.config.output
      assert.deepStrictEqual(yield* steps(out), [1, 2, 3, 4, 5, 6, 7, 8])
      assert.deepStrictEqual(summary.evals.map((e) => e.step), [0, 4, 8])
      const before = summary.evals[0]!.figures["eval/accuracy"]!
      const after = summary.evals.at(-1)!.figures["eval/accuracy"]!
      assert.isTrue(after > before, `accuracy ${before} → ${after}`)
      assert.deepStrictEqual(readdirSync(join(out, "checkpoints")).sort(), ["step-000006", "step-000008"])
      const { metrics, samples } = yield* Report.read(out)
      assert.deepStrictEqual(metrics.filter((m) => m.phase === "warmup").map((m) => m.step), [1, 2, 3])
      const train = metrics.filter((m) => m.phase === "train")
      assert.deepStrictEqual(train.map((m) => m.step), [1, 2, 3, 4, 5, 6, 7, 8])
      assert.strictEqual(train[0]!.figures["rollout/trajectories"], 12)
      assert.strictEqual(train[0]!.figures["rollout/staleness_mean"], 0, "sync: sampled by the current policy")
      assert.isTrue(
        train.every((m) => m.figures["learner/entropy"] !== undefined && m.figures["perf/tokens_per_s"]! > 0)
      )
      assert.isTrue(samples.length > 0 && samples[0]!.spans.some((s) => s.source === "policy"))
      // Every record, whatever its phase, carries the process's peak RSS since the record before: plausible for a
      // Node process, never below the RSS when written.
      assert.deepStrictEqual([...new Set(metrics.map((m) => m.phase))].sort(), ["eval", "train", "warmup"])
      for (const m of metrics) {
        const peak = m.figures["perf/peak_rss_mb"]!, rss = m.figures["perf/rss_mb"]!
        assert.isTrue(
          peak >= 30 && peak < 256 * 1024 && peak >= rss && rss >= 30,
          `${m.phase} ${m.step}: ${peak} / ${rss} MB`
        )
      }
      const journal = (yield* Journal.read(join(out, "journal.jsonl"))).entries.map((e) => e.entry)
      assert.strictEqual(journal.filter((e) => e.kind === "group").length, 24)
      assert.deepStrictEqual(journal.filter((e) => e.kind === "warmup"), [{ kind: "warmup", steps: 3 }])
      assert.strictEqual(journal.at(-1)!.kind, "finished")
      yield* Report.write(out)
      assert.include(readFileSync(join(out, "report.html"), "utf8"), "Invalid tool-call rate")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("demonstrations whose turns are longer than agent.maxNewTokens are named before the warm-up", () =>
    Effect.gen(function*() {
      // The char format: one token a character, END closing the turn. maxNewTokens is 16.
      const demos = (answers: ReadonlyArray<string>) =>
        Dataset.parse(
          "demos",
          answers.map((a) =>
            JSON.stringify({ messages: [{ role: "user", content: "q" }, { role: "assistant", content: a }] })
          ).join("\n"),
          { kind: "conversation" }
        )
      const noticesOf = Effect.fnUntraced(function*(answers: ReadonlyArray<string>, task = Toy.task()) {
        const notices: Array<string> = []
        const options = yield* setup({ warmup: { data: "unused", steps: 1, batchSize: 2 } }, { steps: 1 })
        yield* run({
          ...options,
          task,
          demos: yield* demos(answers),
          notice: (m) => Effect.sync(() => void notices.push(m))
        })
        return notices.filter((n) => n.includes("demonstration"))
      })
      const long = yield* noticesOf(["A", "x".repeat(20), "x".repeat(15)])
      assert.deepStrictEqual(long, [
        `1 of the first 3 demonstrations has an assistant turn longer than agent.maxNewTokens (16; the longest is 21 ` +
        `tokens): a rollout cuts such a turn before its end (termination "stop"), so the policy cannot finish what ` +
        `it learns there; raise agent.maxNewTokens or shorten the demonstrations' turns`
      ])
      assert.deepStrictEqual(yield* noticesOf(["A", "x".repeat(15)]), [], "16 tokens fit")
      // The task's default, not a key of the config: the notice says so and where to override it.
      const [fromTask] = yield* noticesOf(["x".repeat(20)], { ...Toy.task(), defaults: { maxNewTokens: 16 } })
      assert.include(fromTask, "longer than agent.maxNewTokens (16, task toy's default; the longest is 21 tokens)")
      assert.include(fromTask, "raise agent.maxNewTokens in the config (it overrides the task's default)")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("warm-up stopAt: ends at the first check that reaches the target, checks publish warm-up versions", () =>
    Effect.gen(function*() {
      const published: Array<number> = []
      const base = yield* setup({
        warmup: { data: "unused", steps: 40, batchSize: 2, stopAt: { data: "unused", accuracy: 1, every: 3, size: 5 } }
      })
      const options = { ...base, validation: yield* rows(8, "validation") }
      // The toy's A arm wins greedily once its weight is ahead, so a check reaches accuracy 1 early; a target that
      // cannot be reached runs the whole warm-up.
      const spy = Toy.make().pipe(Effect.map(({ learner, sampler, versions }) => ({
        sampler,
        learner,
        versions: {
          ...versions,
          publish: (v: number) => Effect.andThen(Effect.sync(() => published.push(v)), versions.publish(v))
        }
      })))
      const runWith = (o: TrainLoop.Options) =>
        Effect.gen(function*() {
          return yield* Effect.scoped(TrainLoop.run(o)).pipe(Toy.provideParts(yield* spy))
        })
      yield* runWith(options)
      const out = options.config.output
      const { metrics } = yield* Report.read(out)
      const warm = metrics.filter((m) => m.phase === "warmup")
      assert.deepStrictEqual(warm.map((m) => m.step), [1, 2, 3], "stopped at the first check")
      assert.strictEqual(warm[2]!.figures["warmup/validation_accuracy"], 1)
      assert.isUndefined(warm[1]!.figures["warmup/validation_accuracy"], "checks every 3 steps")
      const journal = (yield* Journal.read(join(out, "journal.jsonl"))).entries.map((e) => e.entry)
      assert.deepStrictEqual(journal.filter((e) => e.kind === "warmup"), [{ kind: "warmup", steps: 3 }])
      assert.deepStrictEqual(published.slice(0, 2), [RunSchedule.warmupVersion(3, 40), 0])
      assert.deepStrictEqual(published.slice(0, 3), [-38, 0, 1], "versions increase")

      published.length = 0
      const unreachable = yield* setup({
        warmup: { data: "unused", steps: 7, batchSize: 2, stopAt: { data: "unused", accuracy: 1, every: 3 } }
      })
      const notices: Array<string> = []
      yield* runWith({
        ...unreachable,
        validation: yield* rows(8, "validation"),
        task: neverCorrect,
        notice: (message) => Effect.sync(() => void notices.push(message))
      })
      // The miss is said, once, before RL goes on from the last warm-up step.
      const said = notices.filter((n) => n.includes("short of its target validation accuracy 1"))
      assert.strictEqual(said.length, 1, notices.join("\n"))
      assert.include(said[0]!, "best 0.000 at step 3")
      const warmAll = (yield* Report.read(unreachable.config.output)).metrics.filter((m) => m.phase === "warmup")
      assert.deepStrictEqual(warmAll.map((m) => m.step), [1, 2, 3, 4, 5, 6, 7], "the cap: every step")
      assert.deepStrictEqual(warmAll.flatMap((m) => m.figures["warmup/validation_accuracy"] ?? []), [0, 0])
      assert.deepStrictEqual(published.slice(0, 3), [-5, -2, 0], "checks at steps 3 and 6, then version 0")

      // With onMiss "fail" the same miss ends the run before RL, naming the best check.
      const failing = yield* setup({
        warmup: {
          data: "unused",
          steps: 7,
          batchSize: 2,
          stopAt: { data: "unused", accuracy: 1, every: 3, onMiss: "fail" }
        }
      })
      const missed = yield* Effect.flip(
        runWith({ ...failing, validation: yield* rows(8, "validation"), task: neverCorrect })
      )
      assert.strictEqual(missed.reason._tag, "Warmup")
      assert.include(missed.message, "ran its 7 steps short of its target validation accuracy 1: best 0 at step 3")
      const failed = (yield* Journal.read(join(failing.config.output, "journal.jsonl"))).entries.map((e) => e.entry)
      assert.isFalse(failed.some((e) => e.kind === "warmup" || e.kind === "step"), "no warm-up end, no RL step")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("warm-up stopAt without its validation split is a typed error", () =>
    Effect.gen(function*() {
      const options = yield* setup({
        warmup: { data: "unused", steps: 5, batchSize: 2, stopAt: { data: "unused", accuracy: 0.5 } }
      })
      const error = yield* Effect.flip(run(options))
      assert.strictEqual(error.reason._tag, "Learner")
      assert.include(error.message, "validation")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("sync runs with the same seed end with the same weights; another seed does not", () =>
    Effect.gen(function*() {
      const a = yield* run(yield* setup())
      const b = yield* run(yield* setup())
      const c = yield* run(yield* setup({ seed: 4 }))
      assert.strictEqual(a.fingerprint, b.fingerprint)
      assert.notStrictEqual(a.fingerprint, c.fingerprint)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("prompts that fill the context: none fits, the run stops before a rollout; some, it says so twice", () =>
    Effect.gen(function*() {
      const questions = (long: (i: number) => boolean) =>
        Dataset.parse(
          "train",
          Array.from({ length: 10 }, (_, i) => JSON.stringify({ question: long(i) ? "x".repeat(200) : `train ${i}` }))
            .join("\n")
        )
      const options = yield* setup({ agent: { numChains: 4, maxTurns: 2, maxNewTokens: 16, maxContextTokens: 60 } }, {
        steps: 4
      })
      const notices: Array<string> = []
      const notice = (m: string) => Effect.sync(() => void notices.push(m))
      yield* run({ ...options, train: yield* questions((i) => i === 2), notice })
      assert.isTrue(
        notices.some((n) => n.startsWith("1 of the first 10 rows' prompts fill agent.maxContextTokens (60"))
      )
      // Row 2 is in the first epoch's 10 rows: its chains end before a token, said at that step.
      assert.strictEqual(
        notices.filter((n) => n.includes("ended before sampling a token")).length,
        1,
        notices.join("\n")
      )

      const crowded = yield* setup({ agent: { numChains: 4, maxTurns: 2, maxNewTokens: 16, maxContextTokens: 60 } })
      const error = yield* Effect.flip(run({ ...crowded, train: yield* questions(() => true) }))
      assert.strictEqual(error.reason._tag, "Task")
      assert.include(error.message, "no prompt fits the context: the first 10 rows' prompts are up to")
      assert.isFalse(existsSync(join(crowded.config.output, "metrics.jsonl")), "nothing written")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a crash mid-run resumes from the last checkpoint: each step journaled once, same final weights", () =>
    Effect.gen(function*() {
      const reference = yield* run(yield* setup())
      const options = yield* setup()
      const crashed = yield* Effect.result(run(options, { failAt: 6 }))
      assert.isTrue(Result.isFailure(crashed))
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2, 3, 4, 5], "steps 4, 5 after checkpoint 3")
      const resumed = yield* run({ ...options, resume: true })
      assert.strictEqual(resumed.fromStep, 3)
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2, 3, 4, 5, 6, 7, 8])
      assert.strictEqual(resumed.fingerprint, reference.fingerprint)
      const { metrics } = yield* Report.read(options.config.output)
      assert.deepStrictEqual(metrics.filter((m) => m.phase === "train").map((m) => m.step), [1, 2, 3, 4, 5, 6, 7, 8])
      assert.deepStrictEqual(metrics.filter((m) => m.phase === "eval").map((m) => m.step), [0, 4, 8])
      // Resuming a finished run does nothing more.
      const again = yield* run({ ...options, resume: true })
      assert.strictEqual(again.fingerprint, reference.fingerprint)
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2, 3, 4, 5, 6, 7, 8])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("resume falls back to the newest intact checkpoint, saying which it refused and why", () =>
    Effect.gen(function*() {
      const reference = yield* run(yield* setup())
      const options = yield* setup()
      yield* Effect.result(run(options, { failAt: 8 }))
      const dir = (step: number) => join(options.config.output, "checkpoints", `step-00000${step}`, "toy.json")
      // The newest checkpoint (step 6) cut short, as by a full disk or a crash the rename did not cover.
      writeFileSync(dir(6), readFileSync(dir(6), "utf8").slice(0, 10))
      const notices: Array<string> = []
      const resumed = yield* run({ ...options, resume: true, notice: (m) => Effect.sync(() => notices.push(m)) })
      assert.strictEqual(resumed.fromStep, 3)
      assert.strictEqual(resumed.fingerprint, reference.fingerprint)
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2, 3, 4, 5, 6, 7, 8])
      assert.strictEqual(notices.length, 1)
      assert.match(
        notices[0]!,
        /resuming from step-000003 \(step 3\), the newest intact checkpoint; refused: step-000006: /
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a checkpoint whose weights are not the journal's is refused; with none intact the resume fails", () =>
    Effect.gen(function*() {
      const options = yield* setup()
      yield* Effect.result(run(options, { failAt: 8 }))
      const dir = (step: number) => join(options.config.output, "checkpoints", `step-00000${step}`, "toy.json")
      const alter = (step: number) => {
        const state = JSON.parse(readFileSync(dir(step), "utf8"))
        writeFileSync(dir(step), JSON.stringify({ ...state, w: state.w.map((x: number) => x + 1e-9) }))
      }
      alter(6)
      const notices: Array<string> = []
      const resumed = yield* run({ ...options, resume: true, notice: (m) => Effect.sync(() => notices.push(m)) })
      assert.strictEqual(resumed.fromStep, 3)
      assert.include(notices[0], "step-000006: its weights (fingerprint")
      assert.include(notices[0], "are not the ones the journal recorded")

      const broken = yield* setup()
      yield* Effect.result(run(broken, { failAt: 8 }))
      const at = (step: number) => join(broken.config.output, "checkpoints", `step-00000${step}`, "toy.json")
      writeFileSync(at(6), "{")
      const state = JSON.parse(readFileSync(at(3), "utf8"))
      writeFileSync(at(3), JSON.stringify({ ...state, m: state.m.map((x: number) => -x) }))
      const journalBefore = readFileSync(join(broken.config.output, "journal.jsonl"), "utf8")
      const error = yield* Effect.flip(run({ ...broken, resume: true }))
      assert.strictEqual(error.reason._tag, "Checkpoint")
      assert.include(error.message, "no intact checkpoint to resume")
      assert.include(error.message, "step-000006: ")
      assert.include(error.message, "step-000003: its weights")
      assert.strictEqual(
        readFileSync(join(broken.config.output, "journal.jsonl"), "utf8"),
        journalBefore,
        "journal untouched"
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("resume refuses a changed seed or config, naming what changed, unless forced", () =>
    Effect.gen(function*() {
      const options = yield* setup()
      yield* Effect.result(run(options, { failAt: 5 }))
      const journalBefore = readFileSync(join(options.config.output, "journal.jsonl"), "utf8")
      const changed = {
        ...options,
        config: { ...options.config, seed: 4, algorithm: { ...options.config.algorithm, lr: 0.001 } },
        resume: true
      }
      const error = yield* Effect.flip(run(changed))
      assert.strictEqual(error.reason._tag, "Resume")
      assert.include(error.message, "algorithm.lr: 0.0003 → 0.001; seed: 3 → 4")
      assert.include(error.message, "--force-resume")
      assert.strictEqual(
        readFileSync(join(options.config.output, "journal.jsonl"), "utf8"),
        journalBefore,
        "nothing written"
      )
      // More steps beside the change: the refusal is all it says (no "resuming … for N steps" first).
      const said: Array<string> = []
      const longerToo = {
        ...changed,
        config: { ...changed.config, algorithm: { ...changed.config.algorithm, steps: 12 } },
        notice: (m: string) => Effect.sync(() => said.push(m))
      }
      assert.strictEqual((yield* Effect.flip(run(longerToo))).reason._tag, "Resume")
      assert.deepStrictEqual(said, [])
      // Another output directory is not a change (a run may move).
      const notices: Array<string> = []
      const forced = yield* run({ ...changed, forceResume: true, notice: (m) => Effect.sync(() => notices.push(m)) })
      assert.strictEqual(forced.fromStep, 3)
      assert.include(notices[0], "resuming")
      assert.include(notices[0], "seed: 3 → 4")
      assert.include(notices[1], `resuming ${options.config.output} from step-000003 (step 3)`)
      // The forced config is the run's now: resuming again with it is no change.
      const finished: Array<string> = []
      const again = yield* run({ ...changed, notice: (m) => Effect.sync(() => finished.push(m)) })
      assert.strictEqual(again.fromStep, 8)
      // A finished run resumed has nothing to do, and says so with the way on.
      assert.include(finished.at(-1), `${options.config.output} is at step 8 and algorithm.steps is 8: nothing left`)
      assert.include(finished.at(-1), "--steps N")
      // More steps continue the same run: no force needed, and said.
      const extended: Array<string> = []
      const longer = yield* run({
        ...changed,
        config: { ...changed.config, algorithm: { ...changed.config.algorithm, steps: 10 } },
        notice: (m) => Effect.sync(() => extended.push(m))
      })
      assert.strictEqual(longer.fromStep, 8)
      assert.strictEqual(longer.steps, 10)
      assert.include(extended[0], `resuming ${options.config.output} for 10 steps (algorithm.steps: 8 → 10)`)
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
      // A config recorded by a version that wrote out fewer defaults (here: no algorithm.clipLow) is the same
      // config: its defaults are this version's.
      const recordedFile = join(options.config.output, "config.json")
      const recorded = JSON.parse(readFileSync(recordedFile, "utf8"))
      delete recorded.algorithm.clipLow
      writeFileSync(recordedFile, JSON.stringify(recorded))
      const older = yield* run({
        ...changed,
        config: { ...changed.config, algorithm: { ...changed.config.algorithm, steps: 10 } }
      })
      assert.strictEqual(older.fromStep, 10)
      // So is one whose task's path option was recorded relative, before runs recorded such options absolute.
      const ten = { ...changed.config, algorithm: { ...changed.config.algorithm, steps: 10 } }
      const toy = (root: string) => ({ name: "toy", options: { root } })
      const before = JSON.parse(readFileSync(recordedFile, "utf8"))
      writeFileSync(recordedFile, JSON.stringify({ ...before, task: toy("data/f") }))
      const moved = yield* run({ ...changed, config: { ...ten, task: toy("/work/data/f") } })
      assert.strictEqual(moved.fromStep, 10)
      // Fewer steps than the run has done: "nothing left" alone, not first a resume "for 8 steps" that does nothing.
      const shorter: Array<string> = []
      const eight = { ...ten, task: toy("/work/data/f"), algorithm: { ...ten.algorithm, steps: 8 } }
      yield* run({ ...changed, config: eight, notice: (m) => Effect.sync(() => shorter.push(m)) })
      assert.isFalse(shorter.some((m) => m.includes("for 8 steps")), shorter.join("\n"))
      assert.include(shorter.at(-1), "is at step 10 and algorithm.steps is 8: nothing left")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("resume without a checkpoint starts over; a missing checkpoint directory is skipped", () =>
    Effect.gen(function*() {
      const options = yield* setup({}, { steps: 2 })
      const crashed = yield* Effect.result(run(options, { failAt: 2 }))
      assert.isTrue(Result.isFailure(crashed))
      const notices: Array<string> = []
      const resumed = yield* run({ ...options, resume: true, notice: (m) => Effect.sync(() => notices.push(m)) })
      assert.strictEqual(resumed.fromStep, 0)
      assert.include(notices[0], "has no checkpoint yet")
      assert.include(notices[0], "the run starts over")
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2])
      assert.isTrue(existsSync(join(options.config.output, "checkpoints", "step-000002")))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("every batch, evaluation and warm-up check samples from a sampler of its own, pinned to its version", () =>
    Effect.gen(function*() {
      const requested: Array<number> = []
      const { learner, versions } = yield* Toy.make()
      const spy = {
        ...versions,
        sampler: (v: number) => Effect.andThen(Effect.sync(() => requested.push(v)), versions.sampler(v))
      }
      const base = yield* setup({
        mode: "async",
        maxStaleness: 1,
        warmup: { data: "unused", steps: 4, batchSize: 2, stopAt: { data: "unused", accuracy: 1, every: 2, size: 2 } }
      }, { steps: 6 })
      yield* Effect.scoped(TrainLoop.run({ ...base, validation: yield* rows(4, "validation"), task: neverCorrect }))
        .pipe(Toy.provideParts({ learner, versions: spy }))
      // A warm-up check at step 2 (version -3), the evaluation at 0, batches 1…6 (versions 0 0 1 3 3 4), evaluations
      // at 4 and 6; no Sampler service was provided.
      assert.deepStrictEqual(
        [...requested].sort((a, b) => a - b),
        [-3, 0, 0, 0, 1, 3, 3, 4, 4, 6]
      )
      const journal = (yield* Journal.read(join(base.config.output, "journal.jsonl"))).entries.map((e) => e.entry)
      const groupVersions = journal.flatMap((e) => (e.kind === "group" ? [e.policyVersion] : []))
      assert.deepStrictEqual(
        groupVersions,
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 3, 3, 3, 3, 3, 3, 4, 4, 4],
        "every group's version"
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.live("async: a crash and a resume end with the weights of an unbroken run, whatever the timing", () =>
    Effect.gen(function*() {
      const timing = { samplerMs: 5, learnMs: 20 }
      const unbroken = yield* setup({ mode: "async", maxStaleness: 1 })
      const reference = yield* run(unbroken, timing)
      const options = yield* setup({ mode: "async", maxStaleness: 1 })
      const crashed = yield* Effect.result(run(options, { ...timing, failAt: 6 }))
      assert.isTrue(Result.isFailure(crashed))
      // The resumed run's learner is slower: in-flight batches would have met other versions.
      const resumed = yield* run({ ...options, resume: true }, { samplerMs: 1, learnMs: 60 })
      assert.strictEqual(resumed.fromStep, 3)
      assert.strictEqual(resumed.fingerprint, reference.fingerprint)
      assert.deepStrictEqual(
        yield* journaledGroups(options.config.output),
        yield* journaledGroups(unbroken.config.output),
        "every group"
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.live("async: rollouts run ahead by at most maxStaleness versions and overlap the learner", () =>
    Effect.gen(function*() {
      const options = yield* setup({ mode: "async", maxStaleness: 1 }, { steps: 6 })
      yield* run(options, { samplerMs: 5, learnMs: 40 })
      const { metrics } = yield* Report.read(options.config.output)
      const train = metrics.filter((m) => m.phase === "train")
      const staleness = train.map((m) => m.figures["rollout/staleness_mean"]!)
      assert.isTrue(staleness.every((s) => s >= 0 && s <= 1), `staleness ${staleness}`)
      assert.isTrue(staleness.slice(1).some((s) => s > 0), "later batches were sampled while the learner trained")
      // Relative, not absolute, so that a loaded machine slows both sides alike.
      const mean = (xs: Array<number>) => xs.reduce((a, b) => a + b, 0) / xs.length
      const waits = mean(train.slice(1).map((m) => m.figures["time/wait_rollout_s"]!))
      const learns = mean(train.slice(1).map((m) => m.figures["time/learn_s"]!))
      assert.isTrue(waits < learns / 2, `batches mostly ready when the learner asked: wait ${waits}, learn ${learns}`)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a run whose rewards all fail stops at its first step with a typed error naming the reason and count", () =>
    Effect.gen(function*() {
      const failing = Reward.make("broken", { score: () => Effect.fail(new Error("the judge is down")) })
      const options = yield* setup({ eval: { every: 100 } })
      const task = Task.make("broken", { reward: failing })
      const error = yield* Effect.flip(run({ ...options, eval: undefined, task }))
      assert.strictEqual(error.reason._tag, "Failures")
      assert.include(error.message, "step 1: 12 of 12 trajectories failed with RewardFailed")
      assert.include(error.message, "maxFailureShare 0.5")
      // The first failure's own message, in the error and in the step's record, which outlives the console.
      const first = `RewardFailed: reward "broken": the judge is down`
      assert.include(error.message, `; first: ${first}`)
      // The step's figures are logged before the run stops, and nothing was trained on them.
      const records = (yield* Report.read(options.config.output)).metrics.filter((m) => m.phase === "train")
      assert.strictEqual(records.length, 1)
      assert.strictEqual(records[0]!.firstFailure, first)
      assert.strictEqual(records[0]!.figures["rollout/failures/RewardFailed"], 12)
      assert.strictEqual(records[0]!.figures["rollout/failure_share"], 1)
      assert.deepStrictEqual(yield* steps(options.config.output), [])
      // An evaluation whose rewards all fail stops the run before any step.
      const withEval = yield* setup()
      const atEval = yield* Effect.flip(run({ ...withEval, task }))
      assert.include(atEval.message, "evaluation at step 0: 20 of 20 trajectories failed with RewardFailed")
      assert.include(atEval.message, `; first: ${first}`)
      // maxFailureShare 1 never stops: the run trains on zero rewards (here: no signal, every step skipped).
      const tolerant = yield* setup({ maxFailureShare: 1, algorithm: { steps: 2, groupsPerStep: 3 } })
      const summary = yield* run({ ...tolerant, eval: undefined, task })
      assert.strictEqual(summary.steps, 2)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a non-finite loss stops the run with a typed error before the step is published, journaled or saved", () =>
    Effect.gen(function*() {
      const options = yield* setup({ checkpoint: { every: 1, keep: 10 } }, { steps: 4 })
      const { learner, sampler, versions } = yield* Toy.make()
      const nan = {
        ...learner,
        learn: (step: number, groups: ReadonlyArray<Trajectory.Group>) =>
          Effect.map(learner.learn(step, groups), (o) => (step === 3 ? { ...o, loss: Number.NaN } : o))
      }
      const error = yield* Effect.flip(Effect.scoped(TrainLoop.run(options)).pipe(
        Toy.provideParts({ learner: nan, versions, sampler })
      ))
      assert.strictEqual(error.reason._tag, "NonFinite")
      assert.include(error.message, "step 3: learner/loss is NaN")
      assert.deepStrictEqual(yield* steps(options.config.output), [1, 2])
      assert.deepStrictEqual(readdirSync(join(options.config.output, "checkpoints")).sort(), [
        "step-000001",
        "step-000002"
      ])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect(
    "dynamic sampling: the learner gets groupsPerStep groups whose rewards differ; everything sampled is journaled",
    () =>
      Effect.gen(function*() {
        // A fast learner: the bandit soon answers "A" nearly always, and most groups of 4 chains agree.
        const learnt = (options: TrainLoop.Options) =>
          Effect.gen(function*() {
            const seen: Array<ReadonlyArray<Trajectory.Group>> = []
            yield* run({ ...options, eval: undefined }, { lr: 3, onLearn: (_, groups) => void seen.push(groups) })
            const journal = (yield* Journal.read(join(options.config.output, "journal.jsonl"))).entries.map((e) =>
              e.entry
            )
            const { metrics } = yield* Report.read(options.config.output)
            return { seen, journal, train: metrics.filter((m) => m.phase === "train") }
          })
        const plain = yield* learnt(yield* setup())
        assert.isTrue(
          plain.seen.some((groups) => groups.some((g) => !Trajectory.rewardsDiffer(g))),
          "without it some steps carry groups without signal"
        )
        const options = yield* setup({}, { dynamicSampling: { maxBatches: 4 } })
        const { seen, journal, train } = yield* learnt(options)
        assert.strictEqual(seen.length, 8)
        for (const groups of seen) {
          assert.isAtMost(groups.length, 3)
          assert.isTrue(groups.every(Trajectory.rewardsDiffer), "only groups whose rewards differ")
        }
        const batches = train.map((m) => m.figures["rollout/dynamic_batches"]!)
        assert.isTrue(batches.every((b) => b >= 1 && b <= 4), `${batches}`)
        assert.isTrue(batches.some((b) => b > 1), "some step sampled more than one batch")
        train.forEach((m, i) => {
          assert.strictEqual(m.figures["rollout/groups_kept"], seen[i]!.length)
          assert.strictEqual(m.figures["rollout/groups_sampled"], m.figures["rollout/dynamic_batches"]! * 3)
        })
        // Every group sampled has its entry, with a seq of its own; a step's seqs are the groups it trained on.
        const groups = journal.flatMap((e) => (e.kind === "group" ? [e] : []))
        assert.strictEqual(groups.length, train.reduce((n, m) => n + m.figures["rollout/groups_sampled"]!, 0))
        assert.strictEqual(new Set(groups.map((g) => g.seq)).size, groups.length)
        assert.isTrue(groups.some((g) => g.seq >= 2 ** 36), "further batches' seqs are apart from the row order's")
        const stepsOf = journal.flatMap((e) => (e.kind === "step" ? [e] : []))
        stepsOf.forEach((e, i) => {
          const trained = e.seqs.map((seq) => groups.find((g) => g.seq === seq)!.groupId)
          assert.deepStrictEqual(trained, seen[i]!.map((g) => g.groupId))
        })
        // The run is a function of its seed: again, the same weights; a crash and a resume end on them too.
        const again = yield* run(
          { ...(yield* setup({}, { dynamicSampling: { maxBatches: 4 } })), eval: undefined },
          { lr: 3 }
        )
        const crashedOptions = yield* setup({}, { dynamicSampling: { maxBatches: 4 } })
        const crashed = yield* Effect.result(run({ ...crashedOptions, eval: undefined }, { lr: 3, failAt: 6 }))
        assert.isTrue(Result.isFailure(crashed))
        const resumed = yield* run({ ...crashedOptions, eval: undefined, resume: true }, { lr: 3 })
        assert.strictEqual(resumed.fromStep, 3)
        assert.strictEqual(resumed.fingerprint, again.fingerprint)
      }).pipe(Effect.provide(NodeServices.layer))
  )

  it.live("dynamic sampling in async mode: a crash and a resume end with the weights of an unbroken run", () =>
    Effect.gen(function*() {
      const timing = { samplerMs: 2, learnMs: 10, lr: 3 }
      const config = [{ mode: "async", maxStaleness: 1 }, { dynamicSampling: { maxBatches: 3 } }] as const
      const unbroken = yield* setup(...config)
      const reference = yield* run({ ...unbroken, eval: undefined }, timing)
      const options = yield* setup(...config)
      assert.isTrue(
        Result.isFailure(yield* Effect.result(run({ ...options, eval: undefined }, { ...timing, failAt: 6 })))
      )
      const resumed = yield* run({ ...options, eval: undefined, resume: true }, { samplerMs: 1, learnMs: 30, lr: 3 })
      assert.strictEqual(resumed.fingerprint, reference.fingerprint)
      assert.deepStrictEqual(
        yield* journaledGroups(options.config.output),
        yield* journaledGroups(unbroken.config.output),
        "every group"
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a tool whose handler dies is said once as a bug in the task's tools, naming the figure", () =>
    Effect.gen(function*() {
      const buggy = Task.make("toy", {
        tools: [Tool.make("calc", {
          description: "calc",
          handler: () =>
            Effect.sync((): string => {
              throw new Error("bug")
            })
        })],
        reward: Toy.reward
      })
      const notices: Array<string> = []
      const options = yield* setup({}, { steps: 3 })
      yield* run({ ...options, task: buggy, eval: undefined, notice: (m) => Effect.sync(() => notices.push(m)) })
      const said = notices.filter((m) => m.includes("died in the tool's own code"))
      assert.strictEqual(said.length, 1, notices.join("\n"))
      assert.match(said[0]!, /^step 1: 12 tool call\(s\) died in the tool's own code \(rollout\/tool_errors\/Defect\)/)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("the summary counts trained steps and steps skipped for lack of signal", () =>
    Effect.gen(function*() {
      const options = yield* setup({}, { steps: 4 })
      const summary = yield* run({ ...options, eval: undefined })
      assert.strictEqual(summary.trained + summary.skipped, 4)
      // The toy learner always applies its step.
      assert.strictEqual(summary.trained, 4)
    }).pipe(Effect.provide(NodeServices.layer)))
})

describe("TrainLoop: inputs read once", () => {
  it.effect("a row Schema that transforms its input (a number from a string) decodes each dataset once", () =>
    Effect.gen(function*() {
      const options = yield* setup({}, { steps: 2 })
      const row = Schema.Struct({ n: Schema.NumberFromString })
      const task: Task.Task = { ...Toy.task(), row }
      const raw = yield* Dataset.parse(
        "train",
        ["1", "2", "3"].map((n) => JSON.stringify({ question: "q", n })).join("\n")
      )
      // Decoded as `agentfly train` loads it (`Dataset.load` with the task's fields); decoding again would fail.
      const train = yield* Dataset.refine(raw, row)
      assert.strictEqual(train.rows[0]!.fields["n"], 1)
      assert.isTrue(Result.isFailure(yield* Effect.result(Dataset.refine({ ...train, decodedBy: [] }, row))))
      const summary = yield* run({ ...options, task, train, eval: undefined })
      assert.strictEqual(summary.trained, 2)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a resumed run's summary is the whole run's, read from the journal: its steps and its evaluations", () =>
    Effect.gen(function*() {
      const options = yield* setup({}, { steps: 8 })
      const crashed = yield* Effect.result(run(options, { failAt: 5 }))
      assert.isTrue(Result.isFailure(crashed))
      const resumed = yield* run({ ...options, resume: true })
      assert.strictEqual(resumed.fromStep, 3)
      assert.strictEqual(resumed.trained, 8, "steps 1–3 trained before the crash count")
      assert.deepStrictEqual(
        resumed.evals.map((e) => e.step),
        [0, 4, 8],
        "the evaluation at step 0 was the first process's"
      )
      assert.isNumber(resumed.evals[0]!.figures["eval/accuracy"])
    }).pipe(Effect.provide(NodeServices.layer)))
})

describe("TrainLoop: results it can verify", () => {
  /** Rollouts in this process whose answers `forge` rewrites, as a worker that rewrites what it returns would. */
  const forging = (forge: (groups: Array<Trajectory.Group>) => Array<Trajectory.Group>) =>
    Effect.gen(function*() {
      const { learner, sampler, versions } = yield* Toy.make()
      const honest = yield* Rollouts.Rollouts.pipe(
        Effect.provide(Rollouts.inProcess),
        Effect.provideService(PolicyVersions, versions)
      )
      const forged = Rollouts.Rollouts.of({
        collect: (setup, rows, sampling, version) =>
          Effect.map(honest.collect(setup, rows, sampling, version), forge)
      })
      return { learner, sampler, versions, forged }
    })

  const rewrites: ReadonlyArray<[string, (groups: Array<Trajectory.Group>) => Array<Trajectory.Group>, string]> = [
    ["a policy span replaced by other tokens with reward 1", (groups) =>
      groups.map((g) => ({
        ...g,
        trajectories: g.trajectories.map((t) => ({
          ...t,
          reward: 1,
          segments: t.segments.map((s) => ({
            ...s,
            spans: s.spans.map((span) =>
              span.source === "policy" ? { ...span, tokenIds: span.tokenIds.map(() => 1_000_000) } : span
            )
          }))
        }))
      })), "outside the model's vocabulary"],
    ["policy version 999999", (groups) =>
      groups.map((g) => ({
        ...g,
        trajectories: g.trajectories.map((t) => ({
          ...t,
          segments: t.segments.map((s) => ({
            ...s,
            spans: s.spans.map((span) => (span.source === "policy" ? { ...span, policyVersion: 999999 } : span))
          }))
        }))
      })), "policy version 999999"],
    ["more groups than asked: a row index of 5000 and a duplicate", (groups) =>
      [...groups, { ...groups[0]!, rowIndex: 5000 }, groups[1]!], "answers row 5000"]
  ]

  for (const [name, forge, says] of rewrites) {
    it.effect(`a forged batch is refused, never trained on: ${name}`, () =>
      Effect.gen(function*() {
        const options = yield* setup({}, { steps: 2 })
        const { forged, learner, sampler, versions } = yield* forging(forge)
        let learned = 0
        const counting = { ...learner, learn: (s: number, g: ReadonlyArray<Trajectory.Group>) => {
          learned++
          return learner.learn(s, g)
        } }
        const error = yield* Effect.flip(Effect.scoped(TrainLoop.run({
          ...options,
          eval: undefined,
          format: { ...options.format, vocabSize: 512 }
        })).pipe(
          Effect.provideService(Rollouts.Rollouts, forged),
          Effect.provideService(Learner, counting),
          Effect.provideService(PolicyVersions, versions),
          Effect.provideService(Sampler, sampler)
        ))
        assert.strictEqual(error.reason._tag, "Mismatch")
        assert.include(error.message, says)
        assert.strictEqual(learned, 0, "the learner never saw it")
        assert.deepStrictEqual(yield* steps(options.config.output), [], "no step journaled")
      }).pipe(Effect.provide(NodeServices.layer)))
  }
})
