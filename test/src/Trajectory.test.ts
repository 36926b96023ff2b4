import { assert, describe, it } from "@effect/vitest"
import * as Trajectory from "../../src/Trajectory.ts"

const segment: Trajectory.Segment = {
  messageCount: 3,
  spans: [
    { source: "prompt", tokenIds: [1, 2, 3] },
    { source: "policy", tokenIds: [4, 5], logprobs: [-0.1, -0.2], policyVersion: 2 },
    { source: "tool", tokenIds: [6, 7, 8, 9] }
  ]
}

describe("Trajectory.clipSegment", () => {
  it("keeps a segment within the limit as it is", () => {
    assert.strictEqual(Trajectory.clipSegment(segment, 9), segment)
    assert.strictEqual(Trajectory.clipSegment(segment, 100), segment)
  })

  it("cuts trailing tokens, keeping spans, sources and logprobs aligned", () => {
    const cut = Trajectory.clipSegment(segment, 6)
    assert.deepStrictEqual(Array.from(Trajectory.tokenIds(cut)), [1, 2, 3, 4, 5, 6])
    assert.deepStrictEqual(Trajectory.sources(cut), ["prompt", "prompt", "prompt", "policy", "policy", "tool"])
    assert.strictEqual(cut.messageCount, 3)
    // Inside a policy span, logprobs are cut with the tokens.
    const inPolicy = Trajectory.clipSegment(segment, 4)
    const last: Trajectory.Span = { source: "policy", tokenIds: [4], logprobs: [-0.1], policyVersion: 2 }
    assert.deepStrictEqual(inPolicy.spans.at(-1), last)
    assert.deepStrictEqual(Array.from(Trajectory.lossMask(inPolicy)), [0, 0, 0, 1])
    // At a span boundary no empty span is left.
    assert.strictEqual(Trajectory.clipSegment(segment, 5).spans.length, 2)
  })
})
