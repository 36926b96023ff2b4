/**
 * An auxiliary supervised task on the GUI task's screens, before the warm-up: a short sequence per screen — the
 * screen's image tokens, then the goal's colour, then the target's centre as the click writes it (`red 8 40`) — on
 * which the whole `tiny-vl` model (tower and language model) learns where a named button is. In the task's
 * conversations the coordinates come some 90 tokens after the screen, behind the call's format: from scratch, the
 * warm-up stays on the plateau where the coordinates do not depend on the screen (BENCHMARKS.md, "gui"); here, with
 * nothing between the screen and the answer, the model leaves it within a few hundred steps, and the warm-up
 * starts from a model that already reads positions off the screen.
 *
 *   npx tsx examples/gui/pretrain.ts MODEL_DIR [--steps 400] [--lr 0.001] [--buttons 1,3] [--backdrop gradient]
 *     [--seed 1] [--grid 16]
 *
 * `MODEL_DIR` is a `tiny-vl` folder (`agentfly init-model --preset tiny-vl`); its weights are replaced by the
 * trained ones. Logs the held-out loss of the coordinates every 50 steps.
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import * as Generator from "../../environments/gui/Generator.ts"
import * as Render from "../../environments/gui/Render.ts"
import * as Screen from "../../environments/gui/Screen.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as OnnxTrainerVision from "../../src/backends/OnnxTrainerVision.ts"
import * as Image from "../../src/Image.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as VisionTower from "../../src/model/VisionTower.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as Packing from "../../src/Packing.ts"
import type * as Tokenizer from "../../src/Tokenizer.ts"

/**
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly steps: number
  readonly lr: number
  readonly buttons: ReadonlyArray<number>
  readonly backdrop: "plain" | "gradient"
  readonly seed: number
  readonly grid: number
  readonly batchSize: number
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Options = {
  steps: 400,
  lr: 1e-3,
  buttons: [1, 3],
  backdrop: "gradient",
  seed: 1,
  grid: 16,
  batchSize: 16
}

/**
 * The text after a click row's screen and the length of its trained tail: `"<colour> <x> <y>"`, the coordinates
 * (the target's centre) trained.
 *
 * @category getters
 * @since 0.1.0
 */
export const answer = (row: Generator.Row): { readonly text: string; readonly trained: number } => {
  const goal = row.goal
  if (goal.kind !== "click") throw new Error(`pretraining takes click rows, got a ${goal.kind} row`)
  const target = row.layout.buttons.find((b) => b.id === goal.target)!
  const { x, y } = Screen.centre(target.rect)
  const coordinates = `${x} ${y}`
  // With one button its colour is trained too: a signal in the mean of the image tokens from the first step,
  // which teaches attending to the button before its place can be read (the coordinates alone give none at first).
  const text = `${target.colour} ${coordinates}`
  return { text, trained: row.layout.buttons.length === 1 ? text.length : coordinates.length }
}

const sequenceOf = Effect.fnUntraced(function*(
  folder: ModelFolder.ModelFolder,
  tokenizer: Tokenizer.Tokenizer,
  row: Generator.Row
) {
  const pad = tokenizer.tokenToId("<|image_pad|>")!
  const open = tokenizer.tokenToId("<|vision_start|>")!, close = tokenizer.tokenToId("<|vision_end|>")!
  const image = yield* Image.fromUrl(Render.dataUrl(Screen.start(row.layout, row.goal, row.maxSteps)))
  const vision = folder.vision!.vision
  const pixels = VisionTower.toPixels(vision, image)
  const { text, trained } = answer(row)
  const tail = tokenizer.encode(text)
  const side = vision.patchSize * vision.spatialMergeSize
  const tokens = (pixels.width / side) * (pixels.height / side)
  const ids = [open, ...Array<number>(tokens).fill(pad), close, ...tail]
  const mask = ids.map((_, i) => (i >= ids.length - trained ? 1 : 0))
  return {
    tokenIds: Int32Array.from(ids),
    lossMask: Uint8Array.from(mask),
    images: [pixels]
  } satisfies Packing.Sequence
})

