/**
 * The code-interpreter task (the original AgentFly's first training example): sum a list of numbers by running a
 * program in a Python sandbox (`python` tool), scored by `mathEqual` (see `generate.ts` for why this task).
 *
 * Each rollout chain leases its own sandbox from the resource manager for the length of its episode; released
 * sandboxes are reset (fresh interpreter, empty work dir) and handed to the next chain, so a run starts at most
 * `pool` of them. Docker containers by default (the sandbox's default `attach` transport: one stdio stream per
 * container, no engine work per call); bubblewrap processes with `{ "sandbox": "bubblewrap" }` where no Docker
 * engine runs. The Docker engine layer removes the run's containers when the run ends, and on SIGINT/SIGTERM.
 *
 *   npx tsx examples/python/generate.ts examples/python/data                      # short.json's data
 *   npx agentfly train examples/python/short.json                                  # a smoke run (< 2 minutes)
 *   npx tsx examples/python/generate.ts examples/python/data-full 12345 0.5        # full.json's data
 *   npx agentfly train examples/python/full.json --seed 1 --output runs/python-full-1
 *
 * A config names the task `"./task.ts"`, or with options (see {@link Options}): `{ "name": "./task.ts", "options":
 * { "sandbox": "bubblewrap", "pool": 16, "toolCallFormat": 0.2 } }`. Both configs here add the format term, as
 * the calculator's full config does: it scores well-formed calls while every answer is still wrong (the short run
 * would otherwise have no reward variance to learn from).
 *
 * @since 0.1.0
 */
import { Effect, Layer, Schema } from "effect"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as Docker from "../../actors/resources/Docker.ts"
import { mathEqual } from "../../environments/math/MathEqual.ts"
import * as PythonSandbox from "../../environments/python/PythonSandbox.ts"
import { python } from "../../environments/python/PythonTool.ts"
import { toolCallFormat } from "../../environments/rewards/ToolCallFormat.ts"
import * as Reward from "../../src/Reward.ts"
import * as Task from "../../src/Task.ts"
import { systemPrompt } from "./generate.ts"

/**
 * The task's options: the sandbox backend (default `docker`), the most sandboxes started at once (default 64, the
 * trainer's concurrent chains: fewer makes chains wait for a lease, and the sampler's batches shrink), and the
 * weight of a `toolCallFormat` term added to `mathEqual` (default 0: none).
 *
 * @category models
 * @since 0.1.0
 */
export const Options = Schema.Struct({
  sandbox: Schema.optionalKey(Schema.Literals(["docker", "bubblewrap"])),
  pool: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  toolCallFormat: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type Options = typeof Options.Type

/**
 * The sandbox spec: one per chain, reset on release, up to a minute's wait for a free sandbox (a full pool waits
 * for a chain to finish its episode, sampling included).
 *
 * @category constructors
 * @since 0.1.0
 */
export const spec = (kind: "docker" | "bubblewrap", max: number) =>
  PythonSandbox.spec({
    kind,
    name: `python-${kind}`,
    pool: { max },
    timeouts: { acquireMillis: 60_000 }
  })

/** Each chain's `PythonSandbox`, on Docker containers (the default `attach` transport). */
const dockerPool = (max: number) =>
  Effect.flatMap(spec("docker", max), (s) =>
    Effect.flatMap(PythonSandbox.docker(s), (resource) => PythonSandbox.provider(resource)))

/** Each chain's `PythonSandbox`, on bubblewrap processes. */
const bubblewrapPool = (max: number) =>
  Effect.flatMap(spec("bubblewrap", max), (s) => PythonSandbox.provider(PythonSandbox.bubblewrap(s)))

/**
 * The reward of a format weight: `mathEqual`, or `1·mathEqual + w·toolCallFormat` (a signal for well-formed calls
 * while answers are still all wrong).
 *
 * @category constructors
 * @since 0.1.0
 */
export const reward = (formatWeight: number): Reward.Reward<never> =>
  formatWeight === 0 ? mathEqual : Reward.combine(`1·mathEqual + ${formatWeight}·toolCallFormat`, [
    { reward: mathEqual, weight: 1 },
    { reward: toolCallFormat, weight: formatWeight }
  ])

const description = "Sum a list of numbers by running Python in a sandbox"
const row = Schema.Struct({ answer: Schema.String })
const defaults: Task.Defaults = {
  systemPrompt,
  renderTools: false,
  maxTurns: 2,
  maxNewTokens: 96,
  maxContextTokens: 256
}

/**
 * The task on a sandbox backend.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options = {}): Task.Task => {
  const max = options.pool ?? 64
  const score = reward(options.toolCallFormat ?? 0)
  return options.sandbox === "bubblewrap"
    ? Task.make("python", {
      description,
      row,
      tools: [python],
      reward: score,
      environment: bubblewrapPool(max),
      layer: ResourceManager.ResourceManager.layer,
      defaults
    })
    : Task.make("python", {
      description,
      row,
      tools: [python],
      reward: score,
      environment: dockerPool(max),
      layer: Layer.mergeAll(ResourceManager.ResourceManager.layer, Docker.DockerEngine.layer),
      defaults
    })
}

/**
 * The task as a config names it (`"task": "./task.ts"`, with optional options).
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = Task.withOptions("python", Options, make)
