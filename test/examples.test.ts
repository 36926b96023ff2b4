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
    timeout: 300_000
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

describe("examples/02_rollout_local_model.ts", () => {
  it("rolls out 2 questions × 4 chains on the local engine: terminations, rewards and token-level masks", () => {
    const lines = runExample("02_rollout_local_model.ts").trim().split("\n")
    const line =
      /^trajectory \S+-g(\d)-c\d row=(\d) termination=(\w+) reward=(\S+) policyTokens=(\d+) totalTokens=(\d+) /
    const trajectories = lines.filter((l) => l.startsWith("trajectory ")).map((l) => {
      const m = line.exec(l)
      assert.isNotNull(m, l)
      const [group, row, termination, reward, policy, total] = m!.slice(1)
      return {
        group: Number(group),
        row: Number(row),
        termination: termination!,
        reward: Number(reward),
        policy: Number(policy),
        total: Number(total)
      }
    })
    assert.strictEqual(trajectories.length, 8)
    const known = ["answer", "no_tool_call", "max_turns", "context_length", "stop", "error", "interrupted"]
    for (const t of trajectories) {
      assert.include(known, t.termination)
      assert.notStrictEqual(t.termination, "error") // the padded vocabulary is cut off: every chain decodes
      assert.isTrue(t.policy > 0 && t.policy < t.total, `policy ${t.policy} of ${t.total} tokens`)
      assert.include([0, 1], t.reward)
      assert.strictEqual(t.group, t.row)
    }
    assert.deepStrictEqual(trajectories.map((t) => t.row).sort(), [0, 0, 0, 0, 1, 1, 1, 1])
    const groups = lines.filter((l) => l.startsWith("group "))
    assert.strictEqual(groups.length, 2)
    for (const g of groups) assert.match(g, /^group \S+-g[01] row=[01] rewards=\[[01],[01],[01],[01]\]$/)
  })
})
