/**
 * Scripted policies run by the rollout machinery: an environment's **oracle** (a plain TypeScript policy that
 * plays through the same tools and episode protocol as the model, proving each task solvable and the reward right)
 * and its noise baseline. A policy reads the conversation so far and returns the next assistant turn; it runs as a
 * `ChatSampler`, so `Rollout.runTaskChat` rolls it out exactly as a chat API would be, with the task's tools,
 * reward, environment and episode. Its successful trajectories are SFT demonstrations.
 *
 * @since 0.1.0
 */
import { Effect, Layer, Stream } from "effect"
import * as ByteTokenizer from "../src/ByteTokenizer.ts"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Message from "../src/Message.ts"
import type { Conversation, ToolCall } from "../src/Message.ts"
import { ChatSampler } from "../src/Sampler.ts"
import type * as Task from "../src/Task.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import * as Tool from "../src/Tool.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"
import * as ChainFormat from "./ChainFormat.ts"
import * as Rollout from "./Rollout.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"

/**
 * What a policy reads: the conversation so far, in the OpenAI message shape (`Message.Conversation`), named here so
 * that an oracle's parameter can be typed without reaching into `Message`.
 *
 * @category models
 * @since 0.1.0
 */
export type { Conversation }

/**
 * The next assistant turn of a scripted policy: text, tool calls, or both.
 *
 * @category models
 * @since 0.1.0
 */
export interface Reply {
  readonly content?: string | undefined
  readonly toolCalls?: ReadonlyArray<ToolCall> | undefined
}

/**
 * A scripted policy: the conversation so far (system prompt, the row's question, the environment's and tools'
 * observations) to the next turn.
 *
 * @category models
 * @since 0.1.0
 */
export type Policy = (messages: Conversation) => Effect.Effect<Reply> | Reply

/**
 * A tool call with an id unique within its conversation (`call_<turn>`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const call = (messages: Conversation, name: string, args: Record<string, unknown>): ToolCall => ({
  id: `call_${messages.filter((m) => m.role === "assistant").length}`,
  type: "function",
  function: { name, arguments: args }
})

/**
 * The policy as a `ChatSampler`: every request is answered by the policy, never cut by `maxTokens`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const sampler = (policy: Policy): ChatSampler["Service"] =>
  ChatSampler.of({
    complete: (request) =>
      Effect.map(Effect.suspend(() => lift(policy(request.messages))), (reply) => ({
        content: reply.content ?? "",
        toolCalls: reply.toolCalls ?? [],
        finishReason: "stop" as const
      }))
  })

const lift = (reply: Effect.Effect<Reply> | Reply): Effect.Effect<Reply> =>
  Effect.isEffect(reply) ? reply : Effect.succeed(reply)

/**
 * The policy as the `ChatSampler` layer `Rollout.runTaskChat` needs.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (policy: Policy): Layer.Layer<ChatSampler> => Layer.succeed(ChatSampler, sampler(policy))

/**
 * The last message of a given role, or undefined: what most policies read (the latest observation).
 *
 * @category getters
 * @since 0.1.0
 */
export const last = (messages: Conversation, role: Message.Message["role"]): Message.Message | undefined => {
  for (let i = messages.length - 1; i >= 0; i--) if (messages[i]!.role === role) return messages[i]
  return undefined
}

/**
 * The text of a message, or "" for none (`Message.text` of its content).
 *
 * @category getters
 * @since 0.1.0
 */
export const text = (
  message: Message.Message | undefined
): string => (message === undefined ? "" : Message.text(message.content))

/**
 * Which trajectories count as solved: a predicate, or a reward threshold (`1`: reward ≥ 1).
 *
 * @category models
 * @since 0.1.0
 */
export type Solved = number | ((trajectory: Trajectory.Trajectory) => boolean)

const solvedBy = (solved: Solved) =>
  typeof solved === "number" ? (t: Trajectory.Trajectory) => t.reward >= solved : solved

/**
 * An oracle's solve rate: the share of trajectories that are `solved`, by default as a run's accuracy counts them
 * (`Trajectory.isCorrect`: the reward's `acc` metric, else reward ≥ 1), so that a partial-credit reward's solved
 * games count here as they do in `agentfly train` and `eval`. A task with its own `correct` passes it.
 *
 * @category getters
 * @since 0.1.0
 */
export const solveRate = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>,
  solved: Solved = Trajectory.isCorrect
): number => {
  const is = solvedBy(solved)
  return trajectories.length === 0 ? 0 : trajectories.filter(is).length / trajectories.length
}

