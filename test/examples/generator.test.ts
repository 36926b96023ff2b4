import { assert, describe, it } from "@effect/vitest"
import { parseArgs } from "../../examples/generator.ts"

const defaults = { dir: "data", seed: 1, noise: 0, heldOut: 300, kind: "mixed" }

describe("the generators' command line", () => {
  it("reads OUT_DIR SEED NOISE, then --KEY VALUE typed as the default", () => {
    assert.deepStrictEqual(parseArgs([], defaults), defaults)
    assert.deepStrictEqual(parseArgs(["out", "7", "0.5", "--kind", "sums", "--heldOut", "20"], defaults), {
      dir: "out",
      seed: 7,
      noise: 0.5,
      heldOut: 20,
      kind: "sums"
    })
    assert.deepStrictEqual(parseArgs(["--seed", "3"], defaults), { ...defaults, seed: 3 })
  })

  it("names an unknown option, a missing value, a bad number or an extra argument", () => {
    const typo = String(parseArgs(["out", "--kidn", "sums"], defaults))
    assert.include(typo, "unknown option --kidn (known: --dir, --seed")
    assert.strictEqual(parseArgs(["--kind"], defaults), "--kind needs a value")
    assert.strictEqual(parseArgs(["out", "x"], defaults), `seed must be a number, got "x"`)
    assert.strictEqual(parseArgs(["--heldOut", "1e400"], defaults), `heldOut must be a number, got "1e400"`)
    assert.include(String(parseArgs(["out", "1", "0", "extra"], defaults)), "unexpected argument extra")
  })
})
