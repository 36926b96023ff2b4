/**
 * `Train.run`: a whole training run in one call, from a task and a plain config, on the real parts (the tiny Qwen2
 * policy on onnxruntime, the guess game's task). The task's defaults fill the agent keys the config leaves out, as
 * `agentfly train` does; an output directory that holds a run is never replaced silently.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Train from "../../actors/Train.ts"
import * as Generate from "../../examples/guess/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import { found, Game, task } from "../../examples/guess/task.ts"
import * as Environment from "../../src/Environment.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"

describe("Train.run", () => {
  it.live(
    "one call trains a task from a config; the task's defaults fill the agent keys; no silent replace",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "train-run-"))
        yield* Generate.write(
          { dir: join(dir, "data"), seed: 3, train: 16, heldOut: 4, validation: 0, demos: 0, noise: 0 },
          task.defaults.systemPrompt!
        ).pipe(Effect.provide(NodeServices.layer))
        const lines: Array<string> = []
        const options: Train.Options = {
          task,
          dir,
          // Paths relative to `dir`; nothing under `agent` but the chain count: the rest comes from the task.
          config: {
            seed: 1,
            output: "run",
            model: { path: "model", preset: "tiny", initSeed: 1 },
            data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
            agent: { numChains: 2 },
            // A non-group-relative estimator with an entropy bonus moves the weights whatever an untrained policy's
            // (all-zero) rewards, so that the run trains and does not stop as one that learned nothing.
            algorithm: { steps: 2, groupsPerStep: 2, microBatchSize: 4, advantage: "reinforce++", entropyCoef: 0.01 },
            eval: { every: 100, size: 4 }
          },
          write: (text: string) => void lines.push(text),
          tty: false
        }
        const first = yield* Train.run(options)
        assert.strictEqual(first.config.agent.systemPrompt, task.defaults.systemPrompt)
        assert.strictEqual(first.config.agent.renderTools, false)
        assert.strictEqual(first.config.agent.maxTurns, task.defaults.maxTurns)
        assert.strictEqual(first.config.agent.maxNewTokens, task.defaults.maxNewTokens)
        assert.strictEqual(first.config.output, join(dir, "run"))
        assert.isTrue(existsSync(first.report))
        const steps = readFileSync(join(dir, "run", "metrics.jsonl"), "utf8").trim().split("\n")
          .map((line) => JSON.parse(line) as { phase: string; step: number })
          .filter((m) => m.phase === "train").map((m) => m.step)
        assert.deepStrictEqual(steps, [1, 2])
        // The prompt the policy saw: the task's system prompt, no tool list.
        const sample = JSON.parse(readFileSync(join(dir, "run", "samples.jsonl"), "utf8").split("\n")[0]!) as {
          spans: Array<{ source: string; tokens: Array<string> }>
        }
        const prompt = sample.spans.find((s) => s.source === "prompt")!.tokens.join("")
        assert.include(prompt, "Find my number from 1 to 15.")
        assert.notInclude(prompt, "# Tools")
        assert.isTrue(lines.some((line) => line.startsWith("trained 2 of 2 steps")))
        assert.isTrue(lines.some((line) => line.includes("(sync, 2 steps, seed 1, reinforce++) →")), lines.join("\n"))
        // An untrained policy rarely samples its end-of-turn token within 48: the run says which setting cuts it, once,
        // and that its value is the task's default (the config does not set it).
        const cut = lines.filter((line) => line.includes(`cut at agent.maxNewTokens (48, task ${task.name}'s default)`))
        assert.strictEqual(cut.length, 1, lines.join("\n"))

        // The same output again: refused with a typed error that says how to go on, and the run is left as it was.
        const before = readFileSync(join(dir, "run", "metrics.jsonl"), "utf8")
        const refused = yield* Effect.flip(Train.run(options))
        assert.instanceOf(refused, TrainConfig.ConfigError)
        assert.include((refused as TrainConfig.ConfigError).message, "already holds a run")
        assert.include((refused as TrainConfig.ConfigError).message, "--overwrite")
        assert.strictEqual(readFileSync(join(dir, "run", "metrics.jsonl"), "utf8"), before)
        // Asked to start over, it does.
        const again = yield* Train.run({ ...options, overwrite: true })
        assert.strictEqual(again.summary.steps, first.summary.steps)
        // A resume with another seed is refused before the header announces a run that would not start.
        const resumeLines: Array<string> = []
        const reseeded = yield* Effect.flip(Train.run({
          ...options,
          config: { ...options.config, seed: 2 },
          resume: true,
          write: (text: string) => void resumeLines.push(text)
        }))
        assert.include(String((reseeded as Error).message), "was started with another config: seed: 1 → 2")
        assert.isFalse(resumeLines.some((line) => line.startsWith("training ")), resumeLines.join("\n"))

        // Dynamic sampling on the real engine: the untrained policy's groups rarely differ, so the step rolls out its
        // further batch; every group sampled is journaled and counted, the learner gets the ones that differ.
        const dynamicLines: Array<string> = []
        const dynamic = yield* Effect.result(Train.run({
          ...options,
          output: join(dir, "dynamic"),
          config: {
            ...options.config,
            algorithm: { steps: 1, groupsPerStep: 2, microBatchSize: 4, dynamicSampling: { maxBatches: 3 } }
          },
          write: (text: string) => void dynamicLines.push(text)
        }))
        const record = readFileSync(join(dir, "dynamic", "metrics.jsonl"), "utf8").trim().split("\n")
          .map((line) => JSON.parse(line) as { phase: string; figures: Record<string, number> })
          .find((m) => m.phase === "train")!.figures
        const journal = readFileSync(join(dir, "dynamic", "journal.jsonl"), "utf8").trim().split("\n")
          .map((line) => JSON.parse(line) as { kind: string; seq: number })
        const kept = record["rollout/groups_kept"]!
        assert.isAbove(record["rollout/dynamic_batches"]!, 1, JSON.stringify(record))
        assert.strictEqual(record["rollout/groups_sampled"], 2 * record["rollout/dynamic_batches"]!)
        assert.strictEqual(journal.filter((e) => e.kind === "group").length, record["rollout/groups_sampled"])
        assert.isTrue(journal.some((e) => e.kind === "group" && e.seq >= 2 ** 36))
        assert.strictEqual(record["learner/groups_with_signal"], kept)
        assert.isTrue(
          dynamicLines.some((l) => l.includes("grpo, dynamic sampling (≤ 3 batches a step)) →")),
          dynamicLines.join("\n")
        )
        if (kept < 2) {
          assert.isTrue(
            dynamicLines.some((l) => l.includes(`dynamic sampling found ${kept} of 2 groups`)),
            dynamicLines.join("\n")
          )
        }
        assert.strictEqual(
          dynamic._tag === "Success",
          kept > 0,
          "a run whose only step had no signal ends as one that trained nothing"
        )

        // A config in code is typed: a misspelt key does not compile.
        // @ts-expect-error: `stepz` is not a key of `algorithm`
        const typo: TrainConfig.Input = { ...options.config, algorithm: { stepz: 2 } }
        assert.isDefined(typo)

        // Prompts that fill the context (here the tools' schemas) stop the run before any rollout, saying why.
        const crowded = yield* Effect.flip(Train.run({
          ...options,
          output: join(dir, "crowded"),
          config: { ...options.config, agent: { numChains: 2, renderTools: true, maxContextTokens: 96 } }
        }))
        assert.include(String((crowded as Error).message), "no prompt fits the context")
        assert.include(String((crowded as Error).message), "tools' schemas")
        assert.include(String((crowded as Error).message), "agent.renderTools: false")
        assert.isFalse(existsSync(join(dir, "crowded", "metrics.jsonl")))
      }),
    600_000
  )

  it.live("rows without a field the task's reward reads stop the run when they load, naming the reward", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "train-reward-row-"))
      yield* Generate.write(
        { dir: join(dir, "data"), seed: 3, train: 8, heldOut: 2, validation: 0, demos: 0, noise: 0 },
        task.defaults.systemPrompt!
      ).pipe(Effect.provide(NodeServices.layer))
      // The guess game with a combined reward, one part of which reads a field the game's rows do not have.
      const target = Reward.make("target", {
        row: Schema.Struct({ target: Schema.Int }),
        score: ({ row }) => Effect.succeed(row.target)
      })
      const mine = Task.make("guess-target", {
        row: task.row,
        tools: task.tools,
        reward: Reward.combine("found + target", [{ reward: found, weight: 1 }, { reward: target, weight: 1 }]),
        environment: Environment.perChain(Game.layer),
        episode: task.episode,
        defaults: task.defaults
      })
      const config = {
        output: "run",
        model: { path: "model", preset: "tiny" as const },
        data: { train: "data/train.jsonl" },
        algorithm: { steps: 1 }
      }
      const refused = yield* Effect.flip(Train.run({ task: mine, dir, config, write: () => {}, tty: false }))
      assert.instanceOf(refused, Dataset.DatasetError)
      assert.strictEqual(
        (refused as Dataset.DatasetError).message,
        `${join(dir, "data", "train.jsonl")}:1: reward "target" reads target: missing (fix the row, or skip such ` +
          `rows: "data": { "onInvalidRow": "skip" })`
      )
      assert.isFalse(existsSync(join(dir, "model")), "stopped before the model folder")
      // Skipped instead: the rows that have it stay, with the fields the task's Schema gave them.
      const rows = [{ secret: 3 }, { secret: 4, target: 1 }].map((fields, i) => ({ index: i, line: i + 1, fields }))
      const kept = yield* Train.checkRewardFields(mine, { name: "rows.jsonl", rows, skipped: [] }, "skip")
      assert.deepStrictEqual(kept.rows, [{ index: 0, line: 2, fields: { secret: 4, target: 1 } }])
      assert.deepStrictEqual(kept.skipped, [{ line: 1, message: `reward "target" reads target: missing` }])
    }))

  it.live(
    "demonstrations that call a tool the task lacks, or with arguments it refuses, stop the run before training",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "train-demos-"))
        yield* Generate.write(
          { dir: join(dir, "data"), seed: 3, train: 8, heldOut: 2, validation: 0, demos: 0, noise: 0 },
          task.defaults.systemPrompt!
        ).pipe(Effect.provide(NodeServices.layer))
        const toolName = task.tools[0]!.name
        const demo = (name: string, args: unknown) =>
          JSON.stringify({
            messages: [{ role: "user", content: "Find my number from 1 to 15." }, {
              role: "assistant",
              content: "",
              tool_calls: [{ id: "c", type: "function", function: { name, arguments: args } }]
            }]
          })
        const good = (Train.demonstrationProblem(task, [{ role: "assistant", content: "" }]))
        assert.isUndefined(good)
        // Each of a call's problems is its own clause, not run together.
        const call = { id: "c", type: "function" as const, function: { name: toolName, arguments: { guesss: 3 } } }
        assert.strictEqual(
          Train.demonstrationProblem(task, [{ role: "assistant", content: "", tool_calls: [call] }]),
          `messages[0]: invalid arguments for tool "${toolName}": Expected no excess property at ["guesss"]; ` +
            `Missing key at ["n"]`
        )
        writeFileSync(
          join(dir, "data", "demos.jsonl"),
          [demo("search_web", {}), demo(toolName, { guesss: 3 }), demo(toolName, JSON.stringify({ guesss: 3 }))]
            .join("\n") + "\n"
        )
        const config = {
          seed: 1,
          output: "run",
          model: { path: "model", preset: "tiny" as const, initSeed: 1 },
          data: { train: "data/train.jsonl" },
          warmup: { data: "data/demos.jsonl", steps: 2 },
          algorithm: { steps: 1 }
        }
        const lines: Array<string> = []
        // A missing file is named with the key that gave it.
        const misspelt = yield* Effect.flip(
          Train.run({ task, dir, config: { ...config, data: { train: "data/trian.jsonl" } }, tty: false })
        )
        assert.strictEqual((misspelt as Error).message, `data.train: ${join(dir, "data/trian.jsonl")}: no such file`)
        const refused = yield* Effect.flip(
          Train.run({ task, dir, config, write: (t) => void lines.push(t), tty: false })
        )
        // A data file's bad lines, each named FILE:LINE as a training file's rows are (not an "invalid config").
        assert.instanceOf(refused, Dataset.DatasetError)
        const message = (refused as Dataset.DatasetError).message
        const demos = join(dir, "data", "demos.jsonl")
        assert.include(message, `${demos}:1: messages[1] calls "search_web", which task ${task.name} does not have`)
        assert.include(message, `${demos}:2: messages[1]: invalid arguments for tool "${toolName}"`)
        assert.include(
          message,
          `${demos}:3: messages[1]: invalid arguments for tool "${toolName}"`,
          "string arguments too"
        )
        assert.notInclude(message, "invalid config")
        assert.include(message, `skip such rows: "data": { "onInvalidRow": "skip" }`)
        assert.isFalse(existsSync(join(dir, "run", "metrics.jsonl")), "nothing trained")
        assert.isFalse(existsSync(join(dir, "model")), "stopped before the model folder")
      }).pipe(Effect.provide(NodeServices.layer))
  )

  it.live("--overwrite replaces an earlier run's checkpoints, so that the new run keeps its own", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "train-overwrite-"))
      yield* Generate.write(
        { dir: join(dir, "data"), seed: 3, train: 8, heldOut: 2, validation: 0, demos: 0, noise: 0 },
        task.defaults.systemPrompt!
      ).pipe(Effect.provide(NodeServices.layer))
      // A longer earlier run left checkpoints with higher step numbers than this run will reach.
      for (const stale of ["step-000098", "step-000099"]) {
        mkdirSync(join(dir, "run", "checkpoints", stale), { recursive: true })
        writeFileSync(join(dir, "run", "checkpoints", stale, "model.safetensors"), "an earlier run's")
      }
      writeFileSync(join(dir, "run", "journal.jsonl"), "")
      yield* Train.run({
        task,
        dir,
        config: {
          seed: 1,
          output: "run",
          model: { path: "model", preset: "tiny", initSeed: 1 },
          data: { train: "data/train.jsonl" },
          agent: { numChains: 2 },
          algorithm: { steps: 2, groupsPerStep: 2, microBatchSize: 4, advantage: "reinforce++", entropyCoef: 0.01 },
          checkpoint: { every: 1 }
        },
        overwrite: true,
        write: () => {},
        tty: false
      })
      // The run's last two checkpoints are there (a resume starts from them); the earlier run's are gone.
      assert.deepStrictEqual(readdirSync(join(dir, "run", "checkpoints")).sort(), ["step-000001", "step-000002"])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("an output directory that holds a run is refused as such, not as an invalid config", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "train-taken-"))
      mkdirSync(join(dir, "run"))
      writeFileSync(join(dir, "run", "metrics.jsonl"), "")
      const refused = yield* Effect.flip(Train.run({
        task,
        dir,
        config: {
          output: "run",
          model: { path: "model", preset: "tiny" },
          data: { train: "t.jsonl" },
          algorithm: { steps: 3 }
        }
      }))
      assert.instanceOf(refused, TrainConfig.ConfigError)
      assert.strictEqual((refused as TrainConfig.ConfigError).reason, "OutputInUse")
      assert.strictEqual(
        (refused as TrainConfig.ConfigError).message,
        `${join(dir, "run")}: the output directory already holds a run\n` +
          `  metrics.jsonl is there: resume it (--resume; ` +
          `in code resume: true), start over in it (--overwrite; overwrite: true; its files are replaced), or give ` +
          `another output directory (--output DIR)`
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a steps override below 1 or a seed override out of range names the override, not the config file", () =>
    Effect.gen(function*() {
      const refused = yield* Effect.flip(Train.run({
        task,
        dir: mkdtempSync(join(tmpdir(), "train-steps-")),
        config: {
          output: "run",
          model: { path: "model", preset: "tiny" },
          data: { train: "t.jsonl" },
          algorithm: { steps: 3 }
        },
        steps: 0
      }))
      assert.instanceOf(refused, TrainConfig.ConfigError)
      assert.strictEqual((refused as TrainConfig.ConfigError).source, "--steps")
      assert.include((refused as TrainConfig.ConfigError).message, "must be a whole number ≥ 1, got 0")
      const seed = yield* Effect.flip(Train.run({
        task,
        dir: mkdtempSync(join(tmpdir(), "train-seed-")),
        config: {
          output: "run",
          model: { path: "model", preset: "tiny" },
          data: { train: "t.jsonl" },
          algorithm: { steps: 3 }
        },
        seed: -1
      }))
      assert.strictEqual(
        seed.message,
        "--seed: invalid config\n  seed: the override (--seed, or seed in code) must be a whole number from 0 to " +
          "4294967295, got -1"
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a dataset's bad row stops the run naming the key that skips such rows", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "train-badrow-"))
      writeFileSync(
        join(dir, "t.jsonl"),
        `{"question": "Guess my number.", "secret": 3}\n{"question": "Guess my number."}\n`
      )
      const refused = yield* Effect.flip(Train.run({
        task,
        dir,
        config: {
          output: "run",
          model: { path: "model", preset: "tiny" },
          data: { train: "t.jsonl" },
          algorithm: { steps: 1 }
        }
      }))
      assert.strictEqual(
        refused.message,
        `${join(dir, "t.jsonl")}:2: secret: missing ` +
          `(fix the row, or skip such rows: "data": { "onInvalidRow": "skip" })`
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a module run directly records itself as the task; a config's own task key is kept", () =>
    Effect.gen(function*() {
      const raw = { output: "run", model: { path: "model" }, data: { train: "t.jsonl" }, algorithm: { steps: 1 } }
      const source = { file: "mytask/task.ts", dir: join(process.cwd(), "mytask"), raw, exports: { task, config: raw } }
      assert.strictEqual((yield* Train.configOf(task, source)).task, join(process.cwd(), "mytask", "task.ts"))
      const named = { ...source, raw: { ...raw, task: "./other.ts" } }
      assert.strictEqual((yield* Train.configOf(task, named)).task, join(process.cwd(), "mytask", "other.ts"))
      assert.isUndefined((yield* Train.configOf(task, { ...source, exports: {} })).task, "a task given in code")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("an eval.size above the held-out rows is said: every evaluation uses all of them", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "train-evalsize-"))
      writeFileSync(join(dir, "t.jsonl"), `{"question": "Guess my number.", "secret": 3}\n`)
      const lines: Array<string> = []
      // No model folder and no preset: the run stops after the datasets are read.
      yield* Effect.flip(Train.run({
        task,
        dir,
        config: {
          output: "run",
          model: { path: "model" },
          data: { train: "t.jsonl", eval: "t.jsonl" },
          eval: { size: 50 },
          algorithm: { steps: 1 }
        },
        write: (t) => void lines.push(t),
        tty: false
      }))
      assert.include(
        lines.join(""),
        `eval.size 50 is more than the 1 rows of data.eval (${join(dir, "t.jsonl")}): every evaluation uses all 1`
      )
    }).pipe(Effect.provide(NodeServices.layer)))

  it(
    "a model.preset other than the existing folder's architecture is said, since only a missing folder uses it",
    () => {
      const model = { path: "runs/models/m", preset: "small" }
      const said = Train.presetMismatch(model, ModelConfig.presets.tiny)
      assert.include(
        said,
        `model.preset "small" is not used: runs/models/m already holds a model of another architecture`
      )
      assert.include(said, "(2 layers, width 128)")
      // The folder's vocabulary is its tokenizer's (raised by init-model), not a difference of architecture.
      assert.isUndefined(Train.presetMismatch(model, { ...ModelConfig.presets.small, vocabSize: 265 }))
      assert.isUndefined(Train.presetMismatch({ path: "m" }, ModelConfig.presets.tiny))
    }
  )

  it.effect(
    "a task's defaults with a key that is no agent setting (a JavaScript task's typo) is named as the task's",
    () =>
      Effect.gen(function*() {
        const typo = { ...task, defaults: { ...task.defaults, numChain: 4 } as Task.Defaults }
        const refused = yield* Effect.flip(Train.run({
          task: typo,
          dir: mkdtempSync(join(tmpdir(), "train-defaults-")),
          config: {
            output: "run",
            model: { path: "model", preset: "tiny" },
            data: { train: "t.jsonl" },
            algorithm: { steps: 3 }
          }
        }))
        assert.instanceOf(refused, TrainConfig.ConfigError)
        assert.strictEqual((refused as TrainConfig.ConfigError).source, `task ${task.name}`)
        assert.include(
          (refused as TrainConfig.ConfigError).message,
          `task ${task.name}'s defaults.numChain: unknown key (did you mean "numChains"?)`
        )
      }).pipe(Effect.provide(NodeServices.layer))
  )
})
