/**
 * Writes the long-horizon household data for the context-folding figure (`docs/context-folding.md`): pick-and-place
 * and look-under-the-lamp in one room of six receptacles, up to 14 commands an episode. An episode the oracle
 * solves takes ≈ 350–900 byte-tokens, so at the tiny preset's 512 positions many episodes outgrow the context:
 * without a context policy they end at `agent.maxContextTokens`; with one (`long-drop.json`, `long-fold.json`) the
 * chain folds and goes on. Demonstrations are the oracle's solved episodes that fit 512 tokens whole.
 *
 *   npx tsx examples/household/generate-long.ts [OUT_DIR] [SEED] [NOISE]
 *
 * @since 0.1.0
 */
import * as Data from "../../environments/household/Data.ts"
import { main } from "../generator.ts"

/**
 * @category constants
 * @since 0.1.0
 */
export const defaults: Omit<Data.Options, "dir"> = {
  ...Data.defaults,
  family: "household",
  types: ["pick", "look"],
  world: { receptacles: 6, distractors: 1, open: 1 },
  maxSteps: 14,
  maxContextTokens: 512,
  train: 800,
  heldOut: 100,
  validation: 60,
  demos: 2000
}

main(import.meta.url, { ...defaults, dir: "data-long" }, Data.write)
