/**
 * A user's own task, written as a module outside the library (its source is below, written to a folder of its own):
 * a stateful per-chain environment (a locked door) that is reset with each chain's row, speaks after every turn and
 * ends episodes, a tool and a reward that read it. On the real parts (tiny Qwen2 policy on onnxruntime, byte
 * tokenizer), it trains through `TrainLoop.run` and through `agentfly train that-module.ts`, resumes exactly after
 * SIGKILL, and evaluates with `agentfly eval`.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { spawn } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Setup from "../../cli/setup.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { agentfly, agentflyFromSources } from "../utils/agentfly.ts"
import * as TrainLoop from "../../actors/TrainLoop.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

const root = resolve(import.meta.dirname, "../..")

/** The user's module: environment, tool, reward, task and run config. */
const moduleSource = `
import { Context, Effect, Layer, Ref, Schema } from "effect"
import { Environment, Reward, Task, Tool } from "${root}/src/index.ts"

interface State { readonly code: string; readonly open: boolean; readonly resets: number; readonly seed: number }

class Door extends Context.Service<Door, {
  readonly reset: (code: string, seed: number) => Effect.Effect<void>
  readonly knock: (code: string) => Effect.Effect<void>
  readonly state: Effect.Effect<State>
}>()("user/Door") {
  static readonly layer = Layer.effect(Door, Effect.map(Ref.make<State>({ code: "", open: false, resets: 0, seed: -1 }), (s) =>
    Door.of({
      reset: (code, seed) => Ref.update(s, (x) => ({ code, open: false, resets: x.resets + 1, seed })),
      knock: (code) => Ref.update(s, (x) => ({ ...x, open: x.open || code === x.code })),
      state: Ref.get(s)
    })))
}

const knock = Tool.make("knock", {
  description: "Try a code on the door",
  parameters: Schema.Struct({ code: Schema.String }),
  dependencies: [Door],
  handler: ({ code }) => Effect.flatMap(Door, (door) => Effect.as(door.knock(code), ""))
})

const opened = Reward.make("opened", {
  dependencies: [Door],
  score: () => Effect.map(Effect.flatMap(Door, (door) => door.state), (s) => ({
    reward: s.open ? 1 : 0,
    metrics: { acc: s.open ? 1 : 0, resets: s.resets, seed: s.seed, code: s.code.length }
  }))
})

export const task = Task.make("door", {
  row: Schema.Struct({ code: Schema.String }),
  tools: [knock],
  reward: opened,
  environment: Environment.perChain(Door.layer),
  episode: {
    start: ({ row, seed }) => Effect.flatMap(Door, (door) => door.reset(row["code"] as string, seed)),
    step: ({ turn }) => Effect.map(Effect.flatMap(Door, (door) => door.state), (s) =>
      s.open ? { end: "opened" } : turn >= 2 ? { messages: ["The door stays shut."], end: "gave_up" } : { messages: ["Knock again."] })
  },
  defaults: { systemPrompt: "Open the door.", maxTurns: 3, maxNewTokens: 64, renderTools: false }
})

export const config = {
  seed: 11,
  output: "run",
  model: { path: "model", preset: "tiny", initSeed: 3 },
  data: { train: "train.jsonl", eval: "heldout.jsonl" },
  agent: { numChains: 2, maxContextTokens: 256 },
  // A short warm-up teaches the random policy to end its turns (and so to let the door speak).
  warmup: { data: "demos.jsonl", steps: 40, batchSize: 8, lr: 0.003 },
  algorithm: { steps: 6, groupsPerStep: 2, microBatchSize: 4, lr: 0.001, advantage: "reinforce++", entropyCoef: 0.01 },
  eval: { every: 100, size: 2 },
  checkpoint: { every: 2, keep: 2 }
}
`

/** The module and its data in a folder of their own (inside the checkout, where \`effect\` resolves). */
const userProject = () => {
  mkdirSync(join(root, ".tmp"), { recursive: true })
  const dir = mkdtempSync(join(root, ".tmp", "user-task-"))
  writeFileSync(join(dir, "door.ts"), moduleSource)
  const rows = (n: number, offset: number) =>
    Array.from({ length: n }, (_, i) => JSON.stringify({ question: "Knock.", code: `c${offset + i}` })).join("\n") +
    "\n"
  writeFileSync(join(dir, "train.jsonl"), rows(8, 0))
  writeFileSync(join(dir, "heldout.jsonl"), rows(2, 100))
  const demo = (i: number) =>
    JSON.stringify({
      messages: [
        { role: "system", content: "Open the door." },
        { role: "user", content: "Knock." },
        {
          role: "assistant",
          content: "",
          tool_calls: [{ id: "k", type: "function", function: { name: "knock", arguments: { code: `c${i}` } } }]
        },
        { role: "tool", tool_call_id: "k", name: "knock", content: "" },
        { role: "user", content: "Knock again." },
        { role: "assistant", content: "No." }
      ]
    })
  writeFileSync(join(dir, "demos.jsonl"), Array.from({ length: 16 }, (_, i) => demo(i)).join("\n") + "\n")
  return dir
}


