/**
 * How a run rolls out, set up once: the task's runtime (tools, reward, environment, episode) built in the run's
 * scope with the config's tool timeout and rendering, beside the config and the model's format ({@link RolloutSetup}).
 * Every way of rolling out reads it (`Rollouts`, rollout workers, the Redis queue's workers, `agentfly eval`), and so
 * do the checks a run makes before its first step: prompts that fill the context, demonstrations longer than a turn.
 *
 * @since 0.1.0
 */
import { Duration, Effect } from "effect"
import type { Scope } from "effect"
import * as AgentTask from "../src/AgentTask.ts"
import type * as Dataset from "../src/Dataset.ts"
import type * as Message from "../src/Message.ts"
import * as RolloutFigures from "../src/RolloutFigures.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"
import type * as Sampler from "../src/Sampler.ts"
import * as Task from "../src/Task.ts"
import type * as TrainConfig from "../src/TrainConfig.ts"
import * as RunError from "./RunError.ts"
import * as TaskRuntime from "./TaskRuntime.ts"

/**
 * How a run rolls out: its config, the model's format and the task's runtime (tools, reward, environment, episode).
 *
 * @category models
 * @since 0.1.0
 */
export interface RolloutSetup {
  readonly config: TrainConfig.TrainConfig
  readonly format: ChainPorts.Format
  readonly runtime: TaskRuntime.TaskRuntime
  readonly maxConcurrentChains?: number | undefined
}

/**
 * Builds a run's rollout setup in the current scope: the task's runtime with the config's tool timeout and tool
 * rendering
 * (`TaskRuntime.make`, which checks the task's environment services before any rollout).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <RE>(options: {
  readonly task: Task.Task<RE>
  readonly config: TrainConfig.TrainConfig
  readonly format: ChainPorts.Format
  readonly maxConcurrentChains?: number | undefined
}): Effect.Effect<RolloutSetup, RunError.RunError, RE | Scope.Scope> =>
  Effect.map(
    TaskRuntime.make(options.task, {
      toolTimeout: Duration.seconds(options.config.agent.toolTimeout),
      renderTools: options.config.agent.renderTools
    }).pipe(Effect.mapError(RunError.wrap("Task"))),
    (runtime) => ({
      config: options.config,
      format: options.format,
      runtime,
      maxConcurrentChains: options.maxConcurrentChains
    })
  )

/**
 * How a batch's rows are sampled: `chains` per row at `temperature`; row `r`'s chain `k` samples with seed
 * `seed + (rowOffset + r) · chains + k`, and its group's id is `s<firstSeq>-g<rowOffset + r>`.
 *
 * @category models
 * @since 0.1.0
 */
export interface BatchSampling {
  readonly firstSeq: number
  readonly chains: number
  readonly temperature: number
  readonly seed: number
  /** The first row's index in the batch when the rows are a part of it (a rollout worker's share); default 0. */
  readonly rowOffset?: number | undefined
}


/**
 * The sampling parameters of a batch's requests: the batch's temperature and seed, the config's `topP` (when below
 * 1) and turn budget (`agent.maxNewTokens`).
 *
 * @category getters
 * @since 0.1.0
 */
export const samplingParams = (
  setup: RolloutSetup,
  sampling: Pick<BatchSampling, "temperature" | "seed">
): Sampler.SamplingParams => ({
  temperature: sampling.temperature,
  ...(setup.config.agent.topP < 1 ? { topP: setup.config.agent.topP } : {}),
  maxTokens: setup.config.agent.maxNewTokens,
  seed: sampling.seed
})

/**
 * The task's tool names, to tell misspelt calls apart in its figures; none for an agent function, whose tools are its
 * SDK's.
 *
 * @category getters
 * @since 0.1.0
 */
export const toolNames = (setup: RolloutSetup): ReadonlyArray<string> | undefined =>
  AgentTask.isAgentTask(setup.runtime.task) ? undefined : setup.runtime.task.tools.map((t) => t.name)

