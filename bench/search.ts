/**
 * `npm run bench -- search`
 *
 * The search task's environment (`environments/search/`), at 10,000 and 100,000 passages of the seeded world:
 *
 * - `index`: building the world's passages and the BM25 index, and the latency of one `SearchIndex.search` (top
 *   2) and of one search action as the tool runs it (`SearchSession.search`: budget, search, rendering), p50 / p99
 *   over the oracle's queries of 2,000 questions (30 % of two hops);
 * - `steps`: environment steps (tool calls: searches and answers) per second of the oracle on 640 held-out
 *   questions, 64 chains at once through the runtime (`Rollout.runTaskChat`: chains, tool actor, reward actor,
 *   per-chain sessions, the format) against a bare loop calling the same functions directly (a session per
 *   question, the oracle's `plan`, `SearchSession.search`, the exact-match check), rounds alternating after
 *   `WARMUP_ROUNDS` untimed ones of each side, medians.
 *   Two formats: the byte-level tokenizer with the Qwen2.5 template (what a rollout of the tiny policy pays: the
 *   transcript is rendered and tokenized after every observation) and a messages-only format (what a chat-API
 *   rollout needs: no tokens), which isolates the runtime's own cost. With the byte format, a third side: the bare
 *   loop plus a token transcript of every turn (`TrajectoryBuilder`) and nothing else, which bounds runtime ÷ bare
 *   for any runtime that keeps token transcripts.
 *
 * Headline: runtime ÷ bare steps/s at 10,000 passages with the byte-level format (the target ≥ 0.67).
 */
import { Effect, Layer, Stream } from "effect"
import { loadavg } from "node:os"
import * as ChainFormat from "../actors/ChainFormat.ts"
import * as Oracle from "../actors/Oracle.ts"
import * as Rollout from "../actors/Rollout.ts"
import type * as ChainPorts from "../src/ChainPorts.ts"
import * as Qa from "../environments/rewards/Qa.ts"
import * as SearchIndex from "../environments/search/SearchIndex.ts"
import * as SearchOracle from "../environments/search/SearchOracle.ts"
import * as SearchSession from "../environments/search/SearchSession.ts"
import * as SearchTask from "../environments/search/SearchTask.ts"
import * as World from "../environments/search/World.ts"
import * as ByteTokenizer from "../src/ByteTokenizer.ts"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import type { Conversation, Message } from "../src/Message.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"

const SIZES = [10_000, 100_000] as const
const QUESTIONS = 640
const CHAINS = 64
const ROUNDS = 5
const WARMUP_ROUNDS = 16

const now = () => Number(process.hrtime.bigint()) / 1e6
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const quantile = (xs: ReadonlyArray<number>, q: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!
}

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))
const template = ChatTemplate.builtinTemplate("qwen2.5")
const byteFormat = ChainFormat.fromTemplate({ tokenizer, template })

/** A message-list transcript over a copy of `messages` (a fork is another one). */
const transcriptOf = (messages: ReadonlyArray<Message>): ChainPorts.Transcript => {
  const history: Array<Message> = [...messages]
  return {
    length: () => 0,
    promptTokenIds: () => [],
    appendSampled: () => Effect.die("messagesFormat: chat mode only"),
    appendAssistant: (message) =>
      Effect.sync(() => {
        history.push(message)
        return { message, toolCalls: message.tool_calls ?? [], parseErrors: [], complete: true }
      }),
    appendObservations: (observations) => Effect.sync(() => void history.push(...observations)),
    messages: (): Conversation => [...history],
    segments: () => [],
    fork: () => transcriptOf(history)
  }
}

/** A chat-mode format without tokens: the transcript is the message list (a black-box API's rollout). */
const messagesFormat: ChainPorts.Format = {
  stopTokenIds: [],
  start: (messages) => Effect.sync(() => transcriptOf(messages))
}

/** The oracle's episodes through the runtime: tool calls per second. */
const runtime = (
  index: SearchIndex.SearchIndex["Service"],
  rows: ReadonlyArray<Rollout.TaskRow>,
  format: ChainPorts.Format
) =>
  Effect.gen(function*() {
    const start = now()
    const events = yield* Rollout.runTaskChat({
      task: SearchTask.make({}, Layer.succeed(SearchIndex.SearchIndex, index)),
      rows,
      numChains: 1,
      maxTurns: 4,
      maxConcurrentChains: CHAINS,
      sampling: { temperature: 1, maxTokens: 64 },
      format
    }).pipe(Stream.runCollect, Effect.provide(Oracle.layer(SearchOracle.oracle)))
    const ms = now() - start
    const trajectories = events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))
    const steps = trajectories.reduce((n, t) => n + t.messages.filter((m) => m.role === "tool").length, 0)
    const solved = trajectories.filter((t) => t.metrics["reward/exactMatch/em"] === 1).length / trajectories.length
    return { stepsPerSecond: steps / (ms / 1000), steps, solved }
  })

/**
 * The same episodes as a plain loop over the environment's functions; with `transcript`, every turn is also
 * appended to a token-level transcript (`TrajectoryBuilder`, the byte format's tokenizer and template) and nothing
 * else of the runtime: what any token-level rollout pays on top of the environment.
 */
