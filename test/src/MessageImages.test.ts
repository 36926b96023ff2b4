import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect, Result } from "effect"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Image from "../../src/Image.ts"
import type * as Message from "../../src/Message.ts"
import * as MessageImages from "../../src/MessageImages.ts"

const template = {
  name: "qwen2.5-vl",
  vision: { ...ChatTemplate.qwenVisionTokens, geometry: { patchSize: 8, mergeSize: 2, maxPixels: 64 * 64 } }
}

const png = (width: number, colour: string): Uint8Array => {
  const canvas = createCanvas(width, 16)
  const context = canvas.getContext("2d")
  context.fillStyle = colour
  context.fillRect(0, 0, width, 16)
  return new Uint8Array(canvas.toBuffer("image/png"))
}

const conversation = (url: string, text = "what is this?"): Message.Conversation => [
  { role: "system", content: "Look." },
  { role: "user", content: [{ type: "text", text }, { type: "image_url", image_url: { url } }] },
  { role: "tool", tool_call_id: "c1", content: "done" }
]

/** The same bytes in a URL no encoder wrote here (base64 wrapped on two lines: `parseDataUrl` drops the break). */
const unknownUrl = (bytes: Uint8Array): string => {
  const data = Buffer.from(bytes).toString("base64")
  return `data:image/png;base64,${data.slice(0, 20)}\n${data.slice(20)}`
}

describe("MessageImages.resolve", () => {
  it.effect("an encoded screen's URL resolves from memory to what reading its bytes gives", () =>
    Effect.gen(function*() {
      const bytes = png(24, "#00aa00")
      const url = yield* Effect.fromResult(Image.encodedDataUrl(bytes, { width: 24, height: 16 }))
      const known = yield* MessageImages.resolve(conversation(url), template)
      const read = yield* MessageImages.resolve(conversation(unknownUrl(png(24, "#00aa00"))), template)
      const partsOf = (messages: ReadonlyArray<Message.Message>) => messages[1]!.content as Array<Message.ContentPart>
      const ref = Image.knownUrl(url)
      assert.isDefined(ref)
      assert.deepStrictEqual(partsOf(known)[1], { type: "image_url", image_url: { url }, image: ref! })
      assert.deepStrictEqual(
        partsOf(known).map((p) => (p.type === "image_url" ? p.image : p)),
        partsOf(read).map((p) => (p.type === "image_url" ? p.image : p))
      )
      assert.deepStrictEqual([known[0], known[2]], [read[0], read[2]])
    }))

  it.effect("a known URL is still refused where the template has no vision or the text holds an image token", () =>
    Effect.gen(function*() {
      const bytes = png(32, "#aa0000")
      const url = Result.getOrThrow(Image.encodedDataUrl(bytes, { width: 32, height: 16 }))
      const blind = yield* Effect.flip(MessageImages.resolve(conversation(url), { name: "qwen2.5", vision: undefined }))
      assert.strictEqual(blind.reason._tag, "ModelWithoutVision")
      const reserved = yield* Effect.flip(MessageImages.resolve(conversation(url, "<|image_pad|> here"), template))
      assert.strictEqual(reserved.reason._tag, "ReservedToken")
    }))
})
