/**
 * `agentfly eval` on the real parts (tiny Qwen2 policy on onnxruntime, calculator tool, mathEqual reward): a run's
 * checkpoint evaluated with the run's settings repeats the run's own evaluation at that step; flags override the
 * settings; a corrupt checkpoint, a config without a held-out split and a model folder not made yet fail with their
 * reasons; trajectories that failed (an environment whose reset throws) are said in the summary line, not only
 * counted as wrong.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { cpSync, mkdirSync, mkdtempSync, readFileSync, truncateSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Eval from "../../cli/eval.ts"
import { failureSentence } from "../../cli/oracle.ts"
import * as Train from "../../cli/train.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import type * as Trajectory from "../../src/Trajectory.ts"

const ended = (errorReason?: string, error?: string): Trajectory.Trajectory => ({
  trajectoryId: "t",
  groupId: "g",
  chainId: "c",
  messages: [],
  segments: [],
  termination: errorReason === undefined ? "stop" : "error",
  reward: 0,
  rewardStatus: "scored",
  metrics: {},
  trainable: true,
  masked: false,
  ...(errorReason === undefined ? {} : { errorReason, error: error ?? "" })
})

describe("agentfly eval", () => {
  it("a policy's own failures (a tool call cut by max tokens) add no failure sentence; the infrastructure's do", () => {
    const cut = ended("ParseFailed", "ParseFailed: the turn was cut by max tokens inside a tool call")
    // It read "0 of 8 trajectories failed (undefined), counted as wrong; first: ParseFailed: ...".
    assert.isUndefined(failureSentence([cut, ended(), cut, ended()]))
    const broken = ended("EnvFailed", "EnvFailed: reset threw")
    assert.deepStrictEqual(failureSentence([cut, broken, ended(), broken]), {
      sentence: "; 2 of 4 trajectories failed (EnvFailed), counted as wrong; first: EnvFailed: reset threw",
      first: "EnvFailed: reset threw"
    })
  })

  it.live(
    "a checkpoint repeats its run's evaluation; flags override; bad inputs fail with their reasons",
    () =>
      Effect.gen(function*() {
        const dir = mkdtempSync(join(tmpdir(), "eval-"))
        yield* Generate.write({
          dir: join(dir, "data"),
          seed: 4,
          train: 16,
          heldOut: 6,
          validation: 2,
          demos: 4,
          noise: 0
        })
        const config = {
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
          algorithm: { steps: 2, groupsPerStep: 2, lr: 0.01, entropyCoef: 0.01, advantage: "reinforce++" },
          eval: { every: 2, temperature: 1 },
          checkpoint: { every: 2 }
        }
        writeFileSync(join(dir, "config.json"), JSON.stringify(config))
        const quiet = { write: () => {}, tty: false }
        const trained = yield* Train.run({ config: join(dir, "config.json"), ...quiet })
        const last = trained.summary.evals.at(-1)!
        assert.strictEqual(last.step, 2)

        const checkpoint = join(dir, "run", "checkpoints", "step-000002")
        const lines: Array<string> = []
        const output = join(dir, "eval.json")
        const again = yield* Eval.run({
          config: join(dir, "config.json"),
          checkpoint,
          output,
          write: (t) => lines.push(t)
        })
        assert.deepStrictEqual(again.figures, last.figures, "the run's own evaluation at step 2")
        assert.strictEqual(again.questions, 6)
        assert.deepStrictEqual(JSON.parse(readFileSync(output, "utf8")), JSON.parse(JSON.stringify(again)))
        assert.match(
          lines.join(""),
          /held-out accuracy \d\.\d{3}, mean reward \d\.\d{3}, invalid tool-call rate \d\.\d{3} \(6 questions × 1/
        )

      // Another seed samples other answers; more samples per question are all counted; the folder's own weights.
      const reseeded = yield* Eval.run({ config: join(dir, "config.json"), checkpoint, seed: 6, ...quiet })
      assert.notDeepEqual(reseeded.figures, last.figures)
      const more = yield* Eval.run({ config: join(dir, "config.json"), checkpoint, samples: 3, size: 4, ...quiet })
      assert.strictEqual(more.figures["eval/trajectories"], 12)
      const initialLines: Array<string> = []
      const initial = yield* Eval.run({ config: join(dir, "config.json"), write: (t) => initialLines.push(t) })
      assert.include(initialLines.join(""), "model (the model folder's own weights, not a run's")
      assert.strictEqual(initial.weights, "model")
      assert.notDeepEqual(initial.figures, last.figures, "the checkpoint's weights, not the folder's")

        // A truncated checkpoint, a bad flag and a config with no held-out split.
        const broken = join(dir, "broken")
        cpSync(checkpoint, broken, { recursive: true })
        truncateSync(join(broken, "model.safetensors"), 100)
        const corrupt = yield* Effect.flip(Eval.run({ config: join(dir, "config.json"), checkpoint: broken, ...quiet }))
        assert.strictEqual((corrupt as { _tag: string })._tag, "CheckpointError")
        assert.include((corrupt as Error).message, "model.safetensors")
        // The run's folder in place of a checkpoint names its newest one; a path that is not there says so.
        const at = (path: string) =>
          Effect.flip(Eval.run({ config: join(dir, "config.json"), checkpoint: path, ...quiet }))
        const folder = yield* at(join(dir, "run"))
        assert.include((folder as Error).message, `give one of its checkpoints, e.g. ${checkpoint}`)
        const nowhere = yield* at(join(dir, "x"))
        assert.include((nowhere as Error).message, "no such checkpoint")
        // A step the run does not have (pruned, or never written): the ones it has.
        const pruned = yield* at(join(dir, "run", "checkpoints", "step-000099"))
        assert.include((pruned as Error).message, "step-000099: no such checkpoint; the run has ")
        assert.include((pruned as Error).message, "step-000002")
        // Another split: --data.
        const validation = join(dir, "data", "validation.jsonl")
        const otherLines: Array<string> = []
        const other = yield* Eval.run({
          config: join(dir, "config.json"),
          checkpoint,
          data: validation,
          write: (t) => otherLines.push(t)
        })
        assert.strictEqual(other.questions, 2)
        assert.strictEqual(other.data, validation)
        assert.match(otherLines.join(""), /: accuracy \d\.\d{3}, .* \(2 questions of .*validation\.jsonl × 1/)
        // Greedy answers repeat: several samples of a question at temperature 0 are said to be one answer.
        const greedyLines: Array<string> = []
        yield* Eval.run({
          config: join(dir, "config.json"),
          checkpoint,
          samples: 2,
          temperature: 0,
          size: 2,
          write: (t) => greedyLines.push(t)
        })
        assert.include(greedyLines.join(""), "greedy answers repeat, so the 2 samples of a question are one answer")
        // --episodes: the first questions' episodes as the model saw them, after the figures.
        const shown: Array<string> = []
        yield* Eval.run({
          config: join(dir, "config.json"),
          checkpoint,
          size: 3,
          episodes: 2,
          write: (t) => shown.push(t)
        })
        const text = shown.join("")
        assert.strictEqual(text.match(/\nepisode \d \(reward \d\.\d{3}, \w+/g)?.length, 2, text)
        assert.match(text, /\nuser: .+\nassistant: /)
        const typo = yield* Effect.flip(
          Eval.run({ config: join(dir, "config.json"), data: join(dir, "nope.jsonl"), ...quiet })
        )
        assert.include((typo as Error).message, `--data: ${join(dir, "nope.jsonl")}: no such file`)
        const flag = yield* Effect.flip(Eval.run({ config: join(dir, "config.json"), samples: 0, ...quiet }))
        assert.include((flag as Error).message, "agentfly eval's flags")
        assert.include((flag as Error).message, "--samples: Expected a value between 1 and")
        writeFileSync(join(dir, "noeval.json"), JSON.stringify({ ...config, data: { train: "data/train.jsonl" } }))
        const noEval = yield* Effect.flip(Eval.run({ config: join(dir, "noeval.json"), ...quiet }))
        assert.include((noEval as Error).message, "data.eval: the config names no held-out split")
      }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)),
    120_000
  )

  it.live("trajectories that failed are said with the first failure, in the line and in --output", () =>
    Effect.gen(function*() {
      // A user's task whose environment cannot be reset for one row of two (a module inside the checkout, where
      // `effect` resolves).
      const root = resolve(import.meta.dirname, "../..")
      mkdirSync(join(root, ".tmp"), { recursive: true })
      const dir = mkdtempSync(join(root, ".tmp", "eval-failures-"))
      writeFileSync(
        join(dir, "rusty.ts"),
        `import { Context, Effect, Layer, Schema } from "effect"
import { Environment, Reward, Task, Tool } from "${root}/src/index.ts"
class Lock extends Context.Service<Lock, { readonly reset: (code: string) => Effect.Effect<void> }>()("user/Lock") {
  static readonly layer = Layer.succeed(Lock, Lock.of({
    reset: (code) => code === "rusty" ? Effect.die(new Error("lock rusty does not turn")) : Effect.void
  }))
}
const turn = Tool.make("turn", { parameters: Schema.Struct({}), handler: () => Effect.succeed("") })
export const task = Task.make("rusty", {
  row: Schema.Struct({ code: Schema.String }),
  tools: [turn],
  reward: Reward.make("none", { score: () => Effect.succeed(0) }),
  environment: Environment.perChain(Lock.layer),
  episode: { start: ({ row }) => Effect.flatMap(Lock, (lock) => lock.reset(row.code)) },
  defaults: { systemPrompt: "Open.", maxTurns: 1, maxNewTokens: 4, renderTools: false }
})
export const config = {
  output: "run",
  model: { path: "model", preset: "tiny" },
  data: { train: "rows.jsonl", eval: "rows.jsonl" },
  algorithm: { steps: 1 },
  eval: { samples: 2 }
}
`
      )
      const rows = ["fine", "rusty", "fine", "rusty"].map((code) => JSON.stringify({ question: "Open.", code }))
      writeFileSync(join(dir, "rows.jsonl"), rows.join("\n") + "\n")
      // Before its model folder exists: said so, with how to make it, not as a file that cannot be read.
      const unmade = yield* Effect.flip(Eval.run({ config: join(dir, "rusty.ts"), write: () => {} }))
      assert.strictEqual((unmade as { _tag: string })._tag, "ModelFolderError")
      assert.strictEqual(
        (unmade as Error).message,
        `model.path ${join(dir, "model")}: the model folder does not exist yet (no config.json): train first ` +
          `(agentfly train ${join(dir, "rusty.ts")} initialises it from model.preset "tiny"), or create it with ` +
          `agentfly init-model --out ${join(dir, "model")} --preset tiny`
      )
      yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 0 })
      const lines: Array<string> = []
      const output = join(dir, "eval.json")
      const result = yield* Eval.run({ config: join(dir, "rusty.ts"), output, write: (t) => lines.push(t) })
      assert.include(
        lines.join(""),
        "; 4 of 8 trajectories failed (ChainDefect), counted as wrong; first: ChainDefect: Error: lock rusty does " +
          "not turn"
      )
      assert.include(result.firstFailure, "lock rusty does not turn")
      assert.strictEqual(JSON.parse(readFileSync(output, "utf8")).firstFailure, result.firstFailure)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
