/**
 * Writes the GUI task's data: `train.jsonl` (RL rows), `heldout.jsonl`, `validation.jsonl` (the warm-up's stopping
 * check) and `demos.jsonl` (the pixel-reading oracle's conversations, screens included as `data:` URLs, for the SFT
 * warm-up). A row is the question and the screen's layout, goal and step limit (`Generator.Row`). Seeded: the same
 * options always write the same bytes.
 *
 *   npx tsx examples/gui/generate.ts [OUT_DIR] [SEED] [NOISE] [--kinds click,form,menu] [--width 64] [--height 64]
 *     [--grid 16] [--screenFirst 1] [--buttons 1,3] [--backdrop gradient]
 *
 * `noise` is the share of demonstrations that start with one random click (then the oracle recovers when the
 * episode allows it): the warm-up then sees mistakes and their repair, and leaves RL something to improve.
 * `grid` (pixels, 0: off) snaps widgets to square cells (`Generator.Settings.grid`); `screenFirst 1` plays the
 * demonstrations under the task option `screenFirst` (a run training on them must set it too); `buttons` lists the
 * counts of buttons a click screen may have (`Generator.Settings.buttons`); `backdrop gradient` draws the screens on
 * a faint 2-D gradient (`Screen.Layout.backdrop`).
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as Oracle from "../../actors/Oracle.ts"
import * as Generator from "../../environments/gui/Generator.ts"
import * as GuiOracle from "../../environments/gui/GuiOracle.ts"
import * as GuiTask from "../../environments/gui/GuiTask.ts"
import * as Screen from "../../environments/gui/Screen.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Sampling from "../../src/Sampling.ts"
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
  readonly kinds: ReadonlyArray<string>
  readonly width: number
  readonly height: number
  /** Cell size in pixels of the grid widgets snap to; 0: no grid. */
  readonly grid: number
  /** 1: demonstrations under the task option `screenFirst` (the first screen before the question). */
  readonly screenFirst: number
  /** Buttons per click screen, one count drawn per row. */
  readonly buttons: ReadonlyArray<number>
  /** `plain` or `gradient` (`Screen.Layout.backdrop`). */
  readonly backdrop: string
}

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Options, "dir"> = {
  seed: 2026,
  noise: 0.3,
  train: 2000,
  heldOut: 200,
  validation: 100,
  demos: 1000,
  kinds: ["click", "form", "menu"],
  width: 64,
  height: 64,
  grid: 0,
  screenFirst: 0,
  buttons: [3],
  backdrop: "plain"
}

const isKind = (k: string): k is Generator.Kind => k === "click" || k === "form" || k === "menu"

/**
 * Generates and writes the four files under `options.dir` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("gui.generate.write")(function*(options: Options) {
  const bad = options.kinds.find((k) => !isKind(k))
  if (bad !== undefined) return yield* Effect.die(new Error(`unknown kind ${bad} (known: click, form, menu)`))
  const settings: Generator.Settings = {
    ...Generator.defaults,
    width: options.width,
    height: options.height,
    kinds: options.kinds.filter(isKind),
    grid: options.grid > 0 ? options.grid : undefined,
    ...(options.buttons.length === 1 && options.buttons[0] === 3 ? {} : { buttons: options.buttons }),
    ...(options.backdrop === "gradient" ? { backdrop: "gradient" as const } : {})
  }
  if (options.backdrop !== "plain" && options.backdrop !== "gradient") {
    return yield* Effect.die(new Error(`--backdrop ${options.backdrop}: plain or gradient`))
  }
  const badCount = options.buttons.find((n) => !Number.isInteger(n) || n < 1 || n > Screen.colours.length)
  if (badCount !== undefined) {
    return yield* Effect.die(new Error(`--buttons ${badCount}: a click screen has 1 to ${Screen.colours.length}`))
  }
  if (settings.grid !== undefined && (options.width < 3 * settings.grid || options.height < 4 * settings.grid)) {
    const size = `${options.width} × ${options.height}`
    return yield* Effect.die(new Error(`--grid ${settings.grid} needs a screen of at least 3 × 4 cells, got ${size}`))
  }
  const split = (count: number, salt: number) => Generator.generate(options.seed * 4 + salt, count, settings)
  const demoRows = split(options.demos, 3)
  // A slip: the first action of a share `noise` of games (drawn by the first screen's bytes) is a random click.
  const policy: Oracle.Policy = (messages) => {
    const first = !messages.some((m) => m.role === "assistant")
    const screen = GuiOracle.latestImage(messages)
    const slips = first && screen !== undefined && Sampling.rng(options.seed ^ hash(screen)).next() < options.noise
    return slips ? GuiOracle.noise(messages) : GuiOracle.oracle(messages)
  }
  const played = yield* Oracle.rollout({ task: GuiTask.make({ screenFirst: options.screenFirst === 1 }), rows: demoRows, policy })
  return yield* Dataset.writeSplits(options.dir, {
    train: split(options.train, 0),
    heldOut: split(options.heldOut, 1),
    validation: split(options.validation, 2),
    demos: Oracle.demonstrations(played)
  })
})

const hash = (bytes: Uint8Array): number => {
  let h = 2166136261
  for (let i = 0; i < bytes.length; i++) h = Math.imul(h ^ bytes[i]!, 16777619)
  return h >>> 0
}

main(import.meta.url, { ...defaults, dir: "data" }, write)
