/**
 * The template side and the tower agree: a chat message with an image, rendered by the byte-level vision template at
 * `tiny-vl`'s geometry (its `preprocessor_config.json`, read by `VisionConfig`), gives as many `<|image_pad|>` ids as
 * the tower makes tokens of the decoded image, and a `tiny-vl` engine answers it.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect } from "effect"
import { make } from "../../actors/PolicyEngine.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import type * as Message from "../../src/Message.ts"
import * as MessageImages from "../../src/MessageImages.ts"
import * as VisionTower from "../../src/model/VisionTower.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as VisionConfig from "../../src/VisionConfig.ts"

const png = (width: number, height: number, color: string): string => {
  const canvas = createCanvas(width, height)
  const context = canvas.getContext("2d")
  context.fillStyle = color
  context.fillRect(0, 0, width, height)
  return `data:image/png;base64,${canvas.toBuffer("image/png").toString("base64")}`
}

describe("a tiny-vl policy behind the vision template", () => {
  it.effect("the rendered prompt's pads are the tower's tokens, and the engine answers it", () =>
    Effect.gen(function*() {
      const vl = VisionTower.presets["tiny-vl"]
      const tokenizer = yield* Tokenizer.make(
        ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
        ByteTokenizer.tokenizerConfig("")
      )
      const vision = VisionConfig.fromPreprocessorConfig(VisionTower.preprocessorConfig(vl.vision))!
      const template = VisionConfig.applyTo(ChatTemplate.builtinTemplate("chatml"), vision)
      const messages: ReadonlyArray<Message.Message> = [{
        role: "user",
        content: [{ type: "text", text: "Colour?" }, { type: "image_url", image_url: { url: png(100, 60, "#3060c0") } }]
      }]
      const decoded = yield* MessageImages.decodeAll(messages, template)
      const text = yield* template.render(decoded.messages, { addGenerationPrompt: true })
      const prompt = tokenizer.encode(text)
      const pad = tokenizer.tokenToId("<|image_pad|>")!
      const pixels = decoded.images.map((image) => VisionTower.toPixels(vl.vision, image, vision.normalisation))
      const tokens = VisionTower.patchify(vl.vision, pixels).tokens
      assert.strictEqual(prompt.filter((id) => id === pad).length, tokens[0])
      assert.isAbove(tokens[0]!, 1)
      const engine = yield* make({
        config: vl.text,
        weights: VisionTower.initWeights(vl, 1),
        vision: { config: vl, imageTokenId: pad }
      })
      const answer = yield* engine.generate(
        { promptTokenIds: prompt, sampling: { temperature: 0, maxTokens: 4 } },
        { images: pixels }
      )
      assert.strictEqual(answer.tokenIds.length, 4)
    }).pipe(Effect.provide(NodeServices.layer)))
})
