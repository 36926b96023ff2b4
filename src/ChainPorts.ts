/**
 * The ports of a rollout chain: what `actors/RolloutChain.ts` speaks to, so that any chat template, parser, tool
 * runtime or reward plugs in.
 *
 * - {@link Format}: messages ↔ tokens. It starts a {@link Transcript} (token-in/token-out: the exact ids sent to and
 *   sampled from the policy) from the prompt and the tools' schemas;
 * - {@link ToolRunner}: runs one turn's tool calls against the chain's environment (`ToolActor.toPort`);
 * - {@link Scorer}: scores the finished trajectory with the same environment (`RewardActor.toPort`).
 *
 * The actors export one adapter each to these ports; a chain never sees a tool or reward definition itself.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import type { Context } from "effect"
import type { AssistantMessage, Conversation, Message, ToolCall } from "./Message.ts"
import type * as RolloutError from "./RolloutError.ts"
import type * as Image from "./Image.ts"
import type { GenerateRequest, GenerateResult, SamplingParams } from "./Sampler.ts"
import type { RewardStatus, Segment, Trajectory } from "./Trajectory.ts"

/**
 * A growing token-level transcript, owned by one chain. It holds the exact token ids sent to and sampled from the
 * policy; only observation suffixes are tokenized.
 *
 * @category models
 * @since 0.1.0
 */
export interface Transcript {
  /** Tokens of the current segment: the length of the next prompt. */
  readonly length: () => number
  /** The next prompt: the current segment's ids, ending with the assistant header. */
  readonly promptTokenIds: () => ReadonlyArray<number>
  /**
   * The images of the next prompt's image spans, in order (what a vision engine needs beside the ids); none for a
   * text-only prompt. Optional: a format without it sends text-only requests.
   */
  readonly promptImages?: () => Effect.Effect<ReadonlyArray<Image.Image>>
  /** Appends sampled ids verbatim (a policy span) and parses them into the assistant turn. */
  readonly appendSampled: (result: GenerateResult) => Effect.Effect<AssistantTurn, RolloutError.RolloutError>
  /** Appends observation messages (tool results, env messages); only their suffix is tokenized. */
  readonly appendObservations: (messages: ReadonlyArray<Message>) => Effect.Effect<void, RolloutError.RolloutError>
  /**
   * Appends an assistant message that the policy did not sample (chat mode: a black-box API's reply), rendered
   * by the template as a policy turn without logprobs. Optional: formats without it cannot run in chat mode.
   */
  readonly appendAssistant?: (
    message: typeof AssistantMessage.Type
  ) => Effect.Effect<AssistantTurn, RolloutError.RolloutError>
  readonly messages: () => Conversation
  readonly segments: () => ReadonlyArray<Segment>
  /**
   * The conversation as the template renders it now (assistant turns as their sampled text): the message view
   * until a fold, the folded context after one. Optional: formats without it cannot fold (`ContextPolicy`).
   */
  readonly context?: () => Conversation
  /**
   * Replaces the rendered context by `context` (a context policy's fold, `kind` its name): closes the open segment
   * and starts a new one, all prompt. Optional, with `context`.
   */
  readonly fold?: (context: Conversation, kind: string) => Effect.Effect<void, RolloutError.RolloutError>
  /**
   * An independent copy: appending to either leaves the other as it was (the gateway puts a thread back with it
   * when a request is refused).
   */
  readonly fork: () => Transcript
}

/**
 * The request for a transcript's next turn: its prompt's ids, `sampling`, and its prompt's images when it has any
 * (a text-only prompt's request is exactly `{ promptTokenIds, sampling }`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const promptRequest = (transcript: Transcript, sampling: SamplingParams): Effect.Effect<GenerateRequest> => {
  const promptTokenIds = transcript.promptTokenIds()
  if (transcript.promptImages === undefined) return Effect.succeed({ promptTokenIds, sampling })
  return Effect.map(
    transcript.promptImages(),
    (images): GenerateRequest =>
      images.length === 0 ? { promptTokenIds, sampling } : { promptTokenIds, sampling, images }
  )
}

/**
 * An assistant turn as parsed from sampled ids.
 *
 * @category models
 * @since 0.1.0
 */
