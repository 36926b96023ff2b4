import { assert, describe, it } from "@effect/vitest"
import { besideModule, parseArgs } from "../../examples/generator.ts"

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
    assert.strictEqual(parseArgs(["--heldOut", "-5"], defaults), `heldOut must be a whole number ≥ 0, got "-5"`)
    assert.strictEqual(parseArgs(["out", "1", "7"], defaults), "noise is a probability: expected 0 to 1, got 7")
  })

  it("reads a list comma-separated and an object as JSON, typed as the default", () => {
    const rich = { ...defaults, types: ["pick", "look"], world: { receptacles: 3 }, sizes: [1, 2] }
    assert.deepStrictEqual(parseArgs(["--types", "pick, clean", "--sizes", "4,5"], rich), {
      ...rich,
      types: ["pick", "clean"],
      sizes: [4, 5]
    })
    assert.deepStrictEqual(parseArgs(["--world", `{"receptacles":4}`], rich), { ...rich, world: { receptacles: 4 } })
    assert.include(String(parseArgs(["--world", "4"], rich)), "--world must be a JSON object")
    assert.include(String(parseArgs(["--sizes", "a,b"], rich)), "--sizes must be numbers")
  })

  it("writes its default OUT_DIR beside the generator from any working directory; a given one is the caller's", () => {
    const module = "file:///repo/examples/guess/generate.ts"
    assert.strictEqual(besideModule(module, "data", "/repo"), "examples/guess/data")
    assert.strictEqual(besideModule(module, "data", "/repo/examples/guess"), "data")
    assert.strictEqual(besideModule(module, "data", "/elsewhere"), "../repo/examples/guess/data")
    // OUT_DIR on the command line is taken as given (relative to the working directory).
    assert.strictEqual((parseArgs(["out"], defaults) as typeof defaults).dir, "out")
  })
})
