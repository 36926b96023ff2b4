import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import * as TrainConfig from "../../src/TrainConfig.ts"

const minimal = {
  output: "runs/x",
  model: { path: "model", preset: "tiny" },
  data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
  task: "calculator",
  algorithm: { steps: 10 }
}

const failure = <A, R>(effect: Effect.Effect<A, TrainConfig.ConfigError, R>) =>
  Effect.map(Effect.result(effect), (r) => {
    assert.isTrue(Result.isFailure(r), "expected a failure")
    return (r as Result.Failure<A, TrainConfig.ConfigError>).failure
  })

describe("TrainConfig", () => {
  it.effect("fills defaults for everything optional", () =>
    Effect.gen(function*() {
      const config = yield* TrainConfig.decode(minimal)
      assert.strictEqual(config.mode, "sync")
      assert.strictEqual(config.agent.numChains, 8)
      assert.strictEqual(config.algorithm.advantage, "grpo")
      assert.strictEqual(config.algorithm.lr, 3e-4)
      assert.strictEqual(config.algorithm.steps, 10)
      assert.strictEqual(config.eval.temperature, 0)
      assert.strictEqual(config.checkpoint.every, 10)
      assert.strictEqual(config.data.onInvalidRow, "stop")
      assert.isUndefined(config.warmup)
    }))

  it.effect("a key set to undefined (a TypeScript config) is a missing key; a required one is still named", () =>
    Effect.gen(function*() {
      const config = yield* TrainConfig.decode({ ...minimal, warmup: undefined, agent: { numChains: undefined } })
      assert.isUndefined(config.warmup)
      assert.strictEqual(config.agent.numChains, 8)
      const error = yield* failure(TrainConfig.decode({ ...minimal, output: undefined }))
      assert.include(error.message, "output")
    }))

  it.effect("an unknown or mistyped key fails fast with its path and a suggestion", () =>
    Effect.gen(function*() {
      const error = yield* failure(TrainConfig.decode({
        ...minimal,
        algorithm: { steps: 10, lrr: 0.1 },
        agent: { numChain: 4 },
        evaluation: {}
      }))
      assert.strictEqual(error.reason, "Invalid")
      assert.sameMembers([...error.issues], [
        "algorithm.lrr: unknown key (did you mean \"lr\"?)",
        "agent.numChain: unknown key (did you mean \"numChains\"?)",
        "evaluation: unknown key (did you mean \"eval\"?)"
      ])
      assert.include(error.message, "algorithm.lrr")
    }))

  it.effect("a key in the wrong section names where it belongs", () =>
    Effect.gen(function*() {
      const error = yield* failure(TrainConfig.decode({ ...minimal, algorithm: { steps: 10, maxStaleness: 2 } }))
      assert.deepStrictEqual([...error.issues], [
        "algorithm.maxStaleness: unknown key (it belongs at \"maxStaleness\")"
      ])
    }))

  it.effect("wrong types, bad literals, out-of-range numbers and missing keys each name their path", () =>
    Effect.gen(function*() {
      const { output: _, ...noOutput } = minimal
      const error = yield* failure(TrainConfig.decode({
        ...noOutput,
        mode: "asynchronous",
        algorithm: { steps: 0, lr: "fast", advantage: "ppo" },
        agent: { maxTurns: 1.5 }
      }))
      const byPath = (p: string) => error.issues.filter((i) => i.startsWith(p + ":"))
      assert.strictEqual(byPath("output").length, 1)
      assert.include(byPath("output")[0], "missing")
      assert.include(byPath("mode")[0], "sync")
      assert.strictEqual(byPath("algorithm.steps").length, 1)
      assert.strictEqual(byPath("algorithm.lr").length, 1)
      assert.include(byPath("algorithm.advantage")[0], "grpo")
      assert.include(byPath("agent.maxTurns")[0], "integer")
    }))

  it.effect("a wrong value is shown beside what was expected, cut to 60 characters when long", () =>
    Effect.gen(function*() {
      const error = yield* failure(TrainConfig.decode({
        ...minimal,
        mode: "asink",
        algorithm: { steps: "12", lr: -1 },
        agent: { systemPrompt: 5, maxTurns: "x".repeat(100) }
      }))
      assert.deepStrictEqual([...error.issues].sort(), [
        `agent.maxTurns: Expected number, got "${"x".repeat(59)}…`,
        "agent.systemPrompt: Expected string, got 5",
        "algorithm.lr: Expected a value between 0 (excluded) and 1, got -1",
        `algorithm.steps: Expected number, got "12"`,
        `mode: Expected "sync" | "async", got "asink"`
      ])
      assert.include(error.message, "config: invalid config\n  agent.systemPrompt: Expected string, got 5")
    }))

  it.effect("an unknown model preset is refused at decode time, even for a folder that exists already", () =>
    Effect.gen(function*() {
      const error = yield* failure(TrainConfig.decode({ ...minimal, model: { path: "model", preset: "tiny2" } }))
      assert.deepStrictEqual([...error.issues], [
        `model.preset: Expected "tiny" | "small" | "medium" | "tiny-vl", got "tiny2"`
      ])
    }))

  it.effect("every number has finite bounds, checked at decode time and named in the error", () =>
    Effect.gen(function*() {
      // What JSON makes of 1e400: Infinity.
      const huge = JSON.parse("1e400") as number
      assert.strictEqual(huge, Infinity)
      const cases: Array<[string, Record<string, unknown>, string]> = [
        ["algorithm.lr", { algorithm: { steps: 10, lr: huge } }, "between 0 (excluded) and 1"],
        ["algorithm.lr", { algorithm: { steps: 10, lr: Number.NaN } }, "between 0 (excluded) and 1"],
        ["agent.temperature", { agent: { temperature: huge } }, "between 0 and 2"],
        // Above OpenAI's 2, which `agentfly serve` (and so `engine.servers`) refuses.
        ["agent.temperature", { agent: { temperature: 2.5 } }, "between 0 and 2"],
        ["eval.temperature", { eval: { temperature: -1 } }, "between 0 and 2"],
        ["algorithm.groupsPerStep", { algorithm: { steps: 10, groupsPerStep: 1e9 } }, "between 1 and 4096"],
        ["learner.workers", { learner: { workers: 1000 } }, "between 1 and 64"],
        ["agent.numChains", { agent: { numChains: 1e7 } }, "between 1 and 1024"],
        ["algorithm.steps", { algorithm: { steps: 0 } }, "between 1 and 10000000"],
        ["seed", { seed: -7 }, "between 0 and 4294967295"],
        ["maxStaleness", { maxStaleness: 1000 }, "between 0 and 16"],
        ["algorithm.gradClip", { algorithm: { steps: 10, gradClip: huge } }, "between 0 (excluded) and 1000000"],
        ["agent.toolTimeout", { agent: { toolTimeout: huge } }, "between 0 (excluded) and 86400"],
        ["checkpoint.keep", { checkpoint: { keep: 1e6 } }, "between 1 and 1000"]
      ]
      for (const [path, over, bounds] of cases) {
        const error = yield* failure(TrainConfig.decode({ ...minimal, ...over }))
        const line = error.issues.find((i) => i.startsWith(path + ":"))
        assert.isDefined(line, `${path}: ${error.issues.join("; ")}`)
        assert.include(line, bounds, path)
      }
      // Within bounds each key alone, but one step's rollouts are bounded too.
      const product = yield* failure(TrainConfig.decode({
        ...minimal,
        agent: { numChains: 1024 },
        algorithm: { steps: 10, groupsPerStep: 4096 }
      }))
      assert.deepStrictEqual(product.issues, [
        "algorithm.groupsPerStep: 4096 groups × agent.numChains 1024 is 4194304 trajectories per step; " +
          "expected at most 65536"
      ])
      const ok = yield* TrainConfig.decode({
        ...minimal,
        agent: { numChains: 64 },
        algorithm: { steps: 10, groupsPerStep: 1024 }
      })
      assert.strictEqual(ok.algorithm.groupsPerStep, 1024)
    }))

  it.effect("dynamic sampling: maxBatches 3 by default, at least 2; group-relative estimators only", () =>
    Effect.gen(function*() {
      const on = yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, dynamicSampling: {} } })
      assert.deepStrictEqual(on.algorithm.dynamicSampling, { maxBatches: 3 })
      const rloo = yield* TrainConfig.decode({
        ...minimal,
        algorithm: { steps: 3, advantage: "rloo", dynamicSampling: { maxBatches: 5 } }
      })
      assert.strictEqual(rloo.algorithm.dynamicSampling?.maxBatches, 5)
      const one = yield* failure(
        TrainConfig.decode({ ...minimal, algorithm: { steps: 3, dynamicSampling: { maxBatches: 1 } } })
      )
      assert.include(one.issues.join(), "algorithm.dynamicSampling.maxBatches")
      const reinforce = yield* failure(
        TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "reinforce++", dynamicSampling: {} } })
      )
      assert.deepStrictEqual(reinforce.issues, [
        `algorithm.dynamicSampling: only a group-relative estimator ("grpo", "grpo-no-std", "rloo") loses groups ` +
        `whose rewards are equal (the advantage is "reinforce++")`
      ])
    }))

  it.effect("a critic only with gae; the critic's defaults", () =>
    Effect.gen(function*() {
      const stray = yield* failure(TrainConfig.decode({ ...minimal, critic: { lr: 0.01 } }))
      assert.deepStrictEqual(stray.issues, [
        `critic: only algorithm.advantage "gae" has a critic (the advantage is "grpo")`
      ])
      const typo = yield* failure(
        TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "gae" }, critic: { lrr: 1 } })
      )
      assert.include(typo.issues.join(), "critic.lrr")
      const gae = yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "gae", lambda: 0.95 } })
      assert.deepStrictEqual(TrainConfig.criticOf(gae), {
        lr: 1e-3,
        warmupSteps: 0,
        lrWarmupSteps: 0,
        valueClip: 0.5,
        weightDecay: 0,
        gradClip: 1
      })
      assert.strictEqual(gae.algorithm.lambda, 0.95)
      // The shipped PPO config: the demo's, with a critic.
      const ppo = yield* TrainConfig.load(
        join(dirname(fileURLToPath(import.meta.url)), "../../examples/calculator/ppo.json")
      )
      assert.strictEqual(ppo.algorithm.advantage, "gae")
      assert.strictEqual(TrainConfig.criticOf(ppo).lr, 0.001)
      const allWarmup = yield* failure(
        TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "gae" }, critic: { warmupSteps: 3 } })
      )
      assert.include(allWarmup.issues.join(), "critic.warmupSteps: 3 of algorithm.steps 3")
      const set = yield* TrainConfig.decode({
        ...minimal,
        algorithm: { steps: 3, advantage: "gae" },
        critic: { lr: 0.01 }
      })
      assert.strictEqual(TrainConfig.criticOf(set).lr, 0.01)
      assert.strictEqual(TrainConfig.criticOf(set).valueClip, 0.5)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("keys the estimator or the mode would ignore are refused, naming what uses them", () =>
    Effect.gen(function*() {
      const issues = (input: object) =>
        Effect.map(failure(TrainConfig.decode({ ...minimal, ...input })), (e) => e.issues)
      assert.deepStrictEqual(yield* issues({ algorithm: { steps: 3, lambda: 0.95 } }), [
        `algorithm.lambda: only algorithm.advantage "gae" uses GAE's λ (the advantage is "grpo")`
      ])
      assert.deepStrictEqual(yield* issues({ algorithm: { steps: 3, advantage: "rloo", gamma: 0.99 } }), [
        `algorithm.gamma: only algorithm.advantage "reinforce++" and "gae" discount (the advantage is "rloo")`
      ])
      assert.deepStrictEqual(yield* issues({ algorithm: { steps: 3, groupsPerStep: 8, miniBatches: 16 } }), [
        "algorithm.miniBatches: 16 mini-batches of whole groups need at least as many groups a step " +
        "(algorithm.groupsPerStep is 8)"
      ])
      assert.deepStrictEqual(yield* issues({ maxStaleness: 4 }), [
        `maxStaleness: 4 applies only in async mode (every sync batch samples with the current policy): ` +
        `set "mode": "async"`
      ])
      // The discounts an estimator uses are written out (a run's recorded config.json says them), and decode again.
      const discounted = (algorithm: object) =>
        Effect.map(
          TrainConfig.decode({ ...minimal, algorithm: { steps: 3, ...algorithm } }),
          (c) => [c.algorithm.gamma, c.algorithm.lambda]
        )
      assert.deepStrictEqual(yield* discounted({ advantage: "reinforce++" }), [1, undefined])
      assert.deepStrictEqual(yield* discounted({ advantage: "gae", lambda: 0.95 }), [1, 0.95])
      assert.deepStrictEqual(yield* discounted({ advantage: "grpo" }), [undefined, undefined])
      const recorded = yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "gae" } })
      assert.deepStrictEqual(yield* TrainConfig.decode(JSON.parse(JSON.stringify(recorded))), recorded)
      // A learning-rate warm-up longer than its phase: the rate asked for is never reached.
      assert.deepStrictEqual(yield* issues({ algorithm: { steps: 3, lrWarmupSteps: 4 } }), [
        "algorithm.lrWarmupSteps: 4 is more than algorithm.steps 3: the learning rate would never reach algorithm.lr"
      ])
      assert.deepStrictEqual(yield* issues({ warmup: { data: "d.jsonl", steps: 50, warmupSteps: 100 } }), [
        "warmup.warmupSteps: 100 is more than warmup.steps 50: the learning rate would never reach warmup.lr"
      ])
      assert.deepStrictEqual(
        yield* issues({ algorithm: { steps: 3, advantage: "gae" }, critic: { lrWarmupSteps: 5 } }),
        [
          "critic.lrWarmupSteps: 5 is more than algorithm.steps 3: the critic's learning rate would never reach " +
          "critic.lr"
        ]
      )
      // The learner's memory settings are the local learner's: refused with a trainer server.
      assert.deepStrictEqual(
        yield* issues({ learner: { url: "http://127.0.0.1:8400/v1", moments: "bfloat16", recompute: true } }),
        [
          "learner.moments: only read by the local learner, not with learner.url (the trainer server keeps its own " +
          "settings)",
          "learner.recompute: only read by the local learner, not with learner.url (the trainer server keeps its own " +
          "settings)"
        ]
      )
      yield* TrainConfig.decode({ ...minimal, learner: { moments: "bfloat16", recompute: true } })
      yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, lrWarmupSteps: 3 } })
      yield* TrainConfig.decode({ ...minimal, warmup: { data: "d.jsonl", steps: 50, warmupSteps: 50 } })
      // What uses them is accepted, and a run's recorded config.json (the default maxStaleness written out) decodes.
      yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "gae", gamma: 0.99, lambda: 0.95 } })
      yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, advantage: "reinforce++", gamma: 0.99 } })
      yield* TrainConfig.decode({ ...minimal, algorithm: { steps: 3, groupsPerStep: 8, miniBatches: 8 } })
      yield* TrainConfig.decode({ ...minimal, mode: "async", maxStaleness: 4 })
      yield* TrainConfig.decode({ ...minimal, mode: "sync", maxStaleness: 1 })
      yield* TrainConfig.decode({ ...minimal, mode: "sync", maxStaleness: 0 })
    }))

  it.effect("loads JSON, YAML and TypeScript configs and resolves paths against the config's folder", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "config-"))
      writeFileSync(join(dir, "a.json"), JSON.stringify({ ...minimal, mode: "async", maxStaleness: 2 }))
      writeFileSync(join(dir, "b.yaml"), "output: out\nmodel: { path: m }\ndata:\n  train: t.jsonl\ntask: t\n" +
        "algorithm:\n  steps: 3\n  lr: 1.0e-3\n")
      writeFileSync(join(dir, "c.ts"), `export default ${JSON.stringify(minimal)}\n`)
      const a = yield* TrainConfig.load(join(dir, "a.json"))
      assert.strictEqual(a.mode, "async")
      assert.strictEqual(a.maxStaleness, 2)
      assert.strictEqual(a.data.train, join(dir, "data/train.jsonl"))
      assert.strictEqual(a.output, join(dir, "runs/x"))
      const b = yield* TrainConfig.load(join(dir, "b.yaml"))
      assert.strictEqual(b.algorithm.lr, 1e-3)
      assert.strictEqual(b.model.path, join(dir, "m"))
      const c = yield* TrainConfig.load(join(dir, "c.ts"))
      assert.strictEqual(c.task, "calculator")
      // A task module's path is resolved too (the run records it: its config.json then works from anywhere).
      writeFileSync(join(dir, "f.json"), JSON.stringify({ ...minimal, task: "./task.ts" }))
      assert.strictEqual((yield* TrainConfig.load(join(dir, "f.json"))).task, join(dir, "task.ts"))
      writeFileSync(
        join(dir, "g.json"),
        JSON.stringify({ ...minimal, task: { name: "../t/task.ts", options: { n: 1 } } })
      )
      assert.deepStrictEqual((yield* TrainConfig.load(join(dir, "g.json"))).task, {
        name: join(dir, "../t/task.ts"),
        options: { n: 1 }
      })
      writeFileSync(join(dir, "d.json"), JSON.stringify({
        ...minimal,
        warmup: { data: "demos.jsonl", steps: 900, stopAt: { data: "data/validation.jsonl", accuracy: 0.3 } }
      }))
      const d = yield* TrainConfig.load(join(dir, "d.json"))
      assert.strictEqual(d.warmup?.data, join(dir, "demos.jsonl"))
      assert.deepStrictEqual(d.warmup?.stopAt, {
        data: join(dir, "data/validation.jsonl"),
        accuracy: 0.3,
        every: 50,
        onMiss: "continue"
      })
      writeFileSync(
        join(dir, "e.json"),
        JSON.stringify({
          ...minimal,
          warmup: { data: "demos.jsonl", steps: 900, stopAt: { data: "v.jsonl", accuracy: 1.5, evry: 10 } }
        })
      )
      const e = yield* failure(TrainConfig.load(join(dir, "e.json")))
      assert.isTrue(e.issues.some((i) => i.startsWith("warmup.stopAt.accuracy:")), e.issues.join("; "))
      assert.include(e.issues.join("\n"), `warmup.stopAt.evry: unknown key (did you mean "every"?)`)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("syntax errors, duplicate keys, missing files and unknown formats are typed errors", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "config-"))
      writeFileSync(join(dir, "bad.json"), `{"output": "x",\n  "model": {`)
      writeFileSync(join(dir, "dup.yaml"), "output: a\noutput: b\n")
      writeFileSync(join(dir, "x.toml"), "")
      assert.strictEqual((yield* failure(TrainConfig.load(join(dir, "bad.json")))).reason, "Syntax")
      assert.strictEqual((yield* failure(TrainConfig.load(join(dir, "dup.yaml")))).reason, "Syntax")
      assert.strictEqual((yield* failure(TrainConfig.load(join(dir, "x.toml")))).reason, "UnsupportedFormat")
      const none = yield* failure(TrainConfig.load(join(dir, "none.json")))
      assert.strictEqual(none.reason, "Unreadable")
      assert.deepStrictEqual(none.issues, [`no such file (${join(dir, "none.json")})`])
      // So is a module run directly that is not there: unreadable, not a syntax error.
      const noModule = yield* failure(TrainConfig.load(join(dir, "none.mts")))
      assert.strictEqual(noModule.reason, "Unreadable")
      assert.deepStrictEqual(noModule.issues, ["no such file"])
      // A directory is no config; a run's output directory names the config it recorded.
      mkdirSync(join(dir, "run"))
      assert.include((yield* failure(TrainConfig.load(join(dir, "run")))).message, "a directory, not a config file (")
      writeFileSync(join(dir, "run", "config.json"), "{}")
      assert.include(
        (yield* failure(TrainConfig.load(join(dir, "run")))).message,
        `a directory, not a config file; the run there recorded its config: give ${join(dir, "run", "config.json")}`
      )
      // A task module without a config says so, and how to train its task.
      writeFileSync(join(dir, "task.mjs"), "export const task = {}\n")
      const bare = yield* failure(TrainConfig.load(join(dir, "task.mjs")))
      assert.include(bare.message, "the module exports no config")
      assert.include(bare.message, `from a config beside it: "task": "./task.mjs"`)
    }).pipe(Effect.provide(NodeServices.layer)))
})
