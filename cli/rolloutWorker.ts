/**
 * `agentfly rollout-worker CONFIG [--host 127.0.0.1] [--port 8300]`: runs a training run's rollouts for its trainer
 * (`rollout.workers`), here or on another machine, until interrupted (see `actors/RolloutWorker.ts`). It loads the
 * run's own config and task (the same file the trainer runs, so that its agent key matches), the model folder's
 * tokenizer and template (`model.path`, which must exist), and samples on the run's `engine.servers`. With
 * `AGENTFLY_WORKER_TOKEN` set, only requests bearing it are served (the trainer sends its own).
 *
 * @since 0.1.0
 */
import { Console, Effect } from "effect"
import type { Scope } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import * as ChainFormat from "../actors/ChainFormat.ts"
import * as InferenceServers from "../actors/InferenceServers.ts"
import * as LocalPolicy from "../actors/LocalPolicy.ts"
import * as ResourceManager from "../actors/ResourceManager.ts"
import * as RolloutWorker from "../actors/RolloutWorker.ts"
import * as Trainer from "../actors/Trainer.ts"
import * as AgentTask from "../src/AgentTask.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Setup from "./setup.ts"
import { exitOnFailure } from "./train.ts"

const workerError = (message: string) => new Trainer.TrainerError({ reason: "Workers", message })

/**
 * @category commands
 * @since 0.1.0
 */
export const rolloutWorker = Command.make(
  "rollout-worker",
  {
    config: Argument.String("config").pipe(
      Argument.withDescription("The run's config (the same file its trainer runs)")
    ),
    host: Flag.String("host").pipe(Flag.withDescription("Address to listen on"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(
      Flag.withDescription("Port to listen on (0: any free port)"),
      Flag.withDefault(8300),
      Flag.filter((p) => p >= 0 && p <= 65535, (p) => `--port must be in [0, 65535], got ${p}`)
    )
  },
  Effect.fn("rollout-worker")(function*({ config: file, host, port }) {
    const { task, config: requested } = yield* Setup.load(file)
    if (AgentTask.isAgentTask(task)) {
      return yield* workerError("rollout workers run tasks of tools, rewards and environments, not agent functions")
    }
    const urls = requested.engine.servers
    if (urls === undefined) {
      return yield* workerError(
        `${file} lists no engine.servers: rollout workers sample on the run's inference servers ` +
          "(agentfly serve --accept-weights)"
      )
    }
    const folder = yield* ModelFolder.load(requested.model.path)
    const config = LocalPolicy.onModel(folder, requested)
    // A task module's environment needs only what a run provides (the resource manager), as in `Train.runConfig`.
    const format = ChainFormat.ofConfig(config, folder)
    const agent = yield* (Trainer.agent({ task, config, format }) as Effect.Effect<
      Trainer.Agent,
      Trainer.TrainerError,
      ResourceManager.ResourceManager | Scope.Scope
    >)
    const servers = yield* InferenceServers.make({
      urls,
      parameters: Qwen2.parameters(folder.config),
      token: process.env["AGENTFLY_WEIGHTS_TOKEN"] || undefined
    })
    const token = process.env["AGENTFLY_WORKER_TOKEN"] || undefined
    const worker = yield* RolloutWorker.serve(agent, servers, { host, port, token })
    yield* Console.log(
      `rollout worker for task ${task.name} (agent key ${RolloutWorker.agentKey(task.name, config)}) at ` +
        `${worker.baseUrl}, sampling on ${urls.length} inference server${urls.length === 1 ? "" : "s"}` +
        (token === undefined ? "" : ", requests must bear AGENTFLY_WORKER_TOKEN")
    )
    return yield* Effect.never
  }, Effect.scoped, Effect.provide(ResourceManager.ResourceManager.layer), exitOnFailure)
).pipe(Command.withDescription("Run a training run's rollouts for its trainer (rollout.workers)"))
