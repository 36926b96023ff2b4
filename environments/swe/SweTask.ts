/**
 * The SWE task on Harbor task folders (AgentFly's SWE environments: a container per chain, shell and file tools,
 * the task's tests as the reward): each row names a task folder (`task`) and asks its instruction; the chain gets a
 * container of the folder's environment (`Workspace`), works with `shell {cmd}`, `read {path}`, `edit {path, old,
 * new}` and ends with `submit {}`; the reward is the folder's verifier (`tests/test.sh`'s
 * `/logs/verifier/reward.txt`), run in the chain's container after the episode.
 *
 * Rows: `{ question, task }` — `question` the instruction (the generator copies `instruction.md`), `task` the
 * folder, relative to the option `root` (default: the working directory). `examples/swe/generate.ts` writes
 * seeded bug-fix tasks; any Harbor folders whose `FROM` image exists locally run the same way.
 *
 * Options (`{ "name": "swe", "options": { … } }`): `root`, `pool` (containers at once, default 16), `maxSteps`
 * (actions, default 12), `shellTimeoutMillis` (default 10 s), `maxOutputChars` (default 2,000), `transport`
 * (`attach`, default, or `exec`: how actions reach the container, see `Workspace.Settings`), `rewardKey` (the key
 * of a multi-key `reward.json` that is the training reward where a task's `[metadata] reward_key` is unset; else
 * `reward`, else the mean of the keys: `Workspace.trainingReward`), `toolCallFormat` (weight of a format term added
 * to the verifier's reward, default 0), `allowHosts` (the run's network allow-list: hosts, IPv4 addresses or names,
 * that containers of tasks allowing the internet may reach, e.g. a package mirror or proxy; default none: offline),
 * `bake` (a shell command run as root over every task's image at build time: what verifiers install at verify
 * time, baked in; default none).
 *
 * Harbor's semantics, point by point, and every `task.toml` field honoured or refused: `docs/harbor.md`.
 *
 * @since 0.1.0
 */
import { Effect, Layer, Schema } from "effect"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as Docker from "../../actors/resources/Docker.ts"
import * as Environment from "../../src/Environment.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import * as Tool from "../../src/Tool.ts"
import * as ToolCallFormat from "../rewards/ToolCallFormat.ts"
import * as Workspace from "./Workspace.ts"

// ===== Models =====

const Positive = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

/**
 * The task's options.
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  root: Schema.optionalKey(Task.PathOption),
  pool: Schema.optionalKey(Positive),
  maxSteps: Schema.optionalKey(Positive),
  shellTimeoutMillis: Schema.optionalKey(Positive),
  maxOutputChars: Schema.optionalKey(Positive),
  transport: Schema.optionalKey(Schema.Literals(["attach", "exec"])),
  rewardKey: Schema.optionalKey(Schema.NonEmptyString),
  allowHosts: Schema.optionalKey(Schema.Array(Schema.NonEmptyString)),
  bake: Schema.optionalKey(Schema.NonEmptyString),
  toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type Options = typeof Options.Type

/**
 * A row's fields: the task folder.
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Schema.Struct({ task: Schema.NonEmptyString })

/**
 * The one-line system prompt.
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Fix the repository: shell, read, edit, then submit."

/**
 * The agent settings the task suggests: a look at a file, an edit, a test run and a submission fit in 8 turns.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaults: Task.Defaults = {
  systemPrompt,
  renderTools: false,
  maxTurns: 8,
  maxNewTokens: 256,
  maxContextTokens: 4096
}

// ===== Tools =====

const on = <A>(f: (w: Workspace.Workspace["Service"]) => Effect.Effect<A, Environment.EnvError>) =>
  Effect.flatMap(Workspace.Workspace, f)

/**
 * `shell {cmd}`: `sh -c cmd` in the working directory; the exit code and the output.
 *
 * @category tools
 * @since 0.1.0
 */
