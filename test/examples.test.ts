/**
 * Smoke runs of every example in `examples/`, as CI runs them (CleanRL's tests): each must exit 0 and print what
 * it promises. Add a `describe` block per example.
 */
import { assert, describe, it } from "@effect/vitest"
import { execFileSync } from "node:child_process"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const runExample = (file: string): string =>
  execFileSync(join(root, "node_modules/.bin/tsx"), [join(root, "examples", file)], {
    cwd: root,
    encoding: "utf8",
    timeout: 60_000
  })

describe("examples/01_custom_tool_and_reward.ts", () => {
  it("runs the custom tool and reward: observations, an error observation, the reward and metrics", () => {
    const out = runExample("01_custom_tool_and_reward.ts").trim().split("\n")
    assert.strictEqual(out[0], "1 ok: 6")
    assert.strictEqual(out[1], `2 error: Error: invalid arguments for tool "word_count": Missing key at ["text"]`)
    assert.strictEqual(out[2], "3 ok: 6")
    assert.match(out[3]!, /^reward 1 \{"reward\/rightCount\/reward":1\} /)
    assert.include(out[3]!, `"tool/word_count/errors/DecodeError":1`)
  })
})
