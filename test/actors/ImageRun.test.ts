/**
 * Images round-trip through a run's files: a trajectory with an image (built by the trajectory builder with a
 * vision template) survives JSON (the journal's and rollout queue's encoding), the samples writer puts its bytes in
 * `images/<sha256>.png` beside samples.jsonl, a resumed run keeps them, the report shows the image beside its
 * tokens, and `externalise`/`internalise` give the trajectory its `data:` URLs back.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect, Schema } from "effect"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Metrics from "../../actors/Metrics.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Image from "../../src/Image.ts"
import type * as Message from "../../src/Message.ts"
import * as LiveReport from "../../src/LiveReport.ts"
import * as MessageImages from "../../src/MessageImages.ts"
import * as Report from "../../src/Report.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"

const pngBytes = (color: string): Buffer => {
  const canvas = createCanvas(24, 16)
  const context = canvas.getContext("2d")
  context.fillStyle = color
  context.fillRect(0, 0, 24, 16)
  return canvas.toBuffer("image/png")
}

const dataUrl = (bytes: Buffer) => `data:image/png;base64,${bytes.toString("base64")}`

/** A finished trajectory whose prompt and tool result each hold an image. */
const imageTrajectory = (prompt: Buffer, screen: Buffer) =>
  Effect.gen(function*() {
    const tokenizer = yield* Tokenizer.make(
      ByteTokenizer.tokenizerJson({ specialTokens: ByteTokenizer.visionSpecialTokens }),
      ByteTokenizer.tokenizerConfig("")
    )
    const template = ChatTemplate.withVision(ChatTemplate.builtinTemplate("chatml"), {
      ...ChatTemplate.qwenVisionTokens,
      geometry: { patchSize: 4, mergeSize: 2, minPixels: 64, maxPixels: 32 * 32 }
    })
    const user: Message.Message = {
      role: "user",
      content: [{ type: "text", text: "count" }, { type: "image_url", image_url: { url: dataUrl(prompt) } }]
    }
    let builder = yield* TrajectoryBuilder.start({ tokenizer, template, messages: [user] })
    builder = yield* TrajectoryBuilder.appendSampled(builder, { tokenIds: tokenizer.encode("look<|im_end|>") })
    const tool: Message.Message = {
      role: "tool",
      tool_call_id: "c0",
      content: [{ type: "image_url", image_url: { url: dataUrl(screen) } }]
    }
    builder = yield* TrajectoryBuilder.appendObservations(builder, [tool])
    builder = yield* TrajectoryBuilder.finish(builder)
    const trajectory: Trajectory.Trajectory = {
      trajectoryId: "t0",
      groupId: "g0",
      chainId: "c0",
      messages: builder.messages,
      segments: builder.segments,
      termination: "no_tool_call",
      reward: 1,
      rewardStatus: "scored",
      metrics: {},
      trainable: true,
      masked: false
    }
    return { trajectory, tokenizer }
  })

const sha = (bytes: Buffer) => Image.sha256(bytes)

describe("images through a run's files", () => {
  it.effect("a trajectory with images survives JSON exactly, image spans and hashes included", () =>
    Effect.gen(function*() {
      const { trajectory } = yield* imageTrajectory(pngBytes("#ff0000"), pngBytes("#0000ff"))
      const codec = Schema.fromJsonString(Trajectory.Trajectory)
      const back = yield* Schema.decodeUnknownEffect(codec)(yield* Schema.encodeEffect(codec)(trajectory))
      assert.deepStrictEqual(back, trajectory)
      const images = back.segments[0]!.spans.filter((s) => s.image !== undefined)
      assert.deepStrictEqual(images.map((s) => [s.source, s.image!.sha256]), [
        ["prompt", sha(pngBytes("#ff0000"))],
        ["tool", sha(pngBytes("#0000ff"))]
      ])
      // A hash names a file: a trajectory (from a rollout worker, say) whose hash is not 64 hex digits is refused.
      const forged = JSON.stringify(trajectory).replace(sha(pngBytes("#ff0000")), "../../escape")
      const refused = yield* Effect.exit(Schema.decodeUnknownEffect(codec)(forged))
      assert.isTrue(refused._tag === "Failure")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("samples.jsonl records image spans, their bytes go to images/<sha256>.png, a resume keeps them", () =>
    Effect.gen(function*() {
      const red = pngBytes("#ff0000")
      const blue = pngBytes("#0000ff")
      const { trajectory, tokenizer } = yield* imageTrajectory(red, blue)
      const dir = mkdtempSync(join(tmpdir(), "images-run-"))
      const tokenText = (id: number) => tokenizer.decode([id])
      yield* Effect.scoped(Effect.gen(function*() {
        const m = yield* Metrics.open(dir)
        yield* m.log({ phase: "train", step: 1, elapsed: 1, figures: {} })
        yield* m.sample(Metrics.sampleOf(trajectory, "train", 1, tokenText), trajectory)
      }))
      for (const bytes of [red, blue]) {
        assert.deepStrictEqual(readFileSync(join(dir, "images", `${sha(bytes)}.png`)), bytes)
      }
      const line = readFileSync(join(dir, "samples.jsonl"), "utf8")
      assert.notInclude(line, "base64", "the samples file holds hashes, not pixels")
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Metrics.open(dir, { resumeFrom: 1 })
      }))
      const read = yield* Report.read(dir)
      const spans = read.samples[0]!.spans.filter((s) => s.image !== undefined)
      assert.deepStrictEqual(spans.map((s) => s.image!.sha256), [sha(red), sha(blue)])
      assert.strictEqual(read.images.get(sha(red)), dataUrl(red))
      // The report shows each image beside its tokens, with its label.
      const html = readFileSync(yield* Report.write(dir), "utf8")
      assert.include(html, `<img class="image" src="${dataUrl(red)}"`)
      assert.include(html, Image.label(spans[1]!.image!, spans[1]!.tokens.length))
      // The live view (agentfly watch) shows them too.
      const live = LiveReport.fragment({ ...read, finished: false })
      assert.include(live, `<img class="image" src="${dataUrl(blue)}"`)
      // Without the sidecar the report still names the image, with no picture.
      rmSync(join(dir, "images", `${sha(red)}.png`))
      const after = yield* Report.read(dir)
      assert.isFalse(after.images.has(sha(red)))
      const page = readFileSync(yield* Report.write(dir), "utf8")
      assert.notInclude(page, dataUrl(red))
      assert.include(page, Image.label(spans[0]!.image!, spans[0]!.tokens.length))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("externalise puts sidecar paths in the messages; internalise gives the data: URLs back", () =>
    Effect.gen(function*() {
      const red = pngBytes("#ff0000")
      const { trajectory } = yield* imageTrajectory(red, pngBytes("#00ff00"))
      const dir = mkdtempSync(join(tmpdir(), "images-ext-"))
      const out = yield* MessageImages.externalise(trajectory, dir)
      const part = (out.messages[0]!.content as ReadonlyArray<Message.ContentPart>)[1] as Message.ImagePart
      assert.strictEqual(part.image_url.url, `images/${sha(red)}.png`)
      assert.isTrue(existsSync(join(dir, part.image_url.url)))
      assert.deepStrictEqual(yield* MessageImages.internalise(out, dir), trajectory)
      // A sidecar that changed is caught by its hash.
      writeFileSync(join(dir, part.image_url.url), pngBytes("#123456"))
      const error = yield* Effect.flip(MessageImages.internalise(out, dir))
      assert.match(error.message, /SHA-256 is/)
    }).pipe(Effect.provide(NodeServices.layer)))
})