export const shell = Tool.make("shell", {
  description: "Run a shell command in the repository",
  parameters: Schema.Struct({ cmd: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Workspace.Workspace],
  handler: ({ cmd }) => on((w) => w.shell(cmd))
})

/**
 * `read {path}`: a file's text.
 *
 * @category tools
 * @since 0.1.0
 */
export const read = Tool.make("read", {
  description: "Read a file",
  parameters: Schema.Struct({ path: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Workspace.Workspace],
  handler: ({ path }) => on((w) => w.read(path))
})

/**
 * `edit {path, old, new}`: replaces the one occurrence of `old` in the file by `new`.
 *
 * @category tools
 * @since 0.1.0
 */
export const edit = Tool.make("edit", {
  description: "Replace the exact text old by new in a file (old must occur once)",
  parameters: Schema.Struct({ path: Schema.String, old: Schema.String, new: Schema.String }),
  failure: Environment.EnvError,
  dependencies: [Workspace.Workspace],
  handler: (args) => on((w) => w.edit(args.path, args.old, args.new))
})

/**
 * `submit {}`: the work is done; the episode ends and the verifier runs.
 *
 * @category tools
 * @since 0.1.0
 */
export const submit = Tool.make("submit", {
  description: "Submit the work (ends the episode)",
  failure: Environment.EnvError,
  dependencies: [Workspace.Workspace],
  handler: () => on((w) => w.submit)
})

/**
 * The four tools.
 *
 * @category constants
 * @since 0.1.0
 */
export const tools = [shell, read, edit, submit] as const

// ===== Reward =====

/**
 * The verifier's reward, with `reward/harbor/{submitted,steps,verifier_exit}` and every key the verifier wrote as
 * `reward/harbor/rewards/<key>` (a multi-key `reward.json`'s figures; `reward.txt`'s is `rewards/reward`). An
 * episode that ended without `submit` is verified too (the tests decide; the run's record says it was not
 * submitted).
 *
 * @category rewards
 * @since 0.1.0
 */
export const verifier = Reward.make("harbor", {
  dependencies: [Workspace.Workspace],
  score: () =>
    Effect.gen(function*() {
      const workspace = yield* Workspace.Workspace
      const state = yield* workspace.state
      const verdict = yield* workspace.verify
      return {
        reward: verdict.reward,
        metrics: {
          submitted: state.submitted ? 1 : 0,
          steps: state.steps,
          verifier_exit: verdict.exitCode,
          ...Object.fromEntries(Object.entries(verdict.rewards).map(([k, v]) => [`rewards/${k}`, v]))
        }
      }
    })
})

/**
 * The reward of a format weight: the verifier's, or `verifier + w·toolCallFormat`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (formatWeight: number) =>
  ToolCallFormat.withFormat(verifier, formatWeight)

// ===== Task =====

/**
 * The workspace settings of the options.
 *
 * @category getters
 * @since 0.1.0
 */
export const settings = (options: Options): Workspace.Settings => ({
  root: options.root ?? Workspace.defaultSettings.root,
  pool: options.pool ?? Workspace.defaultSettings.pool,
  shellTimeoutMillis: options.shellTimeoutMillis ?? Workspace.defaultSettings.shellTimeoutMillis,
  maxOutputChars: options.maxOutputChars ?? Workspace.defaultSettings.maxOutputChars,
  maxSteps: options.maxSteps ?? Workspace.defaultSettings.maxSteps,
  transport: options.transport ?? Workspace.defaultSettings.transport,
  rewardKey: options.rewardKey,
  allowHosts: options.allowHosts,
  bake: options.bake
})

/**
 * The task with its options.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options = {}): Task.Task => {
  // A config's `root` is relative to the config file: `Task.withOptions` resolves it (a `Task.PathOption`).
  const set = settings(options)
  return Task.make("swe", {
    description: "Fix a repository in a container until its tests pass (Harbor task folders)",
    row: Row,
    tools,
    reward: reward(options.toolCallFormat ?? 0),
    environment: Workspace.provider(set),
    layer: Layer.mergeAll(ResourceManager.ResourceManager.layer, Docker.DockerEngine.layer),
    episode: {
      start: () =>
        Effect.flatMap(Workspace.Workspace, (w) =>
          Effect.map(w.overview, (listing) => [listing])),
      step: () =>
        Effect.flatMap(Workspace.Workspace, (w) =>
          Effect.map(w.state, (s) =>
            s.submitted
              ? { end: "submitted" }
              : s.timedOut
              ? { end: "agent_timeout" }
              : s.steps >= w.settings.maxSteps
              ? { end: "out_of_steps" }
              : undefined))
    },
    defaults
  })
}

/**
 * The task as a config names it (`"task": "swe"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("swe", Options, make)
