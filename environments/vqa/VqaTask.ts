/**
 * The visual QA task: a picture of coloured shapes (`Scene.ts`, rendered from the row's `seed`) and a counting
 * question about it; the answer is scored by the QA reward `exactMatch` (`environments/rewards/Qa.ts`: the last
 * `<answer>…</answer>`, else the whole reply, against the row's `answer`). One turn, no tools: the simplest check
 * that images reach the policy and that a reward reads its answer about them.
 *
 * The task needs a vision model (`tiny-vl`, or a folder with Qwen2-VL's `preprocessor_config.json`): a text-only
 * model refuses its first prompt, naming the model. Its oracle (`oracle`) counts the shapes from the picture's
 * pixels alone (`Scene.count`) and solves every row.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import * as Image from "../../src/Image.ts"
import type * as Message from "../../src/Message.ts"
import * as Task from "../../src/Task.ts"
import * as Qa from "../rewards/Qa.ts"
import * as Scene from "./Scene.ts"

/**
 * A row: the question, the answer (a count, as text) and the seed its picture is rendered from.
 *
 * @category models
 * @since 0.1.0
 */
export const Row = Schema.Struct({ answer: Schema.String, seed: Schema.Int })

/**
 * The system prompt of the task.
 *
 * @category constants
 * @since 0.1.0
 */
export const systemPrompt = "Look at the picture and answer with a number inside <answer></answer>."

/**
 * The task.
 *
 * @category constructors
 * @since 0.1.0
 */
export const task: Task.Task = Task.make("vqa", {
  description: "Count the shapes of a colour in a picture (visual QA, one turn)",
  row: Row,
  prompt: (row, system): Message.Conversation => {
    const scene = Scene.generate(row.fields.seed)
    return [
      ...(system === undefined ? [] : [{ role: "system" as const, content: system }]),
      {
        role: "user",
        content: [
          { type: "text", text: row.question ?? Scene.question(scene) },
          { type: "image_url", image_url: { url: Scene.dataUrl(scene) } }
        ]
      }
    ]
  },
  reward: Qa.exactMatch,
  defaults: { systemPrompt, maxTurns: 1, maxNewTokens: 16, maxContextTokens: 256 }
})

const askedOf = (question: string): { kind: Scene.Kind; colour: Scene.Colour } | undefined => {
  const match = /How many (red|green|blue) (circle|square|triangle)s/.exec(question)
  return match === null ? undefined : { colour: match[1] as Scene.Colour, kind: match[2] as Scene.Kind }
}

/**
 * The oracle: reads the question's colour and kind, counts those shapes in the picture's pixels, answers
 * `<answer>N</answer>`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const oracle: Oracle.Policy = (messages) => {
  const user = Oracle.last(messages, "user")
  const parts = typeof user?.content === "string" ? [] : user?.content ?? []
  const asked = askedOf(Oracle.text(user))
  const image = parts.find((p): p is Message.ImagePart => p.type === "image_url")
  if (asked === undefined || image === undefined) return { content: "<answer>0</answer>" }
  const bytes = Buffer.from(image.image_url.url.slice(image.image_url.url.indexOf(",") + 1), "base64")
  return { content: `<answer>${Scene.count(bytes, asked.kind, asked.colour)}</answer>` }
}

/**
 * The token count of the task's picture in the `tiny-vl` geometry (patch 8, 2 × 2 merge): 16.
 *
 * @category constants
 * @since 0.1.0
 */
export const imageTokens = Image.visionTokenCount(64, 64, { patchSize: 8, mergeSize: 2, maxPixels: 64 * 64 })
