import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as ToolCallParser from "../../src/ToolCallParser.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"
import { conversation, fourTurns, tools } from "../utils/conversations.ts"
import { Qwen } from "../utils/qwen.ts"

const IM_END = 151645
const NEWLINE = 198

/** Builds a trajectory from a recorded conversation, treating every assistant message as sampled by the policy. */
const buildFrom = (
  tokenizer: Tokenizer.Tokenizer,
  template: ChatTemplate.ChatTemplate,
  messages: ReadonlyArray<Message.Message>
) =>
  Effect.gen(function*() {
    const first = messages.findIndex((m) => m.role === "assistant")
    let builder = yield* TrajectoryBuilder.start({ tokenizer, template, tools, messages: messages.slice(0, first) })
    let observations: Array<Message.Message> = []
    for (const message of messages.slice(first)) {
      if (message.role !== "assistant") {
        observations.push(message)
        continue
      }
      if (observations.length > 0) builder = yield* TrajectoryBuilder.appendObservations(builder, observations)
      observations = []
      builder = yield* TrajectoryBuilder.appendAssistant(builder, message, { policyVersion: 3 })
    }
    if (observations.length > 0) builder = yield* TrajectoryBuilder.appendObservations(builder, observations)
    return yield* TrajectoryBuilder.finish(builder)
  })

/**
 * The reference, computed without the builder: the template's render of `messages` tokenized as a whole, and a
 * mask that is 1 exactly on the text of each assistant turn at index >= `firstSampled`, from the end of the
 * generation prompt through the end-of-turn token.
 */
const reference = (
  tokenizer: Tokenizer.Tokenizer,
  template: ChatTemplate.ChatTemplate,
  messages: ReadonlyArray<Message.Message>,
  firstSampled: number
) =>
  Effect.gen(function*() {
    const endsWithAssistant = messages.at(-1)?.role === "assistant"
    const full = yield* template.render(messages, { tools, addGenerationPrompt: !endsWithAssistant })
    const ids: Array<number> = []
    const mask: Array<number> = []
    let offset = 0
    const push = (end: number, bit: number) => {
      const piece = tokenizer.encode(full.slice(offset, end))
      ids.push(...piece)
      mask.push(...piece.map(() => bit))
      offset = end
    }
    for (let i = Math.max(firstSampled, 1); i < messages.length; i++) {
      if (messages[i]!.role !== "assistant") continue
      const prompt = yield* template.render(messages.slice(0, i), { tools, addGenerationPrompt: true })
      assert.isTrue(full.startsWith(prompt), `the render of messages[0:${i}] is a prefix of the whole`)
      const end = full.indexOf(template.endOfTurn, prompt.length) + template.endOfTurn.length
      push(prompt.length, 0)
      push(end, 1)
    }
    push(full.length, 0)
    assert.deepStrictEqual(ids, tokenizer.encode(full), "cutting at turn boundaries keeps the tokenization")
    return { ids, mask }
  })

/** Checks every segment against the reference of the messages it covers. */
const checkSegments = (
  tokenizer: Tokenizer.Tokenizer,
  template: ChatTemplate.ChatTemplate,
  messages: ReadonlyArray<Message.Message>,
  builder: TrajectoryBuilder.TrajectoryBuilder
) =>
  Effect.gen(function*() {
    let firstSampled = 0
    for (const segment of builder.segments) {
      const expected = yield* reference(tokenizer, template, messages.slice(0, segment.messageCount), firstSampled)
      assert.deepStrictEqual([...Trajectory.tokenIds(segment)], expected.ids)
      assert.deepStrictEqual([...Trajectory.lossMask(segment)], expected.mask)
      firstSampled = segment.messageCount
    }
    assert.strictEqual(builder.segments.at(-1)!.messageCount, messages.length)
  })

