import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { appendFileSync, mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Metrics from "../../actors/Metrics.ts"

const record = (step: number, phase: Metrics.MetricsRecord["phase"] = "train"): Metrics.MetricsRecord => ({
  phase,
  step,
  elapsed: step * 1.5,
  figures: { "rollout/reward_mean": step / 10, "learner/kl": 0.001 * step }
})

const sample = (step: number): Metrics.SampleRecord => ({
  phase: "train",
  step,
  groupId: `g${step}`,
  reward: 1,
  termination: "answer",
  spans: [{ source: "prompt", tokens: ["\"step\":", "99"] }, { source: "policy", tokens: ["4"], logprobs: [-0.1] }]
})

describe("Metrics", () => {
  it.effect("writes metrics.jsonl and samples.jsonl that read back", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "metrics-"))
      yield* Effect.scoped(Effect.gen(function*() {
        const m = yield* Metrics.open(dir)
        for (const step of [0, 1, 2]) yield* m.log(record(step))
        yield* m.log(record(2, "eval"))
        yield* m.sample(sample(1))
      }))
      const read = yield* Metrics.read(dir)
      assert.deepStrictEqual(read.metrics, [record(0), record(1), record(2), record(2, "eval")])
      assert.deepStrictEqual(read.samples, [sample(1)])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a resume drops learner records after the resumed step (and a torn line); a fresh open starts empty", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "metrics-"))
      yield* Effect.scoped(Effect.gen(function*() {
        const m = yield* Metrics.open(dir)
        for (const step of [1, 2, 3]) yield* m.log(record(step, "warmup"))
        for (const step of [1, 2, 3, 4]) yield* m.log(record(step))
        for (const step of [2, 4]) yield* m.sample(sample(step))
      }))
      appendFileSync(join(dir, "metrics.jsonl"), `{"phase":"train","step":5,"ela`)
      yield* Effect.scoped(Effect.gen(function*() {
        const m = yield* Metrics.open(dir, { resumeFrom: 2 })
        yield* m.log(record(3))
      }))
      const read = yield* Metrics.read(dir)
      // every warm-up record stays: the warm-up was over before the checkpoint the run resumed from
      assert.deepStrictEqual(read.metrics.map((r) => `${r.phase} ${r.step}`), [
        "warmup 1",
        "warmup 2",
        "warmup 3",
        "train 1",
        "train 2",
        "train 3"
      ])
      assert.deepStrictEqual(read.samples.map((r) => r.step), [2])
      yield* Effect.scoped(Metrics.open(dir))
      assert.strictEqual(readFileSync(join(dir, "metrics.jsonl"), "utf8"), "")
    }).pipe(Effect.provide(NodeServices.layer)))

  it("formats durations, lines and a bar that fits the terminal", () => {
    assert.strictEqual(Metrics.formatDuration(42.4), "42s")
    assert.strictEqual(Metrics.formatDuration(185), "3m05s")
    assert.strictEqual(Metrics.formatDuration(3720), "1h02m")
    const status: Metrics.Status = {
      phase: "train",
      step: 15,
      total: 60,
      elapsed: 30,
      figures: { "rollout/reward_mean": 0.4123, "rollout/accuracy": 0.375, "perf/tokens_per_s": 3456 }
    }
    const line = Metrics.formatLine(status)
    assert.strictEqual(line, "[train] step 15/60  reward 0.412  acc 0.375  kl –  tok/s 3.5k  elapsed 30s")
    // With a critic: its mean value against the mean return it learns.
    const ppo = { ...status, figures: { ...status.figures, "critic/value_mean": 0.31, "critic/return_mean": 0.4 } }
    assert.strictEqual(
      Metrics.formatLine(ppo),
      "[train] step 15/60  reward 0.412  acc 0.375  kl –  value 0.310/0.400  tok/s 3.5k  elapsed 30s"
    )
    for (const columns of [40, 80, 160]) {
      const bar = Metrics.formatBar(status, columns)
      assert.isTrue(bar.length < columns, `fits in ${columns}: ${bar}`)
      assert.include(bar, "15/60")
    }
    const bar = Metrics.formatBar(status, 160)
    assert.include(bar, "eta 1m30s")
    const filled = [...bar].filter((c) => c === "█").length
    const empty = [...bar].filter((c) => c === "░").length
    assert.strictEqual(Math.round((filled / (filled + empty)) * 4), 1, "a quarter done")
  })

  it.effect("on a TTY the bar redraws in place; elsewhere plain lines, thinned to every N steps", () =>
    Effect.gen(function*() {
      const status = (phase: Metrics.Status["phase"], step: number, total = 10): Metrics.Status => ({
        phase,
        step,
        total,
        elapsed: step,
        figures: { "eval/accuracy": 0.5 }
      })
      let tty = ""
      const live = Metrics.display({ write: (t) => (tty += t), tty: true, columns: 100 })
      yield* live.update(status("warmup", 5))
      yield* live.update(status("train", 1))
      yield* live.update(status("train", 2))
      yield* live.update(status("eval", 2))
      yield* live.done
      assert.strictEqual(tty.split("\n").length - 1, 2, "the warm-up bar kept, then the eval line")
      assert.isTrue(tty.endsWith("\n"), "no bar left half-drawn after the last line")
      assert.strictEqual(tty.split("\r\x1b[2K").length - 1, 4)
      let plain = ""
      const log = Metrics.display({ write: (t) => (plain += t), tty: false, everySteps: 5 })
      for (let step = 1; step <= 30; step++) yield* log.update(status("train", step, 30))
      yield* log.update(status("eval", 30, 30))
      assert.deepStrictEqual(plain.trim().split("\n").map((l) => l.slice(0, 18)), [
        "[train] step 5/30 ",
        "[train] step 10/30",
        "[train] step 15/30",
        "[train] step 20/30",
        "[train] step 25/30",
        "[train] step 30/30",
        "[eval] step 30/30 "
      ])
      // A short phase prints every step.
      plain = ""
      for (let step = 1; step <= 4; step++) yield* log.update(status("train", step, 4))
      assert.strictEqual(plain.trim().split("\n").length, 4)
      assert.notInclude(plain, "\r")
    }))

  it("train and eval lines show the share of failed trajectories when some failed", () => {
    const at = (phase: Metrics.Status["phase"], figures: Record<string, number>): string =>
      Metrics.formatFigures({ phase, step: 3, total: 10, elapsed: 1, figures })
    assert.notInclude(at("train", { "rollout/failure_share": 0 }), "fail")
    assert.notInclude(at("train", {}), "fail")
    assert.isTrue(at("train", { "rollout/failure_share": 0.125 }).endsWith("  fail 13%"))
    assert.include(at("train", { "rollout/failure_share": 0.004 }), "fail <1%", "a few failures never read as 0%")
    assert.include(at("eval", { "eval/failure_share": 0.5, "rollout/failure_share": 0 }), "fail 50%")
    assert.notInclude(at("eval", { "rollout/failure_share": 0.5 }), "fail", "each phase shows its own share")
    const figures = { "rollout/failure_share": 0.12 }
    assert.include(Metrics.formatBar({ phase: "train", step: 3, total: 10, elapsed: 3, figures }, 160), "fail 12%")
  })

  it("eval lines show the mean reward, and the invalid tool-call rate only for a task with tools", () => {
    const evalOf = (figures: Record<string, number>) =>
      Metrics.formatFigures({ phase: "eval", step: 3, total: 10, elapsed: 1, figures })
    const commands = { "eval/accuracy": 0.5, "eval/reward_mean": 0.625, "eval/invalid_tool_call_rate": 0 }
    assert.strictEqual(evalOf(commands), "accuracy 0.500  reward 0.625")
    assert.strictEqual(
      evalOf({ ...commands, "eval/tool_calls/search": 1.5 }),
      "accuracy 0.500  reward 0.625  invalid tool calls 0.000"
    )
  })

  it("warm-up lines show the validation accuracy of the steps that checked it", () => {
    const warm = (figures: Record<string, number>): Metrics.Status => ({
      phase: "warmup",
      step: 50,
      total: 900,
      elapsed: 1,
      figures
    })
    assert.strictEqual(Metrics.formatFigures(warm({ "warmup/loss": 0.5 })), "loss 0.5000  tok/s –")
    assert.include(
      Metrics.formatFigures(warm({ "warmup/loss": 0.5, "warmup/validation_accuracy": 0.25 })),
      "validation accuracy 0.250"
    )
  })
})
