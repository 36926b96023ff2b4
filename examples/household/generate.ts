/**
 * Writes the household task's data (`train.jsonl`, `heldout.jsonl`, `validation.jsonl`, `demos.jsonl`) for the
 * configs beside this file: the curriculum a tiny byte-level policy with a 512-token context can hold, pick-and-place
 * and look-under-the-lamp in one room of three receptacles that start open (an episode of 4–5 commands is ≈ 450
 * tokens). Demonstrations are the oracle's solved episodes that fit those 512 tokens (about half of them).
 * Seeded: the same options write the same bytes.
 *
 *   npx tsx examples/household/generate.ts [OUT_DIR] [SEED] [NOISE]
 *
 * `NOISE` is the chance that a demonstration step is a detour to a receptacle drawn at random (default 0). All six
 * ALFWorld types in closed-receptacle worlds (`World.defaultSpec`) need ≈ 1,000 tokens an episode: call
 * `Data.write` with `{ family: "household", world: {}, maxContextTokens: 1024 }` for a policy that holds them.
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
  world: { receptacles: 3, distractors: 1, open: 1 },
  maxSteps: 8,
  maxContextTokens: 512,
  train: 2000,
  heldOut: 200,
  validation: 100,
  demos: 4000
}

main(import.meta.url, { ...defaults, dir: "data" }, Data.write)