/**
 * Whether a conversation holds a call the runtime refused for its format (arguments its tool's Schema refuses, a
 * tool the task lacks): a warm-up that loads it stops, naming the line, since the policy would learn calls that fail.
 */
const teachesBadCall = (messages: Conversation): boolean =>
  messages.some((m) => m.role === "tool" && m.is_error === true && Tool.formatErrorOf(text(m)) !== undefined)

/**
 * SFT demonstrations from an oracle's trajectories: the conversations of the `solved` ones (by default as
 * {@link solveRate} counts them), as `{ messages }` lines for a warm-up's `demos.jsonl`. A solved game with a call
 * its tool refused (bad arguments, an unknown tool: the game was won anyway) is left out: the warm-up would refuse
 * the file for it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstrations = (
  trajectories: ReadonlyArray<Trajectory.Trajectory>,
  solved: Solved = Trajectory.isCorrect
): ReadonlyArray<{ readonly messages: Conversation }> => {
  const is = solvedBy(solved)
  return trajectories.filter((t) => is(t) && !teachesBadCall(t.messages)).map((t) => ({ messages: t.messages }))
}

// ===== Through the runtime =====

const byteTokenizer = () =>
  Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))

/**
 * The format oracles play through by default: Qwen2.5's template on the byte-level tokenizer, the tiny policy's,
 * so that an oracle's trajectories are as long as a policy's would be.
 *
 * @category constructors
 * @since 0.1.0
 */
export const byteFormat = (): ChainPorts.Format =>
  ChainFormat.fromTemplate({ tokenizer: byteTokenizer(), template: ChatTemplate.builtinTemplate("qwen2.5") })

/**
 * The format oracles play through: {@link byteFormat} with the embedded vision specials and the `tiny-vl` tower's
 * geometry (patch 8, 2 × 2 merge, at most 64 × 64 pixels), so that a task whose prompts or observations hold images
 * (`environments/vqa`) plays too. Text renders and tokenizes exactly as in `byteFormat` (the three specials never
 * occur in text).
 *
 * @category constructors
 * @since 0.1.0
 */
export const visionByteFormat = (): ChainPorts.Format =>
  ChainFormat.fromTemplate({
    tokenizer: Effect.runSync(
      Tokenizer.make(
        ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
        ByteTokenizer.tokenizerConfig("")
      )
    ),
    template: ChatTemplate.withVision(ChatTemplate.builtinTemplate("qwen2.5"), {
      ...ChatTemplate.qwenVisionTokens,
      geometry: { patchSize: 8, mergeSize: 2, maxPixels: 64 * 64 }
    })
  })

/**
 * The tokens of a whole conversation in {@link byteFormat}, as a warm-up step reads it: the test of whether a
 * demonstration fits a context (a trajectory's own segments cannot say: the chain cuts them at the budget).
 *
 * @category getters
 * @since 0.1.0
 */
export const contextLength = (): (messages: Conversation) => number => {
  const tokenizer = byteTokenizer()
  const template = ChatTemplate.builtinTemplate("qwen2.5")
  return (messages) => {
    const built = Effect.runSync(TrajectoryBuilder.fromConversation({ tokenizer, template, messages }))
    return built.segments.reduce((n, segment) => n + Trajectory.segmentLength(segment), 0)
  }
}

/**
 * Rolls a policy out on a task's rows through `Rollout.runTaskChat` (the task's tools, environment, episode and
 * reward), one chain per row, `concurrency` at a time (default 64), within the task's default turn and context
 * budgets, in `format` (default {@link visionByteFormat}); the trajectories come back in row order.
 *
 * @category constructors
 * @since 0.1.0
 */
export const rollout = (options: {
  readonly task: Task.Task
  readonly rows: ReadonlyArray<Rollout.TaskRow>
  readonly policy: Policy
  readonly concurrency?: number | undefined
  readonly format?: ChainPorts.Format | undefined
}) =>
  Rollout.runTaskChat({
    task: options.task,
    rows: options.rows,
    numChains: 1,
    maxTurns: options.task.defaults.maxTurns ?? 8,
    maxContextTokens: options.task.defaults.maxContextTokens,
    maxConcurrentChains: options.concurrency ?? 64,
    sampling: { temperature: 1, maxTokens: options.task.defaults.maxNewTokens ?? 96, seed: 1 },
    format: options.format ?? visionByteFormat()
  }).pipe(
    Stream.runCollect,
    Effect.map((events) =>
      events.flatMap((e) => (e._tag === "Trajectory" ? [e] : [])).sort((a, b) => a.rowIndex - b.rowIndex)
        .map((e) => e.trajectory)
    ),
    Effect.provide(layer(options.policy))
  )
