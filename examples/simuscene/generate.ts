/**
 * Writes the SimuScene task's data: `train.jsonl`, `heldout.jsonl`, `validation.jsonl` (rows: the scene in words
 * and the scene itself, which only the reward reads) and `demos.jsonl` (the oracle's programs, for the SFT
 * warm-up: written from the scene without running them; the oracle's runs score 1, test/environments/simuscene).
 *
 *   npx tsx examples/simuscene/generate.ts [OUT_DIR] [SEED]
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Scene from "../../environments/simuscene/Scene.ts"
import * as SimuSceneOracle from "../../environments/simuscene/SimuSceneOracle.ts"
import * as SimuSceneTask from "../../environments/simuscene/SimuSceneTask.ts"
import * as Dataset from "../../src/Dataset.ts"
import { main } from "../generator.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly dir: string
  readonly seed: number
  readonly noise: number
  readonly train: number
  readonly heldOut: number
  readonly validation: number
  readonly demos: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 2026,
  noise: 0,
  train: 1000,
  heldOut: 100,
  validation: 50,
  demos: 500
}

const systemPrompt = SimuSceneTask.make().defaults.systemPrompt!

/**
 * A scene's demonstration: the oracle's program as one `simulate` call, and its answer.
 *
 * @category constructors
 * @since 0.1.0
 */
export const demonstration = (scene: Scene.Scene) => ({
  messages: [
    { role: "system", content: systemPrompt },
    { role: "user", content: Scene.describe(scene) },
    {
      role: "assistant",
      content: "",
      tool_calls: [{
        id: "call_0_0",
        type: "function",
        function: { name: "simulate", arguments: { code: SimuSceneOracle.program(scene) } }
      }]
    },
    {
      role: "tool",
      tool_call_id: "call_0_0",
      name: "simulate",
      content: `Simulated ${scene.balls.length} ball(s) for ${scene.steps} steps.`
    }
  ]
})

/**
 * Generates and writes the four files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("simuscene.generate.write")(function*(options: Options) {
  const rows = (count: number, salt: number) =>
    Scene.generate(options.seed * 4 + salt, count).map((scene) => ({ question: Scene.describe(scene), scene }))
  return yield* Dataset.writeSplits(options.dir, {
    train: rows(options.train, 0),
    heldOut: rows(options.heldOut, 1),
    validation: rows(options.validation, 2),
    demos: Scene.generate(options.seed * 4 + 3, options.demos).map(demonstration)
  })
})

main(import.meta.url, { ...defaults, dir: "data" }, write)
