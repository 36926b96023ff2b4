/**
 * The tower's pixels of trajectories' image spans, for a vision learner's sequences (`Packing.Sequence.images`):
 * each segment's images in the order of its `<|image_pad|>` runs, decoded from the conversation's image parts
 * (each distinct image once).
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Image from "../../src/Image.ts"
import type * as Message from "../../src/Message.ts"
import * as VisionTower from "../../src/model/VisionTower.ts"
import type * as Packing from "../../src/Packing.ts"
import type * as Trajectory from "../../src/Trajectory.ts"
import { runError } from "../RunError.ts"

/** What a trajectory or a built conversation holds: its messages (with their image parts) and its segments. */
export interface Conversation {
  readonly messages: ReadonlyArray<Message.Message>
  readonly segments: ReadonlyArray<Trajectory.Segment>
}

const imageHashes = (segment: Trajectory.Segment): ReadonlyArray<string> =>
  segment.spans.flatMap((span) => span.image === undefined ? [] : [span.image.sha256])

/**
 * Each segment with image spans and its pixels (segments without images are absent). An image span whose image no
 * message part holds (a trajectory read back with its images in sidecar files) fails as the learner's error.
 */
export const ofConversations = Effect.fnUntraced(function*(
  vision: VisionTower.VisionConfig,
  conversations: ReadonlyArray<Conversation>
) {
  const out = new Map<Trajectory.Segment, ReadonlyArray<VisionTower.Pixels>>()
  const pixels = new Map<string, VisionTower.Pixels>()
  for (const conversation of conversations) {
    if (!conversation.segments.some((segment) => imageHashes(segment).length > 0)) continue
    for (const message of conversation.messages) {
      if (typeof message.content === "string") continue
      for (const part of message.content) {
        if (part.type !== "image_url" || (part.image !== undefined && pixels.has(part.image.sha256))) continue
        if (!Image.isDataUrl(part.image_url.url)) continue
        const image = yield* Image.fromUrl(part.image_url.url).pipe(
          Effect.mapError((e) => runError("Learner", `an image of the batch: ${e.message}`, e))
        )
        pixels.set(image.ref.sha256, VisionTower.toPixels(vision, image))
      }
    }
    for (const segment of conversation.segments) {
      const hashes = imageHashes(segment)
      if (hashes.length === 0) continue
      const missing = hashes.find((sha) => !pixels.has(sha))
      if (missing !== undefined) {
        return yield* runError("Learner", `image ${missing} of a trajectory is in none of its messages' data URLs`)
      }
      out.set(segment, hashes.map((sha) => pixels.get(sha)!))
    }
  }
  return out
})

/** A sequence with its segment's images, if it has any (a text sequence is returned as it is). */
export const withImages = (
  sequence: Packing.Sequence,
  images: ReadonlyArray<VisionTower.Pixels> | undefined
): Packing.Sequence => images === undefined || images.length === 0 ? sequence : { ...sequence, images }

/**
 * The groups with every trajectory whose policy sampled a vision token (`ids`: `<|image_pad|>` and its brackets)
 * masked: such a pad stands for no image, so the tower has nothing to put there and the sequence cannot be trained
 * (the learner would count more pads than image tokens). Masked, it leaves the loss and its group's baseline.
 */
export const maskStrayVisionTokens = (
  groups: ReadonlyArray<Trajectory.Group>,
  ids: ReadonlySet<number>
): ReadonlyArray<Trajectory.Group> =>
  groups.map((group) => {
    const sampled = (span: Trajectory.Span) => span.source === "policy" && span.tokenIds.some((id) => ids.has(id))
    const stray = (t: Trajectory.Trajectory) => t.segments.some((s) => s.spans.some(sampled))
    if (!group.trajectories.some(stray)) return group
    return { ...group, trajectories: group.trajectories.map((t) => stray(t) ? { ...t, masked: true } : t) }
  })