/**
 * Trains `dir`'s model on the auxiliary task and writes its weights back.
 *
 * @category constructors
 * @since 0.1.0
 */
export const pretrain = Effect.fn("gui.pretrain")(function*(dir: string, options: Options) {
  const folder = yield* ModelFolder.load(dir)
  const pad = folder.tokenizer.tokenToId("<|image_pad|>")
  if (folder.vision === undefined || pad === undefined) {
    return yield* Effect.die(new Error(`${dir} has no vision tower: pretraining needs a tiny-vl folder`))
  }
  const settings: Generator.Settings = {
    ...Generator.defaults,
    kinds: ["click"],
    grid: options.grid,
    buttons: options.buttons,
    backdrop: options.backdrop
  }
  const rows = Generator.generate(options.seed * 7919 + 5, options.steps * options.batchSize, settings)
  const heldOut = Generator.generate(options.seed * 7919 + 6, 128, settings)
  const { trainer } = yield* OnnxTrainer.make({
    model: OnnxTrainerVision.qwen2Vl(folder.vision, pad),
    weights: folder.weights,
    loss: Loss.sft,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(options.lr, 10)
  })
  const pack = (batch: ReadonlyArray<Generator.Row>) =>
    Effect.flatMap(
      Effect.forEach(batch, (row) => sequenceOf(folder, folder.tokenizer, row)),
      (sequences) => Packing.pack(sequences, { tokenBudget: 8192, aggregation: "token-mean" })
    )
  const heldOutLoss = Effect.gen(function*() {
    let sum = 0, tokens = 0
    for (const mb of (yield* pack(heldOut)).microBatches) {
      const logprobs = yield* trainer.logprobs(mb)
      logprobs.forEach((lp, i) => {
        if (mb.mask[i] === 1) sum -= lp, tokens++
      })
    }
    return sum / tokens
  })
  for (let step = 1; step <= options.steps; step++) {
    const batch = rows.slice((step - 1) * options.batchSize, step * options.batchSize)
    let loss = 0
    for (const mb of (yield* pack(batch)).microBatches) loss += (yield* trainer.forwardBackward(mb)).loss
    yield* trainer.optimStep
    if (step % 50 === 0 || step === options.steps) {
      const held = yield* heldOutLoss
      yield* Effect.log(`step ${step}: loss ${loss.toFixed(3)}, held-out ${held.toFixed(3)} per trained token`)
    }
  }
  const weights = yield* trainer.weights
  yield* ModelFolder.writeModel(dir, folder.config, weights, { vision: folder.vision.vision })
  return { steps: options.steps, heldOutLoss: yield* heldOutLoss }
})

if (import.meta.url === `file://${process.argv[1]}`) {
  const [dir, ...rest] = process.argv.slice(2)
  const options: Record<string, unknown> = { ...defaults }
  for (let i = 0; i < rest.length; i += 2) {
    const key = rest[i]!.replace(/^--/, "")
    const value = rest[i + 1]
    if (!(key in defaults) || value === undefined) {
      console.error(`unknown option or missing value: ${rest[i]} (known: ${Object.keys(defaults).join(", ")})`)
      process.exit(2)
    }
    const current = (defaults as unknown as Record<string, unknown>)[key]
    options[key] = Array.isArray(current) ? value.split(",").map(Number) : typeof current === "number" ? Number(value) : value
  }
  if (dir === undefined) {
    console.error("usage: npx tsx examples/gui/pretrain.ts MODEL_DIR [--steps 400] [--lr 0.001] [--buttons 1,3] …")
    process.exit(2)
  }
  pretrain(dir, options as unknown as Options).pipe(
    Effect.tap((result) => Effect.log(JSON.stringify(result))),
    Effect.scoped,
    Effect.provide(NodeServices.layer),
    NodeRuntime.runMain
  )
}
