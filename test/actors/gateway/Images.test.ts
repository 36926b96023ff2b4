/**
 * Images through the gateway with the SDKs agents use: chat completions' `image_url` parts (`openai`), the Responses
 * API's `input_image` (`openai`) and the Messages API's base64 `image` blocks (`@anthropic-ai/sdk`) reach a vision
 * model's template as its image tokens and are recorded as image spans (mask 0, the bytes' SHA-256) — the same
 * record whichever format sent them; a text-only model answers 400 naming why, and so does a remote URL.
 */
import Anthropic from "@anthropic-ai/sdk"
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect } from "effect"
import OpenAI from "openai"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as Gateway from "../../../actors/Gateway.ts"
import * as Recorder from "../../../actors/gateway/Recorder.ts"
import * as ByteTokenizer from "../../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../../src/ChatTemplate.ts"
import * as Image from "../../../src/Image.ts"
import * as Sampler from "../../../src/Sampler.ts"
import * as Tokenizer from "../../../src/Tokenizer.ts"
import { format as textFormat, record } from "./fixtures.ts"

const tokenizer = Effect.runSync(
  Tokenizer.make(
    ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
    ByteTokenizer.tokenizerConfig("")
  )
)
const template = ChatTemplate.withVision(ChatTemplate.builtinTemplate("qwen2.5"), {
  ...ChatTemplate.qwenVisionTokens,
  geometry: { patchSize: 4, mergeSize: 2, minPixels: 64, maxPixels: 32 * 32 }
})
const visionFormat = ChainFormat.fromTemplate({ tokenizer, template })
const imEnd = tokenizer.tokenToId("<|im_end|>")!
const PAD = tokenizer.tokenToId("<|image_pad|>")!

/** A policy that says how many image tokens its prompt holds (what a vision model would see). */
const countingSampler = Sampler.makeScripted(
  (request) => [...tokenizer.encode(`pads: ${request.promptTokenIds.filter((id) => id === PAD).length}`), imEnd],
  { policyVersion: 1 }
)

const canvas = createCanvas(16, 8)
canvas.getContext("2d").fillRect(0, 0, 16, 8)
const png = canvas.toBuffer("image/png")
const base64 = png.toString("base64")
const dataUrl = `data:image/png;base64,${base64}`
const sampling = { temperature: 1, maxTokens: 64 }

const setup = (format: typeof visionFormat) =>
  Effect.gen(function*() {
    const gateway = yield* Gateway.make({})
    const sampler = yield* countingSampler
    return (id: string) => gateway.open({ id, groupId: "g", format, sampler, sampling, requestSampling: "cap" })
  })

const client = (baseURL: string) => new OpenAI({ baseURL, apiKey: "x", maxRetries: 0 })

describe("Gateway: images", () => {
  it.live("chat image_url, Responses input_image, Messages image blocks: one record, image spans with the hash", () =>
    Effect.gen(function*() {
      const open = yield* setup(visionFormat)
      const chat = yield* open("chat")
      const chatReply = yield* Effect.promise(() =>
        client(chat.baseURL).chat.completions.create({
          model: "any",
          messages: [{
            role: "user",
            content: [{ type: "text", text: "How many?" }, { type: "image_url", image_url: { url: dataUrl } }]
          }]
        })
      )
      // 16 × 8 at factor 8: 2 × 1 merged patches.
      assert.strictEqual(chatReply.choices[0]!.message.content, "pads: 2")
      const t = yield* Recorder.trajectory(chat.recorder, { _tag: "Returned" })
      const images = t.segments[0]!.spans.filter((s) => s.image !== undefined)
      assert.deepStrictEqual(images.map((s) => [s.source, s.tokenIds, s.image!.sha256]), [
        ["prompt", [PAD, PAD], Image.sha256(png)]
      ])
      const want = record(t)
      assert.isTrue(want[0]!.ids.every((id, i) => id !== PAD || want[0]!.mask[i] === 0))

      const responses = yield* open("responses")
      const response = yield* Effect.promise(() =>
        client(responses.baseURL).responses.create({
          model: "any",
          input: [{
            role: "user",
            content: [{ type: "input_text", text: "How many?" }, {
              type: "input_image",
              image_url: dataUrl,
              detail: "auto"
            }]
          }]
        })
      )
      assert.strictEqual(response.output_text, "pads: 2")
      assert.deepStrictEqual(record(yield* Recorder.trajectory(responses.recorder, { _tag: "Returned" })), want)

      const messages = yield* open("messages")
      const anthropic = new Anthropic({ baseURL: messages.baseURL.replace(/\/v1$/, ""), apiKey: "x", maxRetries: 0 })
      const reply = yield* Effect.promise(() =>
        anthropic.messages.create({
          model: "any",
          max_tokens: 64,
          messages: [{
            role: "user",
            content: [{ type: "text", text: "How many?" }, {
              type: "image",
              source: { type: "base64", media_type: "image/png", data: base64 }
            }]
          }]
        })
      )
      assert.deepStrictEqual(reply.content.map((b) => (b.type === "text" ? b.text : "")), ["pads: 2"])
      assert.deepStrictEqual(record(yield* Recorder.trajectory(messages.recorder, { _tag: "Returned" })), want)
    }))

  it.live("a text-only model answers 400 naming why; a remote URL is a 400 naming the URL", () =>
    Effect.gen(function*() {
      const text = yield* (yield* setup(textFormat))("text")
      const refused = yield* Effect.promise(() =>
        client(text.baseURL).chat.completions.create({
          model: "any",
          messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: dataUrl } }] }]
        }).then(() => undefined, (e: unknown) => e)
      )
      assert.instanceOf(refused, OpenAI.BadRequestError)
      assert.include((refused as InstanceType<typeof OpenAI.BadRequestError>).message, "has no vision tower")

      const vision = yield* (yield* setup(visionFormat))("remote")
      const remote = yield* Effect.promise(() =>
        client(vision.baseURL).chat.completions.create({
          model: "any",
          messages: [{
            role: "user",
            content: [{ type: "image_url", image_url: { url: "https://example.com/a.png" } }]
          }]
        }).then(() => undefined, (e: unknown) => e)
      )
      assert.instanceOf(remote, OpenAI.BadRequestError)
      assert.include((remote as Error).message, "remote image URL https://example.com/a.png refused")

      const corrupt = yield* Effect.promise(() =>
        client(vision.baseURL).chat.completions.create({
          model: "any",
          messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: dataUrl.slice(0, 80) } }] }]
        }).then(() => undefined, (e: unknown) => e)
      )
      assert.instanceOf(corrupt, OpenAI.BadRequestError)
      assert.include((corrupt as Error).message, "does not decode")
    }))
})
