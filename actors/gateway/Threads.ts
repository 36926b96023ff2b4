/**
 * The threads of a gateway episode (`Recorder.ts`): one per conversation the agent keeps, a chat thread holding its
 * token-level transcript or a token thread its ids, and which thread a request belongs to. A chat request's
 * messages are compared with each thread's conversation by their canonical keys (`Bodies.messageKey`); the
 * assistant turns in a thread's conversation are exactly what the gateway answered, so a request that sends the
 * conversation back is matched to the ids that were sampled, which are never re-tokenized:
 * - **continuation**: a thread's whole conversation is a prefix of the request and the rest holds no assistant
 *   message: the rest (tool results, user turns) is appended as observations (only their suffix is tokenized,
 *   sources `tool` / `env` / `template`), then the policy samples;
 * - **rewrite**: otherwise, when the request starts with the messages an idle thread started from, the agent rewrote
 *   that thread's history (trimmed, summarised, reordered, edited a turn): the thread starts a new **segment** from
 *   a fresh render of the request (all of it prompt, never trained on), as `TrajectoryBuilder` does when a template
 *   rewrites history;
 * - **new thread**: anything else, or a continuation of a thread that is busy with another request (parallel
 *   requests: sub-agents, concurrent calls), starts a thread of its own, linked to the episode (and to the busy
 *   thread it shares a prefix with).
 *
 * A token thread (`/v1/completions`) is continued by a prompt that extends its ids, and rewritten by one that
 * extends only its first prompt.
 *
 * @since 0.1.0
 */
import type * as ChainPorts from "../../src/ChainPorts.ts"
import type * as Trajectory from "../../src/Trajectory.ts"
import type * as Bodies from "./Bodies.ts"

// ===== Models =====

/**
 * What every thread keeps.
 *
 * @category models
 * @since 0.1.0
 */
export interface Common {
  readonly index: number
  /** The thread this one forked from (a parallel request sharing its prefix). */
  readonly parent: number | undefined
  closed: Array<Trajectory.Segment>
  busy: boolean
  lastActive: number
  turns: number
  tokens: number
  lastFinish: Bodies.Turn["finishReason"] | undefined
  /** The last turn was cut by the context budget, or a request was refused for it. */
  contextEnded: boolean
}

/**
 * A conversation: its transcript and the keys of its messages.
 *
 * @category models
 * @since 0.1.0
 */
export interface ChatThread extends Common {
  readonly _tag: "Chat"
  transcript: ChainPorts.Transcript
  /** Canonical keys of the conversation in the client's terms (assistant turns as answered). */
  keys: Array<string>
  /** How many of `keys` the open segment started from. */
  startCount: number
  toolsKey: string
  /** Observations were appended and the sample has not been (a request failed or was cut in between). */
  pendingSample: boolean
  toolCalls: number
  parseErrors: number
  /** Calls of a tool the request did not declare (its SDK cannot run them). */
  unknownCalls: number
  /** The request's own `max_tokens` when it, below the run's `maxNewTokens`, cut the last turn. */
  cutAtRequest: number | undefined
}

/**
 * A thread of token ids (`/v1/completions`).
 *
 * @category models
 * @since 0.1.0
 */
export interface TokenThread extends Common {
  readonly _tag: "Tokens"
  spans: Array<Trajectory.Span>
  ids: Array<number>
  start: ReadonlyArray<number>
}

/**
 * @category models
 * @since 0.1.0
 */
export type Thread = ChatThread | TokenThread

// ===== Matching =====

/**
 * Where a request belongs: continuing a thread from its `from`-th message (or id), rewriting one, or a new thread
 * (forked from `parent`).
 *
 * @category models
 * @since 0.1.0
 */
export type Choice<T extends Thread> =
  | { readonly _tag: "Continue"; readonly thread: T; readonly from: number }
  | { readonly _tag: "Rewrite"; readonly thread: T }
  | { readonly _tag: "New"; readonly parent: number | undefined }

const commonPrefix = (a: ReadonlyArray<unknown>, b: ReadonlyArray<unknown>): number => {
  const n = Math.min(a.length, b.length)
  let i = 0
  while (i < n && a[i] === b[i]) i++
  return i
}

/**
 * Where a chat request belongs (see the module docs). Pure: nothing is marked busy.
 *
 * @category getters
 * @since 0.1.0
 */
export const chooseChat = (
  all: ReadonlyArray<Thread>,
  keys: ReadonlyArray<string>,
  toolsKey: string
): Choice<ChatThread> => {
  const threads = all.filter((t): t is ChatThread => t._tag === "Chat" && t.toolsKey === toolsKey)
  let continuation: ChatThread | undefined
  let busyPrefix: ChatThread | undefined
  for (const t of threads) {
    const k = commonPrefix(t.keys, keys)
    if (k !== t.keys.length) continue
    const rest = keys.slice(k)
    const extends_ = rest.length > 0 ? rest.every((key) => !key.startsWith("a\u0000")) : t.pendingSample
    if (!extends_) continue
    if (t.busy) busyPrefix ??= t
    else if (continuation === undefined || t.keys.length > continuation.keys.length) continuation = t
  }
  if (continuation !== undefined) return { _tag: "Continue", thread: continuation, from: continuation.keys.length }
  if (busyPrefix !== undefined) return { _tag: "New", parent: busyPrefix.index }
  const rewritten = threads
    .filter((t) => !t.busy && commonPrefix(t.keys, keys) >= t.startCount && t.startCount > 0)
    .sort((a, b) => b.lastActive - a.lastActive)[0]
  if (rewritten !== undefined) return { _tag: "Rewrite", thread: rewritten }
  const sibling = threads.find((t) => t.busy && commonPrefix(t.keys, keys) > 0)
  return { _tag: "New", parent: sibling?.index }
}

/**
 * Where a `/v1/completions` prompt belongs: the longest idle thread whose ids it extends, else the idle thread whose
 * first prompt it extends (a rewrite), else a new thread.
 *
 * @category getters
 * @since 0.1.0
 */
export const chooseTokens = (all: ReadonlyArray<Thread>, ids: ReadonlyArray<number>): Choice<TokenThread> => {
  const threads = all.filter((t): t is TokenThread => t._tag === "Tokens" && !t.busy)
  const extendsIds = (prefix: ReadonlyArray<number>) =>
    prefix.length <= ids.length && commonPrefix(prefix, ids) === prefix.length
  const continued = threads.filter((t) => extendsIds(t.ids)).sort((a, b) => b.ids.length - a.ids.length)[0]
  if (continued !== undefined) return { _tag: "Continue", thread: continued, from: continued.ids.length }
  const rewritten = threads.filter((t) => extendsIds(t.start)).sort((a, b) => b.lastActive - a.lastActive)[0]
  return rewritten !== undefined ? { _tag: "Rewrite", thread: rewritten } : { _tag: "New", parent: undefined }
}

// ===== Records =====

/**
 * A thread's segments: the closed ones, then the open one.
 *
 * @category getters
 * @since 0.1.0
 */
export const segmentsOf = (thread: Thread): Array<Trajectory.Segment> =>
  thread._tag === "Chat"
    ? [...thread.closed, ...thread.transcript.segments()]
    : [...thread.closed, ...(thread.spans.length === 0 ? [] : [{ spans: thread.spans, messageCount: 0 }])]
