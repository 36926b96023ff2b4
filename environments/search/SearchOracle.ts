/**
 * Scripted policies of the search task, run through the task's own tools by `Rollout.runTaskChat`
 * (`actors/Oracle.ts`):
 * - {@link oracle}: reads the question's kind and name, searches the name, reads the fact off the observation and,
 *   for a two-hop question, searches the name it found before answering. It proves each generated question
 *   answerable from the top passages and the reward right; its trajectories are the SFT demonstrations.
 * - {@link noisy}: the oracle, except that a share of its final answers is the last word of another line of the
 *   observation (a plausible slip, such as the city a company is based in, or a first name): demonstrations that
 *   leave the warm-up something for RL to remove.
 * - {@link random}: searches a random word of the question, then answers a random word of what it read: the noise
 *   baseline.
 *
 * Every policy reads only the conversation, never the row; random choices are drawn from a hash of the question,
 * so that a policy gives the same answer to the same conversation whatever order chains run in.
 *
 * @since 0.1.0
 */
import * as Oracle from "../../actors/Oracle.ts"
import type { Conversation } from "../../src/Message.ts"
import * as Sampling from "../../src/Sampling.ts"
import * as World from "./World.ts"

// ===== Reading =====

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** The relation each kind reads, as a sentence pattern about a name. */
const relations = {
  born: (name: string) => new RegExp(`(?:^|\\n)${escape(name)} was born in ([^.\\n]+)\\.`),
  founder: (name: string) => new RegExp(`(?:^|\\n)${escape(name)} was founded by ([^.\\n]+)\\.`),
  country: (name: string) => new RegExp(`(?:^|\\n)${escape(name)} is a city in ([^.\\n]+)\\.`)
} as const

/** The relations a kind reads, hop by hop. */
const chains: { readonly [K in World.Kind]: ReadonlyArray<keyof typeof relations> } = {
  born: ["born"],
  founder: ["founder"],
  country: ["country"],
  founderBorn: ["founder", "born"],
  bornCountry: ["born", "country"]
}

/** The first user message: the question. */
const questionOf = (messages: Conversation): string => Oracle.text(messages.find((m) => m.role === "user"))

/** The observations of the search calls so far (failed calls included, as the model sees them). */
const observations = (messages: Conversation): Array<string> => {
  const ids = new Set(
    messages.flatMap((m) =>
      m.role === "assistant" ? (m.tool_calls ?? []).filter((c) => c.function.name === "search").map((c) => c.id) : []
    )
  )
  return messages.flatMap((m) => (m.role === "tool" && ids.has(m.tool_call_id) ? [Oracle.text(m)] : []))
}

/**
 * What the oracle does next on a conversation: the query of its next search, or its answer (`unknown` when the
 * question is not one of the world's or a fact is missing from the observation).
 *
 * @category getters
 * @since 0.1.0
 */
export const plan = (
  messages: Conversation
): { readonly search: string } | { readonly answer: string; readonly observation: string } => {
  const parsed = World.parse(questionOf(messages))
  if (parsed === undefined) return { answer: "unknown", observation: "" }
  const read = observations(messages)
  let name = parsed.name
  for (const [hop, relation] of chains[parsed.kind].entries()) {
    const observation = read[hop]
    if (observation === undefined) return { search: name }
    const found = relations[relation](name).exec(observation)?.[1]
    if (found === undefined) return { answer: "unknown", observation }
    name = found
  }
  return { answer: name, observation: read.at(-1)! }
}

const next = (messages: Conversation): () => number => {
  let h = 2166136261
  for (const c of questionOf(messages)) h = Math.imul(h ^ c.charCodeAt(0), 16777619)
  return Sampling.mulberry32(h >>> 0)
}

// ===== Policies =====

/**
 * The oracle.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle: Oracle.Policy = (messages) => {
  const step = plan(messages)
  return "search" in step
    ? { toolCalls: [Oracle.call(messages, "search", { query: step.search })] }
    : { toolCalls: [Oracle.call(messages, "answer", { answer: step.answer })] }
}

/**
 * The oracle with a share `noise` of its final answers replaced by the last word of another line of the last
 * observation (when it has one).
 *
 * @category constructors
 * @since 0.1.0
 */
export const noisy = (noise: number): Oracle.Policy => (messages) => {
  const step = plan(messages)
  if ("search" in step) return { toolCalls: [Oracle.call(messages, "search", { query: step.search })] }
  const draw = next(messages)
  const others = step.observation.split("\n")
    .map((line) => /(\S+)\.$/.exec(line)?.[1])
    .filter((w): w is string => w !== undefined && !step.answer.endsWith(w))
  const slip = draw() < noise && others.length > 0
  const answer = slip ? others[Math.floor(draw() * others.length)]! : step.answer
  return { toolCalls: [Oracle.call(messages, "answer", { answer })] }
}

/**
 * The noise baseline: a random word of the question as the query, then a random word of the observation as the
 * answer.
 *
 * @category constructors
 * @since 0.1.0
 */
export const random: Oracle.Policy = (messages) => {
  const draw = next(messages)
  const pick = (text: string) => {
    const words = text.split(/[^\p{L}]+/u).filter((w) => w !== "")
    return words[Math.floor(draw() * words.length)] ?? "unknown"
  }
  const read = observations(messages)
  return read.length === 0
    ? { toolCalls: [Oracle.call(messages, "search", { query: pick(questionOf(messages)) })] }
    : { toolCalls: [Oracle.call(messages, "answer", { answer: pick(read[0]!) })] }
}
