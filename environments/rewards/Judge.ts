/**
 * LLM-as-judge rewards: a second model, behind any OpenAI-compatible `/chat/completions` endpoint, grades
 * trajectories against a rubric.
 *
 * - {@link make}: one trajectory at a time, as a `Reward` (any task): the judge reads the rubric and the transcript
 *   and answers `{"score": 0..1, "explanation": "..."}`.
 * - {@link ruler}: group-relative, as ART's RULER: the judge reads every attempt of a group at once and scores each
 *   relative to the others, which needs no absolute scale in the rubric (only "better" and "worse"). It is an
 *   `AgentTask.GroupReward` (`AgentTask.make(..., { groupReward })`).
 *
 * The single-trajectory judge can be given images ({@link Figure}: rendered frames, a screen), sent as `image_url`
 * parts of its user message beside the transcript, as any OpenAI-compatible vision endpoint takes them: `figures`
 * of {@link make} (e.g. {@link transcriptImages}), or {@link grade} with a task's own renders (`simuscene`'s `judge`
 * option).
 *
 * Scores are clamped to [0, 1]. A judge that cannot be reached or answers without a readable score fails with a
 * `RewardError` (`ScoreFailed`), which the run's reward policy turns into 0 (counted under `reward/<name>/error`);
 * a group reward that fails keeps the trajectories' own scores.
 *
 * @since 0.1.0
 */
import { Effect, Option, Redacted, Schema } from "effect"
import { FetchHttpClient } from "effect/http"
import type * as AgentTask from "../../src/AgentTask.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import type { ContentPart, Conversation, Message } from "../../src/Message.ts"
import { text } from "../../src/Message.ts"
import * as Reward from "../../src/Reward.ts"
import type * as Trajectory from "../../src/Trajectory.ts"

// ===== Models =====

/**
 * Where the judge is and what it grades against.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** The judge's API root, e.g. `http://127.0.0.1:8000/v1` or `https://api.openai.com/v1`. */
  readonly baseUrl: string
  readonly model: string
  readonly apiKey?: string | undefined
  /** What a good answer does (and, for {@link make}, what earns which score). */
  readonly rubric: string
  /** The reward's name in metrics (default `judge`, `ruler` for {@link ruler}). */
  readonly name?: string | undefined
  /** Sampling temperature of the judge (default 0). */
  readonly temperature?: number | undefined
  /** Most tokens the judge may write (default 1024). */
  readonly maxTokens?: number | undefined
  /** Time limit of one attempt (default 60 s). */
  readonly timeoutMs?: number | undefined
  /** Retries of a judge that is overloaded, down or slow (default 4, backing off as `OpenAiCompatSampler` does). */
  readonly retries?: number | undefined
  /** Images {@link make}'s judge sees beside each transcript (default none: a text judge). */
  readonly figures?: ((trajectory: Trajectory.Trajectory) => ReadonlyArray<Figure>) | undefined
}

/**
 * The judge's settings as a config file writes them (a task's `judge` option): {@link Options}' fields.
 *
 * @category models
 * @since 0.1.0
 */
export const Config = Schema.Struct({
  baseUrl: Schema.String,
  model: Schema.String,
  apiKey: Schema.optionalKey(Schema.String),
  rubric: Schema.String,
  name: Schema.optionalKey(Schema.String),
  temperature: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0))),
  maxTokens: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  timeoutMs: Schema.optionalKey(Schema.Number.check(Schema.isGreaterThan(0))),
  retries: Schema.optionalKey(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type Config = typeof Config.Type

/**
 * An image the judge sees beside the transcript, with a caption saying what it shows. `url` is a `data:` URL (as
 * `image_url` parts carry them; a remote URL is passed on as it is, for the judge's server to fetch or refuse).
 *
 * @category models
 * @since 0.1.0
 */
export interface Figure {
  readonly caption: string
  readonly url: string
}

// ===== Rendering =====

/**
 * The images of a transcript (its messages' `image_url` parts, in order) as figures, each captioned with its place:
 * `figures` for a judge that should see what the agent saw.
 *
 * @category getters
 * @since 0.1.0
 */
export const transcriptImages = (trajectory: Trajectory.Trajectory): ReadonlyArray<Figure> =>
  trajectory.messages.flatMap((m, i) =>
    typeof m.content === "string"
      ? []
      : m.content.flatMap((part) =>
        part.type === "image_url"
          ? [{ caption: `An image of message ${i + 1} (${m.role}):`, url: part.image_url.url }]
          : []
      )
  )

const callText = (m: Message): string =>
  m.role === "assistant" && m.tool_calls !== undefined && m.tool_calls.length > 0
    ? `\n[tool calls: ${
      m.tool_calls.map((c) =>
        `${c.function.name}(${
          typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments)
        })`
      ).join("; ")
    }]`
    : ""

