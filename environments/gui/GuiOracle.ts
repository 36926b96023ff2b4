/**
 * Scripted players of the GUI task, run through the same tools and episode as a model:
 *
 * - {@link oracle}: reads the goal from the question and the screen from the latest image it was shown (pixels
 *   only: `Vision`), and clicks or types what the goal needs next. It never reads the row, so its solve rate proves
 *   every goal reachable from what the agent sees;
 * - {@link noise}: clicks a point drawn at random (seeded by the screen), the baseline that must score ≈ 0.
 *
 * @since 0.1.0
 */
import * as Oracle from "../../actors/Oracle.ts"
import type { Conversation } from "../../src/Message.ts"
import * as Sampling from "../../src/Sampling.ts"
import * as Render from "./Render.ts"
import * as Screen from "./Screen.ts"
import * as Vision from "./Vision.ts"

/**
 * The latest image the conversation showed (a user or tool message's `image_url` part with a `data:` URL).
 *
 * @category getters
 * @since 0.1.0
 */
export const latestImage = (messages: Conversation): Uint8Array | undefined => {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!
    if (m.role === "assistant" || typeof m.content === "string") continue
    for (let j = m.content.length - 1; j >= 0; j--) {
      const part = m.content[j]!
      if (part.type !== "image_url") continue
      const found = /^data:image\/[a-z]+;base64,(.*)$/s.exec(part.image_url.url)
      if (found !== null) return new Uint8Array(Buffer.from(found[1]!, "base64"))
    }
  }
  return undefined
}

const question = (messages: Conversation): string => Oracle.text(messages.find((m) => m.role === "user"))

const isColour = (name: string): name is Screen.Colour => name in Screen.palette

/** Whether a `type` call of the text was answered as typed. */
const typedAlready = (messages: Conversation, text: string): boolean =>
  messages.some((m) => m.role === "tool" && Oracle.text(m).startsWith(`Typed ${JSON.stringify(text)}`))

const clickAt = (messages: Conversation, rect: Screen.Rect | undefined): Oracle.Reply =>
  rect === undefined
    ? { content: "I cannot find it on the screen." }
    : { toolCalls: [Oracle.call(messages, "click", Screen.centre(rect))] }

/**
 * The next action for a goal on a screen's pixels.
 *
 * @category getters
 * @since 0.1.0
 */
export const next = (messages: Conversation, pixels: Render.Pixels): Oracle.Reply => {
  const q = question(messages)
  const click = /Click the (\w+) button/.exec(q)
  if (click !== null && isColour(click[1]!)) return clickAt(messages, Vision.button(pixels, click[1]))
  const form = /Type (\w+) in the box/.exec(q)
  if (form !== null) {
    if (!Vision.focused(pixels)) return clickAt(messages, Vision.field(pixels))
    if (!typedAlready(messages, form[1]!)) return { toolCalls: [Oracle.call(messages, "type", { text: form[1]! })] }
    return clickAt(messages, Vision.button(pixels, "green"))
  }
  const menu = /choose (\w+)/.exec(q)
  if (menu !== null && isColour(menu[1]!)) {
    return clickAt(messages, Vision.button(pixels, menu[1]) ?? Vision.button(pixels, "purple"))
  }
  return { content: "I do not understand the goal." }
}

/**
 * The oracle: {@link next} on the latest screen.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle: Oracle.Policy = (messages) => {
  const image = latestImage(messages)
  return image === undefined ? { content: "I see no screen." } : next(messages, Render.decode(image))
}

const hash = (bytes: Uint8Array): number => {
  let h = 2166136261
  for (let i = 0; i < bytes.length; i++) h = Math.imul(h ^ bytes[i]!, 16777619)
  return h >>> 0
}

/**
 * The noise baseline: a click at a point drawn at random over the screen.
 *
 * @category constructors
 * @since 0.1.0
 */
export const noise: Oracle.Policy = (messages) => {
  const image = latestImage(messages)
  if (image === undefined) return { content: "I see no screen." }
  const { width, height } = Render.decode(image)
  const rng = Sampling.rng(hash(image) + messages.length)
  const x = Math.floor(rng.next() * width), y = Math.floor(rng.next() * height)
  return { toolCalls: [Oracle.call(messages, "click", { x, y })] }
}
