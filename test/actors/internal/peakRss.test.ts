import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
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
})