/**
 * A transcript as the judge reads it: one `ROLE: text` block per message, tool calls written out.
 *
 * @category getters
 * @since 0.1.0
 */
export const transcript = (messages: Conversation): string =>
  messages.map((m) => `${m.role.toUpperCase()}: ${text(m.content)}${callText(m)}`).join("\n\n")

/** The user message's content: the transcript, then each figure's caption and image (text alone without any). */
const withFigures = (text: string, figures: ReadonlyArray<Figure>): string | Array<ContentPart> =>
  figures.length === 0 ? text : [
    { type: "text", text },
    ...figures.flatMap((f): Array<ContentPart> => [
      { type: "text", text: f.caption },
      { type: "image_url", image_url: { url: f.url } }
    ])
  ]

const singlePrompt = (
  rubric: string,
  trajectory: Trajectory.Trajectory,
  figures: ReadonlyArray<Figure>
): Conversation => [
  {
    role: "system",
    content: "You grade an AI agent's work against a rubric. Read the transcript" +
      (figures.length === 0 ? "" : " and look at the images") + ", then answer with one JSON object " +
      `and nothing else: {"explanation": "<one or two sentences>", "score": ` +
      `<a number from 0 to 1>}.\n\nRubric:\n${rubric}`
  },
  { role: "user", content: withFigures(`Transcript:\n\n${transcript(trajectory.messages)}`, figures) }
]

const groupPrompt = (rubric: string, trajectories: ReadonlyArray<Trajectory.Trajectory>): Conversation => [
  {
    role: "system",
    content: "You compare several attempts by AI agents at the same task and score each one relative to the " +
      "others: the best gets the highest score, a clearly worse attempt a clearly lower one, equally good attempts " +
      "equal scores. Scores are numbers from 0 to 1. Answer with one JSON object and nothing else: " +
      `{"scores": [{"trajectory_id": "<id>", "explanation": "<one sentence>", "score": <0 to 1>}, ...]}, one ` +
      `entry per attempt.\n\nRubric:\n${rubric}`
  },
  {
    role: "user",
    content: trajectories.map((t, i) => `<trajectory id="${i + 1}">\n${transcript(t.messages)}\n</trajectory>`).join(
      "\n\n"
    )
  }
]

// ===== Parsing =====

const decodeJson = Schema.decodeUnknownOption(Schema.fromJsonString(Schema.Unknown))

/** The first JSON object in a text (models wrap it in prose or a code fence). */
const firstObject = (raw: string): unknown => {
  for (let start = raw.indexOf("{"); start !== -1; start = raw.indexOf("{", start + 1)) {
    let depth = 0
    let inString = false
    for (let i = start; i < raw.length; i++) {
      const c = raw[i]!
      if (inString) {
        if (c === "\\") i++
        else if (c === "\"") inString = false
      } else if (c === "\"") inString = true
      else if (c === "{") depth++
      else if (c === "}" && --depth === 0) {
        const parsed = decodeJson(raw.slice(start, i + 1))
        if (Option.isSome(parsed)) return parsed.value
        break
      }
    }
  }
  return undefined
}

const clamp = (x: number) => Math.min(1, Math.max(0, x))

const asScore = (u: unknown): number | undefined => {
  const n = typeof u === "string" ? Number(u) : u
  return typeof n === "number" && Number.isFinite(n) ? clamp(n) : undefined
}

/**
 * The score of a single-trajectory verdict: the `score` of its JSON object, else a `score: x` in the text.
 *
 * @category getters
 * @since 0.1.0
 */
