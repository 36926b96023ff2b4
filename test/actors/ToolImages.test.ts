/**
 * A tool may return an image: its `render` gives content parts (text and `image_url` with a `data:` URL), which
 * become the tool message's content (the text parts cut to the output budget, the image kept); the trajectory
 * builder then records the image as a tool image span for a vision model.
 */
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect, Schema } from "effect"
import * as ToolActor from "../../actors/ToolActor.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import { Tool } from "../../src/index.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"

/** A screen of `width × height` as a PNG data: URL. */
const screen = (width: number, height: number): string => {
  const canvas = createCanvas(width, height)
  canvas.getContext("2d").fillRect(0, 0, width, height)
  return `data:image/png;base64,${canvas.toBuffer("image/png").toString("base64")}`
}

const Screenshot = Tool.make("screenshot", {
  description: "Take a screenshot",
  parameters: Schema.Struct({ note: Schema.String }),
  success: Schema.Struct({ note: Schema.String, width: Schema.Int, height: Schema.Int }),
  render: ({ height, note, width }) => [
    { type: "text", text: note },
    { type: "image_url", image_url: { url: screen(width, height) } }
  ],
  handler: ({ note }) => Effect.succeed({ note, width: 16, height: 8 })
})

const call = (note: string) => ({
  id: "c0",
  type: "function" as const,
  function: { name: "screenshot", arguments: { note } }
})

describe("tools that return images", () => {
  it.effect("the tool message holds the parts; a long text part is cut to the budget, the image kept", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Screenshot], { maxOutput: { chars: 40 } })
      const turn = yield* actor.executeTurn([call("x".repeat(100))])
      const content = turn.messages[0]!.content as ReadonlyArray<{ type: string; text?: string }>
      assert.deepStrictEqual(content.map((p) => p.type), ["text", "image_url"])
      assert.isAtMost(content[0]!.text!.length, 40)
      assert.isTrue(turn.results[0]!.truncated)
      assert.deepStrictEqual(turn.results[0]!.value, { note: "x".repeat(100), width: 16, height: 8 })
    }))

  it.effect("a vision model's trajectory records the screenshot as a tool image span", () =>
    Effect.gen(function*() {
      const actor = yield* ToolActor.make([Screenshot])
      const turn = yield* actor.executeTurn([call("here")])
      const tokenizer = yield* Tokenizer.make(
        ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
        ByteTokenizer.tokenizerConfig("")
      )
      const template = ChatTemplate.withVision(ChatTemplate.builtinTemplate("chatml"), {
        ...ChatTemplate.qwenVisionTokens,
        geometry: { patchSize: 4, mergeSize: 2, minPixels: 64, maxPixels: 32 * 32 }
      })
      let builder = yield* TrajectoryBuilder.start({ tokenizer, template, messages: [{ role: "user", content: "go" }] })
      builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: tokenizer.encode("ok<|im_end|>") })
      builder = yield* TrajectoryBuilder.appendObservations(builder, turn.messages)
      const spans = builder.segments[0]!.spans.filter((s) => s.image !== undefined)
      assert.deepStrictEqual(spans.map((s) => [s.source, s.tokenIds.length, s.image!.width]), [["tool", 2, 16]])
    }).pipe(Effect.orDie))
})