layer(Qwen.layer)("TrajectoryBuilder on the real Qwen tokenizer", (it) => {
  it.effect("Qwen2.5, 4 turns with parallel calls: one segment equal to the whole render; mask = assistant turns", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      const builder = yield* buildFrom(tokenizer, qwen25, fourTurns)
      assert.strictEqual(builder.segments.length, 1)
      assert.deepStrictEqual(builder.rewrites, [])
      const segment = builder.segments[0]!
      const full = yield* qwen25.render(fourTurns, { tools })
      assert.deepStrictEqual([...Trajectory.tokenIds(segment)], tokenizer.encode(full))
      yield* checkSegments(tokenizer, qwen25, fourTurns, builder)
      // Each policy span ends with the sampled <|im_end|>; the "\n" after it is template, mask 0.
      const ids = Trajectory.tokenIds(segment)
      const mask = Trajectory.lossMask(segment)
      const policySpans = segment.spans.filter((s) => s.source === "policy")
      assert.strictEqual(policySpans.length, 5)
      for (const span of policySpans) {
        assert.strictEqual(span.tokenIds.at(-1), IM_END)
        assert.strictEqual(span.policyVersion, 3)
      }
      for (let i = 0; i < ids.length; i++) {
        if (ids[i] === IM_END && mask[i] === 1) {
          assert.strictEqual(ids[i + 1], NEWLINE)
          assert.strictEqual(mask[i + 1], 0)
        }
      }
      // Provenance: tool results are `tool`, the follow-up user turn is `env`, the rest of the prompt `prompt`.
      const sources = Trajectory.sources(segment)
      const decodeSource = (source: Trajectory.Source) =>
        tokenizer.decode([...ids].filter((_, i) => sources[i] === source))
      assert.include(decodeSource("tool"), "\"temp_c\": 21")
      assert.include(decodeSource("tool"), "46")
      assert.include(decodeSource("env"), "Thanks! And 46 * 2?")
      assert.include(decodeSource("prompt"), "# Tools")
      assert.notInclude(decodeSource("template"), "Paris")
      assert.strictEqual(builder.messages.length, fourTurns.length)
    }))

  it.effect("the built-in qwen2.5 template builds the same ids as the official one", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      const official = yield* buildFrom(tokenizer, qwen25, fourTurns)
      const ours = yield* buildFrom(tokenizer, ChatTemplate.builtinTemplate("qwen2.5"), fourTurns)
      assert.deepStrictEqual(ours.segments, official.segments)
    }))

  it.effect("Qwen3, 4 turns: each segment equals the render of the messages it covers; rewrites are reported", () =>
    Effect.gen(function*() {
      const { qwen3, tokenizer } = yield* Qwen
      const builder = yield* buildFrom(tokenizer, qwen3, fourTurns)
      yield* checkSegments(tokenizer, qwen3, fourTurns, builder)
      // No reasoning: each turn was sampled with an empty think block that the next render removes.
      assert.strictEqual(builder.segments.length, 5)
      assert.strictEqual(builder.rewrites.length, 4)
      assert.include(builder.rewrites[0]!.expected, "<think>")
      assert.deepStrictEqual(builder.rewrites.map((r) => r.newSegment), [1, 2, 3, 4])
      const last = builder.segments.at(-1)!
      const tool = tokenizer.decode(last.spans.filter((s) => s.source === "tool").flatMap((s) => s.tokenIds))
      assert.include(tool, "\"city\": \"Oslo\"", "a new segment still labels its observations")
      assert.notInclude(tool, "Paris", "the re-rendered history of a new segment is prompt")
      const policy = builder.segments.reduce((n, s) => n + s.spans.filter((x) => x.source === "policy").length, 0)
      assert.strictEqual(policy, 5, "every assistant turn is trained exactly once")
    }))

  it.effect("Qwen3 with reasoning: think blocks survive until the next user query, then a new segment starts", () =>
    Effect.gen(function*() {
      const { qwen3, tokenizer } = yield* Qwen
      const withReasoning = fourTurns.map((m, i): Message.Message =>
        m.role === "assistant" ? { ...m, reasoning_content: `step ${i}: think it through` } : m
      )
      const builder = yield* buildFrom(tokenizer, qwen3, withReasoning)
      yield* checkSegments(tokenizer, qwen3, withReasoning, builder)
      assert.strictEqual(builder.segments.length, 2)
      assert.strictEqual(builder.rewrites[0]!.atMessage, 8)
      assert.include(builder.rewrites[0]!.expected, "think it through")
      assert.notInclude(tokenizer.decode(Trajectory.tokenIds(builder.segments[1]!).slice(0, 200)), "step 2")
    }))

  it.effect("property: random conversations (Qwen2.5: one exact segment; Qwen3: exact per segment)", () =>
    Effect.gen(function*() {
      const { qwen25, qwen3, tokenizer } = yield* Qwen
      for (const messages of fc.sample(conversation(false), { numRuns: 50, seed: 1 })) {
        const builder = yield* buildFrom(tokenizer, qwen25, messages)
        assert.strictEqual(builder.segments.length, 1)
        yield* checkSegments(tokenizer, qwen25, messages, builder)
      }
      for (const messages of fc.sample(conversation(true), { numRuns: 50, seed: 2 })) {
        const builder = yield* buildFrom(tokenizer, qwen3, messages)
        assert.strictEqual(builder.rewrites.length, builder.segments.length - 1)
        yield* checkSegments(tokenizer, qwen3, messages, builder)
      }
    }), 300_000)

  it.effect("rendering each turn's tail builds what rendering the whole conversation every turn builds", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      assert.isDefined(qwen25.renderTail)
      const whole: ChatTemplate.ChatTemplate = { ...qwen25, renderTail: undefined }
      for (const messages of fc.sample(conversation(false), { numRuns: 50, seed: 3 })) {
        const tails = yield* buildFrom(tokenizer, qwen25, messages)
        const renders = yield* buildFrom(tokenizer, whole, messages)
        assert.deepStrictEqual(tails.segments, renders.segments)
        assert.deepStrictEqual(tails.messages, renders.messages)
        assert.strictEqual(tails.rendered, renders.rendered)
      }
      // chatml over the byte-level vocabulary (the embedded policy's), whose tokenizer encodes natively.
      const bytes = yield* Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
      const chatml = ChatTemplate.builtinTemplate("chatml")
      for (const messages of fc.sample(conversation(false), { numRuns: 50, seed: 4 })) {
        const tails = yield* buildFrom(bytes, chatml, messages)
        const renders = yield* buildFrom(bytes, { ...chatml, renderTail: undefined }, messages)
        assert.deepStrictEqual(tails.segments, renders.segments)
        assert.strictEqual(tails.rendered, renders.rendered)
      }
      // Samples with stray specials, cut without an end of turn, or not valid UTF-8: both ways build the same.
      const samples = [tokenizer.encode("a<|im_end|>b"), tokenizer.encode("x<|im_start|>user\ny<|im_end|>"), [226, 130]]
      for (const tokenIds of samples) {
        const [a, b] = yield* Effect.forEach([qwen25, whole], (template) =>
          Effect.gen(function*() {
            const messages: ReadonlyArray<Message.Message> = [{ role: "user", content: "hi" }]
            let builder = yield* TrajectoryBuilder.start({ tokenizer, template, messages })
            builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds })
            builder = yield* TrajectoryBuilder.appendObservations(builder, [{ role: "user", content: "again" }])
            return yield* TrajectoryBuilder.finish(builder)
          }))
        assert.deepStrictEqual(a!.segments, b!.segments)
        assert.deepStrictEqual(a!.rewrites, b!.rewrites)
      }
    }), 300_000)

  it.effect("token-in/token-out: sampled ids are kept verbatim even when they are not the canonical tokenization", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      const prompt: ReadonlyArray<Message.Message> = [{ role: "user", content: "Weather in Paris?" }]
      let builder = yield* TrajectoryBuilder.start({ tokenizer, template: qwen25, tools, messages: prompt })
      const promptIds = TrajectoryBuilder.promptTokenIds(builder)
      // The model writes compact JSON, character by character for the call body: not how encode() would split it.
      const call = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
      const sampled = tokenizer.splitAdded(call).flatMap((piece) =>
        tokenizer.addedTokens.has(piece) ? tokenizer.encode(piece) : [...piece].flatMap((ch) => tokenizer.encode(ch))
      ).concat([IM_END])
      assert.notDeepEqual(sampled, tokenizer.encode(call + "<|im_end|>"))
      const logprobs = sampled.map((_, i) => -0.01 * (i + 1))
      const parsed = ToolCallParser.hermes(tokenizer.decode(sampled.slice(0, -1)))
      builder = yield* TrajectoryBuilder.appendSampled(builder, {
        tokenIds: sampled,
        logprobs,
        policyVersion: 7,
        message: ToolCallParser.toAssistantMessage(parsed)
      })
      builder = yield* TrajectoryBuilder.appendObservations(builder, [
        { role: "tool", tool_call_id: "call_0", content: "sunny" }
      ])
      assert.deepStrictEqual(builder.rewrites, [], "the raw sampled text renders back unchanged")
      const segment = builder.segments[0]!
      const ids = [...Trajectory.tokenIds(segment)]
      assert.deepStrictEqual(ids.slice(0, promptIds.length), promptIds)
      assert.deepStrictEqual(ids.slice(promptIds.length, promptIds.length + sampled.length), sampled)
      const lp = Trajectory.logprobs(segment)
      assert.closeTo(lp[promptIds.length]!, -0.01, 1e-6)
      assert.isTrue(Number.isNaN(lp[0]!))
      assert.strictEqual(Trajectory.lossMask(segment).reduce((a, b) => a + b, 0), sampled.length)
      const tail = tokenizer.decode(ids.slice(promptIds.length + sampled.length))
      const observation = "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" +
        "<|im_start|>assistant\n"
      assert.strictEqual(tail, observation)
      const message = builder.messages[1]!
      const args = message.role === "assistant" && message.tool_calls?.[0]?.function.arguments
      assert.deepStrictEqual(args, { city: "Paris" })
    }))

  it.effect("a sample cut by maxTokens: the template's <|im_end|> arrives as a template token", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      const prompt: ReadonlyArray<Message.Message> = [{ role: "user", content: "Count" }]
      let builder = yield* TrajectoryBuilder.start({ tokenizer, template: qwen25, messages: prompt })
      const cut = tokenizer.encode("1, 2, 3, 4")
      builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: cut })
      builder = yield* TrajectoryBuilder.appendObservations(builder, [{ role: "user", content: "go on" }])
      const segment = builder.segments[0]!
      const ids = [...Trajectory.tokenIds(segment)]
      const mask = [...Trajectory.lossMask(segment)]
      const at = ids.indexOf(IM_END, ids.length - 20)
      assert.strictEqual(mask[at], 0)
      assert.strictEqual(mask[at - 1], 1)
      const messages: ReadonlyArray<Message.Message> = [{ role: "user", content: "Count" }, {
        role: "assistant",
        content: "1, 2, 3, 4"
      }, { role: "user", content: "go on" }]
      assert.deepStrictEqual(ids, tokenizer.encode(yield* qwen25.render(messages, { addGenerationPrompt: true })))
    }))

  it.effect("observations right after observations replace the generation prompt instead of forking", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      const first: ReadonlyArray<Message.Message> = [{ role: "user", content: "hi" }]
      let builder = yield* TrajectoryBuilder.start({ tokenizer, template: qwen25, tools, messages: first })
      builder = yield* TrajectoryBuilder.appendObservations(builder, [{ role: "user", content: "are you there?" }])
      assert.strictEqual(builder.segments.length, 1)
      const all: ReadonlyArray<Message.Message> = [...first, { role: "user", content: "are you there?" }]
      const expected = tokenizer.encode(yield* qwen25.render(all, { tools, addGenerationPrompt: true }))
      assert.deepStrictEqual(TrajectoryBuilder.promptTokenIds(builder), expected)
      assert.strictEqual(TrajectoryBuilder.tokenCount(builder), expected.length)
    }))

  it.effect("garbage samples (random ids, stray specials, split UTF-8) never crash and are kept verbatim", () =>
    Effect.gen(function*() {
      const { qwen25, qwen3, tokenizer } = yield* Qwen
      const id = fc.oneof(
        fc.integer({ min: 0, max: tokenizer.vocabSize - 1 }),
        fc.constantFrom(IM_END, 151644, 151643, 151657, 151658, 151667, 151668, 198)
      )
      const samples = fc.sample(fc.array(fc.array(id, { maxLength: 40 }), { minLength: 1, maxLength: 3 }), {
        numRuns: 40,
        seed: 9
      })
      for (const template of [qwen25, qwen3]) {
        for (const turns of samples) {
          let builder = yield* TrajectoryBuilder.start({ tokenizer, template, tools, messages: fourTurns.slice(0, 2) })
          for (const ids of turns) {
            builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: ids })
            const parsed = ToolCallParser.hermes(tokenizer.decode(ids))
            const observations: Array<Message.Message> = parsed.errors.length > 0
              ? [{ role: "user", content: parsed.errors.map((e) => e.message).join("\n") }]
              : [{ role: "tool", tool_call_id: "x", content: "ok" }]
            builder = yield* TrajectoryBuilder.appendObservations(builder, observations)
          }
          const policy = builder.segments.flatMap((s) => s.spans.filter((span) => span.source === "policy"))
          assert.deepStrictEqual(policy.map((s) => s.tokenIds), turns.filter((ids) => ids.length > 0))
          assert.strictEqual(builder.rewrites.length, builder.segments.length - 1)
        }
      }
    }), 300_000)

  it.effect("bad input gives typed errors: ids, logprobs, order, template", () =>
    Effect.gen(function*() {
      const { qwen25, tokenizer } = yield* Qwen
      const prompt: ReadonlyArray<Message.Message> = [{ role: "user", content: "x" }]
      const builder = yield* TrajectoryBuilder.start({ tokenizer, template: qwen25, messages: prompt })
      const badIds = yield* Effect.flip(TrajectoryBuilder.appendSampled(builder, { tokenIds: [1, 999_999] }))
      assert.strictEqual(badIds.reason._tag, "InvalidTokenIds")
      const badLp = yield* Effect.flip(TrajectoryBuilder.appendSampled(builder, { tokenIds: [1, 2], logprobs: [0] }))
      assert.strictEqual(badLp.reason._tag, "LogprobsMismatch")
      const counts = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: [1, 2], logprobs: [0] }).pipe(
        Effect.as(undefined),
        Effect.catchReason("TrajectoryBuilderError", "LogprobsMismatch", ({ logprobs, tokenIds }) =>
          Effect.succeed({ logprobs, tokenIds }))
      )
      assert.deepStrictEqual(counts, { logprobs: 1, tokenIds: 2 })
      const sampled = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: [16, IM_END] })
      const twice = yield* Effect.flip(TrajectoryBuilder.appendSampled(sampled, { tokenIds: [16] }))
      assert.strictEqual(twice.reason._tag, "OutOfOrder")
      const asObservation = yield* Effect.flip(
        TrajectoryBuilder.appendObservations(sampled, [{ role: "assistant", content: "x" }])
      )
      assert.strictEqual(asObservation.reason._tag, "OutOfOrder")
      const raising = yield* ChatTemplate.make({
        source: "{% if messages | length > 1 %}{{ raise_exception('one turn only') }}{% endif %}x"
      })
      const a: ReadonlyArray<Message.Message> = [{ role: "user", content: "a" }]
      const one = yield* TrajectoryBuilder.start({ tokenizer, template: raising, messages: a })
      const failed = yield* Effect.flip(TrajectoryBuilder.appendObservations(one, [{ role: "user", content: "b" }]))
      assert.strictEqual(failed.reason._tag, "TemplateFailed")
      assert.include(failed.message, "one turn only")
      assert.strictEqual((failed.reason.cause as ChatTemplate.TemplateError).reason._tag, "RenderFailed")
    }))
})