export const parseScore = (raw: string): number | undefined => {
  const json = firstObject(raw) as { score?: unknown } | undefined
  const fromJson = asScore(json?.score)
  if (fromJson !== undefined) return fromJson
  const m = /score["']?\s*[:=]\s*(-?\d+(?:\.\d+)?)/i.exec(raw)
  return m === null ? undefined : asScore(m[1])
}

/**
 * The scores of a group verdict, by position (`trajectory_id` 1 … n); undefined unless every attempt got one.
 *
 * @category getters
 * @since 0.1.0
 */
export const parseScores = (raw: string, n: number): ReadonlyArray<number> | undefined => {
  const json = firstObject(raw) as { scores?: unknown } | undefined
  if (!Array.isArray(json?.scores)) return undefined
  const out: Array<number | undefined> = Array.from({ length: n }, () => undefined)
  for (const entry of json.scores as Array<{ trajectory_id?: unknown; score?: unknown }>) {
    const id = Number(entry?.trajectory_id)
    const score = asScore(entry?.score)
    if (Number.isInteger(id) && id >= 1 && id <= n && score !== undefined) out[id - 1] = score
  }
  return out.every((s) => s !== undefined) ? (out as Array<number>) : undefined
}

// ===== The judge =====

const ask = (options: Options, name: string, messages: Conversation) =>
  Effect.gen(function*() {
    const chat = yield* OpenAiCompatSampler.makeChat({
      baseUrl: options.baseUrl,
      model: options.model,
      ...(options.apiKey === undefined ? {} : { apiKey: Redacted.make(options.apiKey) }),
      ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
      ...(options.retries === undefined ? {} : { retries: options.retries })
    })
    const reply = yield* chat.complete({
      messages,
      sampling: { temperature: options.temperature ?? 0, maxTokens: options.maxTokens ?? 1024 }
    })
    return reply.content
  }).pipe(
    Effect.provide(FetchHttpClient.layer),
    Effect.mapError((e) =>
      Reward.rewardError(name, "ScoreFailed", `the judge failed: ${e.message}`, { cause: e })
    )
  )

const unreadable = (name: string, raw: string) =>
  Reward.rewardError(
    name,
    "ScoreFailed",
    `the judge's answer has no readable score: ${JSON.stringify(raw.slice(0, 200))}`
  )

/**
 * One verdict: the judge grades the trajectory's transcript against the rubric, looking at `figures` too (sent as
 * `image_url` parts: the judge must take images then). Its score in [0, 1]; a judge that fails, or answers without a
 * readable score, is a `RewardError` (`ScoreFailed`) named after `options.name` (default `judge`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const grade = (
  options: Options,
  trajectory: Trajectory.Trajectory,
  figures: ReadonlyArray<Figure> = []
): Effect.Effect<number, Reward.RewardError> => {
  const name = options.name ?? "judge"
  return Effect.flatMap(ask(options, name, singlePrompt(options.rubric, trajectory, figures)), (raw) => {
    const score = parseScore(raw)
    return score === undefined ? Effect.fail(unreadable(name, raw)) : Effect.succeed(score)
  })
}

/**
 * A judge that grades each trajectory's transcript against the rubric, as a `Reward` (metrics under
 * `reward/<name>/`).
 *
 * **Example** (A judge served by `agentfly serve`, or any OpenAI-compatible server)
 *
 * ```ts
 * const helpful = Judge.make({
 *   baseUrl: "http://127.0.0.1:8001/v1",
 *   model: "qwen2.5-7b-instruct",
 *   rubric: "1 if the final answer is correct and justified by the tool results, " +
 *     "0.5 if correct but unjustified, else 0."
 * })
 * ```
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options): Reward.Reward<never> => {
  return Reward.make(options.name ?? "judge", {
    score: ({ trajectory }) =>
      Effect.map(grade(options, trajectory, options.figures?.(trajectory) ?? []), (reward) => ({ reward }))
  })
}

/**
 * A group-relative judge (ART's RULER): one call per group, every attempt scored relative to the others.
 *
 * **Gotchas**
 *
 * Its scores are relative within a group only; compare groups by a task's own reward, not by these.
 *
 * @category constructors
 * @since 0.1.0
 */
export const ruler = (options: Options): AgentTask.GroupReward => {
  const name = options.name ?? "ruler"
  return {
    name,
    score: (trajectories) =>
      Effect.flatMap(ask(options, name, groupPrompt(options.rubric, trajectories)), (raw) => {
        const scores = parseScores(raw, trajectories.length)
        return scores === undefined
          ? Effect.fail(unreadable(name, raw))
          : Effect.succeed(scores.map((reward) => ({ reward })))
      })
  }
}
