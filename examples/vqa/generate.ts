/**
 * Writes the visual QA example's data: `train.jsonl` (RL prompts), `heldout.jsonl` and `demos.jsonl` (the oracle's
 * answers as conversations, for an SFT warm-up), each row `{ question, answer, seed }`, the picture rendered from
 * the seed when a chain starts (`environments/vqa/Scene.ts`). Seeded: the same options always write the same bytes.
 *
 *   npx tsx examples/vqa/generate.ts [OUT_DIR] [SEED]
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Scene from "../../environments/vqa/Scene.ts"
import * as VqaTask from "../../environments/vqa/VqaTask.ts"
import * as Dataset from "../../src/Dataset.ts"
import { main } from "../generator.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  readonly train: number
  readonly heldOut: number
  readonly demos: number
  readonly noise: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = { seed: 4242, train: 2000, heldOut: 200, demos: 2000, noise: 0 }

/**
 * The rows of each split: consecutive seeds from `seed`, the splits' ranges disjoint.
 *
 * @category constructors
 * @since 0.1.0
 */
export const splits = (options: Omit<Options, "dir">) => {
  const rows = (from: number, n: number) => Array.from({ length: n }, (_, i) => Scene.row(options.seed + from + i))
  const train = rows(0, options.train)
  const heldOut = rows(options.train, options.heldOut)
  const demos = rows(options.train + options.heldOut, options.demos).map((row) => ({
    messages: [
      { role: "system", content: VqaTask.systemPrompt },
      {
        role: "user",
        content: [
          { type: "text", text: row.question },
          { type: "image_url", image_url: { url: Scene.dataUrl(Scene.generate(row.seed)) } }
        ]
      },
      { role: "assistant", content: `<answer>${row.answer}</answer>` }
    ]
  }))
  return { train, heldOut, demos }
}

/**
 * Generates and writes the files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("vqa.generate.write")(function*(options: Options) {
  return yield* Dataset.writeSplits(options.dir, splits(options))
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
