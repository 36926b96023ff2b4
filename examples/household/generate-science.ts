/**
 * Writes the science task's data (`science.json`'s `data-science/`): the four experiment types (melt / boil / freeze
 * a substance, measure a temperature, power a device, grow a seed) in one room of four receptacles that start closed,
 * with the oracle's solved episodes that fit 1,024 tokens as demonstrations. Seeded.
 *
 *   npx tsx examples/household/generate-science.ts [OUT_DIR] [SEED] [NOISE]
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
  family: "science",
  maxSteps: 20,
  maxContextTokens: 1024,
  train: 2000,
  heldOut: 200,
  validation: 100,
  demos: 600
}

main(import.meta.url, { ...defaults, dir: "examples/household/data-science" }, Data.write)