/**
 * Checks that the prompts of a run's first rows (system prompt, question, and the tools' schemas when rendered) leave
 * room to sample within `agent.maxContextTokens`: a prompt that fills the context ends its chain before a single
 * token, and a run of such chains would only report that its rewards were all equal. Fails with `RunError` (`Task`)
 * when none of the first `sample` rows fits, naming the sizes and the ways out; warns when only some do. An agent
 * function's prompts are its SDK's, built at run time: not checked here.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkPromptsFit = Effect.fnUntraced(function*(
  setup: RolloutSetup,
  rows: ReadonlyArray<Dataset.Row>,
  notice: (message: string) => Effect.Effect<void>,
  sample = 32
) {
  const { config, runtime } = setup
  const budget = config.agent.maxContextTokens
  if (AgentTask.isAgentTask(runtime.task) || rows.length === 0 || budget === undefined) return
  // A row the template cannot render is left to its chains' error policy (`TemplateFailed`), not judged here.
  const lengthOf = (row: Dataset.Row, tools: ReadonlyArray<unknown>) =>
    Effect.match(setup.format.start(Task.conversation(runtime.task, row, config.agent.systemPrompt), tools), {
      onFailure: () => undefined,
      onSuccess: (transcript) => transcript.length()
    })
  const rendered = yield* Effect.forEach(rows.slice(0, sample), (row) =>
    Effect.map(lengthOf(row, runtime.tools.schemas), (length) => ({ row, length })))
  const measured = rendered.flatMap((r) => (r.length === undefined ? [] : [{ row: r.row, length: r.length }]))
  if (measured.length === 0) return
  const checked = measured.map((r) => r.row)
  const lengths = measured.map((r) => r.length)
  const over = lengths.filter((n) => n >= budget).length
  if (over === 0) return
  const longest = Math.max(...lengths)
  const schemas = runtime.tools.schemas.length === 0
    ? ""
    : ` (the tools' schemas: ${longest - ((yield* lengthOf(checked[lengths.indexOf(longest)]!, [])) ?? 0)} of them)`
  const ways = `shorten the system prompt or the questions` +
    (schemas === "" ? "" : `, set agent.renderTools: false (the policy then learns the tools from demonstrations)`) +
    `, or raise agent.maxContextTokens with a model whose context holds more`
  if (over === checked.length) {
    return yield* RunError.runError(
      "Task",
      `no prompt fits the context: the first ${checked.length} rows' prompts are up to ${longest} tokens` +
        `${schemas}, agent.maxContextTokens is ${budget}, so no chain could sample a token; ${ways}`
    )
  }
  yield* notice(
    `${over} of the first ${checked.length} rows' prompts fill agent.maxContextTokens (${budget}; the longest is ` +
      `${longest} tokens${schemas}): their chains end before sampling; ${ways}`
  )
})

/**
 * Says, before the warm-up, when demonstrations teach assistant turns longer than `agent.maxNewTokens`: a rollout
 * cuts such a turn before its end (termination `stop`), which otherwise shows only at the first RL step, after the
 * whole warm-up. Measures the first `sample` demonstrations' turns in the run's format; a format that cannot render a
 * turn it did not sample (no `appendAssistant`), or a demonstration that does not render, is not measured.
 *
 * @category constructors
 * @since 0.1.0
 */
export const checkDemosFit = Effect.fnUntraced(function*(
  setup: RolloutSetup,
  demos: ReadonlyArray<Dataset.Row>,
  notice: (message: string) => Effect.Effect<void>,
  sample = 32
) {
  const budget = setup.config.agent.maxNewTokens
  const named = RolloutFigures.turnBudget(budget, setup.runtime.task)
  const longestTurn = (messages: Message.Conversation) =>
    Effect.gen(function*() {
      const first = messages.findIndex((m) => m.role === "assistant")
      if (first === -1) return 0
      const transcript = yield* setup.format.start(messages.slice(0, first), [])
      if (transcript.appendAssistant === undefined) return 0
      let observations: Array<Message.Message> = []
      for (const m of messages.slice(first)) {
        if (m.role !== "assistant") {
          observations.push(m)
          continue
        }
        if (observations.length > 0) yield* transcript.appendObservations(observations)
        observations = []
        yield* transcript.appendAssistant(m)
      }
      const turns = transcript.segments().flatMap((s) => s.spans.filter((span) => span.source === "policy"))
      return Math.max(0, ...turns.map((span) => span.tokenIds.length))
    }).pipe(Effect.orElseSucceed(() => 0))
  const lengths = yield* Effect.forEach(demos.slice(0, sample), (row) => longestTurn(row.messages ?? []))
  const over = lengths.filter((n) => n > budget).length
  if (over === 0) return
  yield* notice(
    `${over} of the first ${lengths.length} demonstrations ${over === 1 ? "has" : "have"} an assistant turn longer ` +
      `than agent.maxNewTokens (${named.value}; the longest is ${Math.max(...lengths)} tokens): a rollout cuts ` +
      `such a turn before its end (termination "stop"), so the policy cannot finish what it learns there; ` +
      `${named.raise} or shorten the demonstrations' turns`
  )
})