export interface AssistantTurn {
  readonly message: typeof AssistantMessage.Type
  readonly toolCalls: ReadonlyArray<ToolCall>
  /** Malformed tool calls the parser found (the turn's `ParseFailed` reasons). */
  readonly parseErrors: ReadonlyArray<string>
  /** Whether the sampled ids ended the turn (an end-of-turn token); false when cut by `maxTokens`. */
  readonly complete: boolean
}

/**
 * The agent format: chat template plus tool-call parser.
 *
 * @category models
 * @since 0.1.0
 */
export interface Format {
  readonly start: (
    messages: Conversation,
    tools: ReadonlyArray<unknown>
  ) => Effect.Effect<Transcript, RolloutError.RolloutError>
  /** Token ids that end an assistant turn, added to every request's stop ids. */
  readonly stopTokenIds: ReadonlyArray<number>
  /** The model's vocabulary size, when known: a sampled id at or above it did not come from this model. */
  readonly vocabSize?: number | undefined
}

/**
 * The result of one turn's tool calls.
 *
 * @category models
 * @since 0.1.0
 */
export interface ToolTurn {
  /** One tool message per call, in call order. */
  readonly messages: ReadonlyArray<Message>
  /** A terminal tool succeeded: the chain ends with `answer`. */
  readonly terminal: boolean
  /** The reason of every failed call (`Timeout`, `DecodeError`, ...), counted in the trajectory's metrics. */
  readonly errors?: ReadonlyArray<string> | undefined
}

/**
 * The tool runtime of a run (the tools port): tool definitions for the template, and one turn's execution against
 * the chain's environment context. Failures the model should see are observations (tool messages with `is_error`);
 * the error channel carries failures that the chain's policy decides on (`ToolFailed`, `EnvFailed`).
 *
 * @category models
 * @since 0.1.0
 */
export interface ToolRunner {
  readonly schemas: ReadonlyArray<unknown>
  readonly executeTurn: (
    calls: ReadonlyArray<ToolCall>,
    context: Context.Context<never>
  ) => Effect.Effect<ToolTurn, RolloutError.RolloutError>
}

/**
 * A reward's verdict on a finished trajectory.
 *
 * @category models
 * @since 0.1.0
 */
export interface RewardResult {
  readonly reward: number
  readonly status: RewardStatus
  /** Merged into the trajectory's metrics as given (use CleanRL names, e.g. `reward/<Name>/acc`). */
  readonly metrics?: Readonly<Record<string, number>> | undefined
  /** The reward decided the trajectory must not train (e.g. a `drop` reward error policy). */
  readonly masked?: boolean | undefined
  /** The reward failed and its own error policy scored it (`RewardFailed`): the trajectory's `error`. */
  readonly failure?: RolloutError.RolloutError | undefined
  /**
   * One reward per segment, when the scorer scores segments itself (a folded trajectory's): set as each segment's
   * `reward` in place of the context policy's split of `reward`. A count that is not the segments' masks the
   * trajectory (`RewardFailed`).
   */
  readonly segmentRewards?: ReadonlyArray<number> | undefined
}

/**
 * The reward port: scores a finished trajectory, with the chain's environment context (a reward may read the same
 * lease).
 *
 * @category models
 * @since 0.1.0
 */
export type Scorer = (
  trajectory: Trajectory,
  context: Context.Context<never>
) => Effect.Effect<RewardResult, RolloutError.RolloutError>

/**
 * No tools: every turn ends the chain with `no_tool_call`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const noTools: ToolRunner = {
  schemas: [],
  executeTurn: (calls) =>
    Effect.succeed({
      messages: calls.map((call) => ({
        role: "tool" as const,
        content: `unknown tool: ${call.function.name}`,
        tool_call_id: call.id,
        is_error: true
      })),
      terminal: false
    })
}