describe("TrajectoryBuilder with the byte-level tokenizer and the chatml template", () => {
  it.effect("builds exact segments for the embedded policy's vocabulary", () =>
    Effect.gen(function*() {
      const tokenizer = yield* Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
      const template = ChatTemplate.builtinTemplate("chatml")
      const builder = yield* buildFrom(tokenizer, template, fourTurns)
      assert.strictEqual(builder.segments.length, 1)
      yield* checkSegments(tokenizer, template, fourTurns, builder)
      assert.isTrue(Trajectory.tokenIds(builder.segments[0]!).every((id) => id < 265))
    }))

  it.effect("appendAssistant reuses the prompt that start and appendObservations rendered: the same ids", () =>
    Effect.gen(function*() {
      const tokenizer = yield* Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig(""))
      for (const name of ["chatml", "qwen2.5", "qwen3", "llama3"] as const) {
        const template = ChatTemplate.builtinTemplate(name)
        const first = fourTurns.findIndex((m) => m.role === "assistant")
        let cached = yield* TrajectoryBuilder.start({ tokenizer, template, tools, messages: fourTurns.slice(0, first) })
        let rendered = cached
        assert.strictEqual(cached.promptOf, cached.renderMessages)
        let observations: Array<Message.Message> = []
        for (const message of fourTurns.slice(first)) {
          if (message.role !== "assistant") {
            observations.push(message)
            continue
          }
          if (observations.length > 0) {
            cached = yield* TrajectoryBuilder.appendObservations(cached, observations)
            rendered = yield* TrajectoryBuilder.appendObservations(rendered, observations)
          }
          observations = []
          assert.strictEqual(cached.promptOf, cached.renderMessages)
          cached = yield* TrajectoryBuilder.appendAssistant(cached, message)
          // Without the cache: the prompt is rendered again.
          rendered = yield* TrajectoryBuilder.appendAssistant({ ...rendered, promptOf: undefined }, message)
          assert.deepStrictEqual(cached.segments, rendered.segments, name)
        }
      }
    }))

  it.effect("llama3 template: exact on the conversation, end of turn <|eot_id|> trainable", () =>
    Effect.gen(function*() {
      const specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
        .concat(["<|eot_id|>", "<|eom_id|>", "<|python_tag|>"])
      const tokenizer = yield* Tokenizer.make(
        ByteTokenizer.tokenizerJson({ specialTokens: specials, eosToken: "<|eot_id|>" }),
        ByteTokenizer.tokenizerConfig("", { eosToken: "<|eot_id|>", padToken: "<|end_of_text|>" })
      )
      const template = ChatTemplate.builtinTemplate("llama3")
      const builder = yield* buildFrom(tokenizer, template, fourTurns)
      assert.strictEqual(builder.segments.length, 1)
      yield* checkSegments(tokenizer, template, fourTurns, builder)
      const eot = tokenizer.tokenToId("<|eot_id|>")!
      for (const span of builder.segments[0]!.spans.filter((s) => s.source === "policy")) {
        assert.strictEqual(span.tokenIds.at(-1), eot)
      }
    }))
})