const bare = (index: SearchIndex.SearchIndex["Service"], rows: ReadonlyArray<World.Question>, transcript = false) =>
  Effect.gen(function*() {
    const start = now()
    let steps = 0
    let solved = 0
    for (const row of rows) {
      const session = yield* SearchSession.make(index)
      const messages: Array<Message> = [
        { role: "system", content: SearchTask.systemPrompt },
        { role: "user", content: row.question }
      ]
      let builder = transcript ? yield* TrajectoryBuilder.start({ tokenizer, template, messages }) : undefined
      for (let turn = 0; turn < 4; turn++) {
        const step = SearchOracle.plan(messages)
        const id = `call_${turn}`
        steps++
        const [name, args] = "answer" in step ? ["answer", { answer: step.answer }] : ["search", { query: step.search }]
        const call: Message = {
          role: "assistant",
          content: "",
          tool_calls: [{ id, type: "function", function: { name, arguments: args } }]
        }
        if (builder !== undefined) builder = yield* TrajectoryBuilder.appendAssistant(builder, call)
        if ("answer" in step) {
          if (Qa.normalizeAnswer(step.answer) === Qa.normalizeAnswer(row.answer)) solved++
          const answered: Message = { role: "tool", tool_call_id: id, name, content: step.answer }
          if (builder !== undefined) builder = yield* TrajectoryBuilder.appendObservations(builder, [answered])
          break
        }
        const observation = yield* session.search(step.search)
        const result: Message = { role: "tool", tool_call_id: id, name, content: observation }
        messages.push(call, result)
        if (builder !== undefined) builder = yield* TrajectoryBuilder.appendObservations(builder, [result])
      }
    }
    const ms = now() - start
    return { stepsPerSecond: steps / (ms / 1000), steps, solved: solved / rows.length }
  })

const figuresAt = (passages: number) =>
  Effect.gen(function*() {
    const t0 = now()
    const world = World.make({ seed: World.defaults.seed, passages })
    const corpus = World.passages(world)
    const t1 = now()
    const index = SearchIndex.make(corpus)
    const t2 = now()
    const { heldOut, probe } = yield* World.questions(world, {
      seed: 7,
      twoHop: 0.3,
      counts: { heldOut: QUESTIONS, probe: 2000 }
    })
    // Latency per search: the oracle's queries, on the index and as the tool's action.
    const queries = probe.flatMap((q) => q.queries)
    for (const q of queries.slice(0, 200)) index.search(q, 2)
    const raw = queries.map((q) => {
      const s = now()
      index.search(q, 2)
      return (now() - s) * 1000
    })
    const action: Array<number> = []
    for (const q of queries) {
      const session = yield* SearchSession.make(index)
      const s = now()
      yield* session.search(q)
      action.push((now() - s) * 1000)
    }
    const rows = heldOut.map((q): Rollout.TaskRow => ({ question: q.question, answer: q.answer }))
    const formats = { byte: byteFormat, messages: messagesFormat } as const
    const steps: Record<string, unknown> = {}
    for (const [name, format] of Object.entries(formats)) {
      // Warm-up: untimed rounds of each side (V8 compiles the hot paths of both). The runtime's first format keeps
      // getting faster for ≈ 15 rounds of 640 questions (721 → ≈ 5,000 steps/s through tsx): two left it mid-way.
      for (let r = 0; r < WARMUP_ROUNDS; r++) {
        yield* runtime(index, rows, format)
        yield* bare(index, heldOut)
      }
      const through: Array<number> = []
      const direct: Array<number> = []
      const transcribed: Array<number> = []
      let solved = { runtime: 0, bare: 0 }
      for (let r = 0; r < ROUNDS; r++) {
        const a = yield* runtime(index, rows, format)
        const b = yield* bare(index, heldOut)
        if (name === "byte") transcribed.push((yield* bare(index, heldOut, true)).stepsPerSecond)
        through.push(a.stepsPerSecond)
        direct.push(b.stepsPerSecond)
        solved = { runtime: a.solved, bare: b.solved }
      }
      steps[name] = {
        ratio: median(through) / median(direct),
        runtimeStepsPerSecond: median(through),
        bareStepsPerSecond: median(direct),
        ...(name === "byte"
          ? { transcript: { stepsPerSecond: median(transcribed), ratioToBare: median(transcribed) / median(direct) } }
          : {}),
        rounds: { runtime: through, bare: direct, ...(name === "byte" ? { transcript: transcribed } : {}) },
        solved
      }
    }
    return {
      passages: corpus.length,
      build: { worldMs: t1 - t0, indexMs: t2 - t1 },
      index: {
        searchP50Us: quantile(raw, 0.5),
        searchP99Us: quantile(raw, 0.99),
        actionP50Us: quantile(action, 0.5),
        actionP99Us: quantile(action, 0.99),
        queries: queries.length
      },
      steps
    }
  })

export default () =>
  Effect.runPromise(Effect.gen(function*() {
    const loadBefore = loadavg()[0]!
    const at: Record<string, Effect.Success<ReturnType<typeof figuresAt>>> = {}
    for (const n of SIZES) at[n] = yield* figuresAt(n)
    const headline = (at[10_000]!.steps["byte"] as { ratio: number }).ratio
    return {
      headline: {
        metric:
          `search env steps/s: ${CHAINS} chains through Rollout.runTaskChat (byte-level format) / bare loop, ` +
            `10k passages`,
        value: headline,
        target: 0.67,
        better: "higher"
      },
      at,
      settings: {
        chains: CHAINS,
        questions: QUESTIONS,
        rounds: ROUNDS,
        warmupRounds: WARMUP_ROUNDS,
        k: SearchSession.defaults.k
      },
      loadAverage: { before: loadBefore, after: loadavg()[0]! }
    } as const
  }))
