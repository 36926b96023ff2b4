import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import * as PeakRss from "../../../actors/internal/peakRss.ts"

describe("peakRss", () => {
  it.live("a new high between two reads is the interval's peak; the next interval starts from the RSS then", () =>
    Effect.gen(function*() {
      const probe = yield* PeakRss.make(5)
      const before = yield* probe.take
      assert.isTrue(before.rssMb > 20 && before.peakMb >= before.rssMb, JSON.stringify(before))
      // Touch 256 MB more than the process has ever held, then drop it.
      const highest = process.resourceUsage().maxRSS / 1024
      let block: Uint8Array | undefined = new Uint8Array((highest - before.rssMb + 256) * 2 ** 20).fill(1)
      const during = yield* probe.take
      assert.isAtLeast(during.peakMb, highest + 200, JSON.stringify({ highest, during }))
      block = undefined
      void block
      const after = yield* probe.take
      assert.isAtMost(after.peakMb, during.peakMb)
      assert.isAtLeast(after.peakMb, after.rssMb)
    }))

  it.effect("bytes per parameter: the peak over the parameters counted while their learner's scope is open", () =>
    Effect.gen(function*() {
      const read = { peakMb: 1000, rssMb: 800 }
      assert.deepStrictEqual(PeakRss.figures(read), { "perf/peak_rss_mb": 1000, "perf/rss_mb": 800 })
      const policy = yield* Scope.make()
      const critic = yield* Scope.make()
      yield* PeakRss.countParameters(30_000_000, policy)
      yield* PeakRss.countParameters(10_000_000, critic)
      // 1000 MB over 40 M parameters.
      assert.strictEqual(PeakRss.figures(read)["perf/peak_bytes_per_param"], 26.2)
      yield* Scope.close(critic, Exit.void)
      assert.strictEqual(PeakRss.figures(read)["perf/peak_bytes_per_param"], 35)
      yield* Scope.close(policy, Exit.void)
      assert.notProperty(PeakRss.figures(read), "perf/peak_bytes_per_param")
    }))
})