const stepHashes = (dir: string) =>
  Effect.map(
    Journal.read(join(dir, "journal.jsonl")),
    (r) => r.entries.flatMap((e) => (e.entry.kind === "step" ? [[e.entry.step, e.entry.weightsHash] as const] : []))
  )

describe("a user's task module", () => {
  it.live("a module outside the package whose folder cannot find effect is refused saying how to link it", () =>
    Effect.gen(function*() {
      // Outside the checkout (a user's own folder), without the README's node_modules link.
      const dir = mkdtempSync(join(tmpdir(), "user-task-unlinked-"))
      writeFileSync(join(dir, "door.mts"), moduleSource)
      const run = yield* agentflyFromSources(["train", join(dir, "door.mts")])
      assert.strictEqual(run.code, 1, run.output)
      assert.include(
        run.output,
        `${join(dir, "door.mts")}: Unreadable\n  ${join(dir, "door.mts")} imports the package "effect", which its ` +
          `folder cannot find: install agentfly-ts in the task's project (npm install agentfly-ts, which brings ` +
          `the effect the runtime uses: docs/install.md), or link this clone's node_modules beside it: ` +
          `ln -s ${join(root, "node_modules")} ${dir}/node_modules`
      )
    }), 300_000)

  it.live("linked as the README says, a module outside the package loads, and the command runs from its folder", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "user-task-linked-"))
      symlinkSync(join(root, "node_modules"), join(dir, "node_modules"))
      writeFileSync(join(dir, "package.json"), `{ "type": "module" }\n`)
      writeFileSync(join(dir, "door.ts"), `${moduleSource}\nexport const oracle = () => ({ content: "No." })\n`)
      writeFileSync(join(dir, "heldout.jsonl"), JSON.stringify({ question: "Knock.", code: "c1" }) + "\n")
      // `bin/agentfly.mjs` by its path, in the user's folder (there `npx agentfly` would look in the npm registry).
      const run = yield* Effect.callback<{ readonly code: number | null; readonly output: string }>((resume) => {
        const child = spawn(process.execPath, [join(root, "bin", "agentfly.mjs"), "oracle", "door.ts", "--rows", "1"], {
          cwd: dir,
          stdio: ["ignore", "pipe", "pipe"]
        })
        let output = ""
        child.stdout.on("data", (d: Buffer) => (output += d.toString()))
        child.stderr.on("data", (d: Buffer) => (output += d.toString()))
        child.on("exit", (code) => resume(Effect.succeed({ code, output })))
        return Effect.sync(() => child.kill("SIGKILL"))
      })
      assert.strictEqual(run.code, 0, run.output)
      assert.include(run.output, "1 rows: solved 0.0 %, mean reward 0.000")
    }), 300_000)

  it.live("TrainLoop.run: every chain's own environment, reset with its row, speaks and ends its episode", () =>
    Effect.gen(function*() {
      const dir = userProject()
      const { task, config: loaded } = yield* Setup.load(join(dir, "door.ts"), { steps: 2 })
      yield* ModelFolder.init(loaded.model.path, { preset: "tiny", seed: 3 })
      const folder = yield* ModelFolder.load(loaded.model.path)
      const config = TrainConfig.onModel(loaded, folder.config)
      const train = yield* Dataset.load(config.data.train, { fields: task.row })
      const demos = yield* Dataset.load(config.warmup!.data, { kind: "conversation" })
      const format = ChainFormat.ofConfig(config, folder)
      // The whole run (a warm-up, then two RL steps), then the groups of a step as the trainer rolls them out.
      const { summary, groups } = yield* Effect.scoped(Effect.gen(function*() {
        const summary = yield* TrainLoop.run({ task, config, format, train, demos })
        const agent = yield* RolloutSetup.make({ task, config, format })
        const groups = yield* Rollouts.collectGroups(agent, train.rows.slice(0, 4), {
          firstSeq: 0,
          chains: 2,
          temperature: 1,
          seed: 40
        })
        return { summary, groups }
      })).pipe(Effect.provide(Layer.provideMerge(Rollouts.inProcess, LocalPolicy.layer(folder, config))))
      assert.strictEqual(summary.steps, 2)
      assert.strictEqual(summary.trained, 2)
      const trajectories = groups.flatMap((g) => g.trajectories)
      assert.strictEqual(trajectories.length, 8)
      for (const t of trajectories) {
        assert.strictEqual(t.metrics["reward/opened/resets"], 1, "a fresh environment per chain, reset once")
        assert.strictEqual(t.metrics["reward/opened/code"], String(t.row?.["code"]).length, "reset with its own row")
        const env = t.segments.flatMap((s) => s.spans).filter((span) => span.source === "env")
        assert.isTrue(env.every((span) => span.logprobs === undefined), "env spans are not the policy's")
        if (t.termination === "episode_end") {
          assert.include(["opened", "gave_up"], t.episodeEnd)
          if (t.episodeEnd === "gave_up") assert.isAbove(env.length, 0, "the environment spoke before giving up")
        }
      }
      const ended = trajectories.filter((t) => t.termination === "episode_end")
      assert.isAbove(ended.length, 0, `terminations: ${trajectories.map((t) => t.termination)}`)
      // Both chains of a group start from the group's episode seed; groups differ.
      const seeds = groups.map((g) => g.trajectories.map((t) => t.metrics["reward/opened/seed"]))
      assert.isTrue(seeds.every(([a, b]) => a === b), `seeds ${JSON.stringify(seeds)}`)
      assert.strictEqual(new Set(seeds.map(([a]) => a)).size, 4)
      const records = readFileSync(join(config.output, "metrics.jsonl"), "utf8").trim().split("\n").map((l) =>
        JSON.parse(l) as { phase: string; figures: Record<string, number> }
      )
      const steps = records.filter((r) => r.phase === "train")
      assert.strictEqual(steps.length, 2)
      for (const r of steps) {
        const shares = Object.entries(r.figures).filter(([k]) => k.startsWith("rollout/termination/"))
        assert.closeTo(shares.reduce((a, [, v]) => a + v, 0), 1, 1e-9, "termination shares sum to 1")
        assert.strictEqual(r.figures["rollout/failure_share"], 0)
      }
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)

  it.live("agentfly train module.ts: SIGKILL then --resume repeats the uninterrupted run; agentfly eval reads it", () =>
    Effect.gen(function*() {
      const dir = userProject()
      const module = join(dir, "door.ts")
      const a = join(dir, "a")
      const b = join(dir, "b")
      const full = yield* agentfly(["train", module, "--output", a])
      assert.strictEqual(full.code, 0, full.output)
      assert.include(full.output, "on task door")
      assert.include(full.output, "trained 6 of 6 steps")
      const reference = yield* stepHashes(a)
      assert.deepStrictEqual(reference.map(([s]) => s), [1, 2, 3, 4, 5, 6])
      assert.strictEqual(new Set(reference.map(([, h]) => h)).size, 6, "every step changed the weights")

      const killed = yield* agentfly(["train", module, "--output", b], () => {
        const path = join(b, "journal.jsonl")
        return existsSync(path) && readFileSync(path, "utf8").includes(`"kind":"step","step":3`)
      })
      assert.strictEqual(killed.signal, "SIGKILL", killed.output)
      const resumed = yield* agentfly(["train", module, "--output", b, "--resume"])
      assert.strictEqual(resumed.code, 0, resumed.output)
      assert.deepStrictEqual(yield* stepHashes(b), reference, "every step once, with the same weights")

      const evaluated = yield* agentfly([
        "eval",
        module,
        "--checkpoint",
        join(b, "checkpoints", "step-000006"),
        "--output",
        join(dir, "eval.json")
      ])
      assert.strictEqual(evaluated.code, 0, evaluated.output)
      assert.match(evaluated.output, /held-out accuracy [\d.]+/)
      const result = JSON.parse(readFileSync(join(dir, "eval.json"), "utf8"))
      assert.strictEqual(result.questions, 2)
      const shares = Object.entries(result.figures as Record<string, number>).filter(([k]) =>
        k.startsWith("eval/termination/")
      )
      assert.closeTo(shares.reduce((a, [, v]) => a + v, 0), 1, 1e-9)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
