/**
 * The vision learner's guards: a trajectory whose policy sampled a vision token (a pad that stands for no image) is
 * masked, the rest of its group and other groups untouched; a segment's pixels follow its image spans in order.
 */
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect } from "effect"
import * as SequenceImages from "../../actors/internal/sequenceImages.ts"
import * as Image from "../../src/Image.ts"
import * as VisionTower from "../../src/model/VisionTower.ts"
import type * as Trajectory from "../../src/Trajectory.ts"

const trajectory = (
  id: string,
  spans: ReadonlyArray<Trajectory.Span>,
  messages: Trajectory.Trajectory["messages"] = []
) =>
  ({
    trajectoryId: id,
    groupId: "g",
    chainId: id,
    messages,
    segments: [{ spans, messageCount: messages.length }],
    termination: "episode_end",
    reward: 0,
    rewardStatus: "scored",
    metrics: {},
    trainable: true,
    masked: false
  }) as unknown as Trajectory.Trajectory

const png = (color: string) => {
  const canvas = createCanvas(32, 32)
  const context = canvas.getContext("2d")
  context.fillStyle = color
  context.fillRect(0, 0, 32, 32)
  return canvas.toBuffer("image/png")
}

describe("sequenceImages", () => {
  it("masks the trajectories whose policy sampled a vision token, and only those", () => {
    const clean = trajectory("a", [{ source: "prompt", tokenIds: [1, 266, 2] }, { source: "policy", tokenIds: [3, 4] }])
    const stray = trajectory("b", [{ source: "prompt", tokenIds: [1, 266, 2] }, { source: "policy", tokenIds: [266] }])
    const text = { groupId: "t", trajectories: [clean] } as unknown as Trajectory.Group
    const mixed = { groupId: "m", trajectories: [clean, stray] } as unknown as Trajectory.Group
    const [t, m] = SequenceImages.maskStrayVisionTokens([text, mixed], new Set([265, 266, 267]))
    assert.strictEqual(t, text, "a group without stray tokens is returned as it is")
    assert.deepStrictEqual(m!.trajectories.map((x) => x.masked), [false, true])
    assert.strictEqual(m!.trajectories[0], clean)
  })

  it.effect("each segment's pixels are its image spans' images, in order, decoded from the data URLs", () =>
    Effect.gen(function*() {
      const red = png("#ff0000"), blue = png("#0000ff")
      const url = (bytes: Buffer) => `data:image/png;base64,${bytes.toString("base64")}`
      const part = (bytes: Buffer) => ({ type: "image_url" as const, image_url: { url: url(bytes) } })
      const ref = (bytes: Buffer) => ({ sha256: Image.sha256(bytes), width: 32, height: 32, mediaType: "image/png" })
      const t = trajectory("a", [
        { source: "prompt", tokenIds: [266], image: ref(blue) },
        { source: "env", tokenIds: [266], image: ref(red) }
      ] as ReadonlyArray<Trajectory.Span>, [{ role: "user", content: [part(red), part(blue)] }])
      const vision = VisionTower.presets["tiny-vl"].vision
      const pixels = yield* SequenceImages.ofConversations(vision, [t])
      const got = pixels.get(t.segments[0]!)!
      const expect = (bytes: Buffer) => Effect.map(Image.decode(bytes), (image) => VisionTower.toPixels(vision, image))
      assert.deepStrictEqual(got.map((p) => p.data), [(yield* expect(blue)).data, (yield* expect(red)).data])
      const missing = trajectory("b", [{ source: "prompt", tokenIds: [266], image: ref(png("#00ff00")) }] as never, [])
      const error = yield* Effect.flip(SequenceImages.ofConversations(vision, [missing]))
      assert.include(error.message, "in none of its messages")
    }))
})
