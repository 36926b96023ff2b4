/**
 * What HTTP rollout workers and the Redis queue share: a batch cut into contiguous shares (each knowing its first
 * row's place in the batch), and the figures a trainer gathers from its workers' answers.
 */
import { assert, describe, it } from "@effect/vitest"
import * as RemoteShares from "../../../actors/internal/remoteShares.ts"
import type * as Dataset from "../../../src/Dataset.ts"

const rowsOf = (n: number): ReadonlyArray<Dataset.Row> =>
  Array.from({ length: n }, (_, i) => ({ index: i, line: i + 1, question: `q${i}`, fields: {} }))

const layout = (shares: ReadonlyArray<RemoteShares.Share>) =>
  shares.map((s) => ({ rowOffset: s.rowOffset, rows: s.rows.map((r) => r.index) }))

describe("remoteShares", () => {
  it("evenShares: one contiguous share per worker, as equal as possible, never more shares than rows", () => {
    assert.deepStrictEqual(layout(RemoteShares.evenShares(rowsOf(5), 2)), [
      { rowOffset: 0, rows: [0, 1] },
      { rowOffset: 2, rows: [2, 3, 4] }
    ])
    assert.deepStrictEqual(layout(RemoteShares.evenShares(rowsOf(2), 3)), [
      { rowOffset: 0, rows: [0] },
      { rowOffset: 1, rows: [1] }
    ])
    // An empty batch is one empty share (its worker answers no groups).
    assert.deepStrictEqual(layout(RemoteShares.evenShares(rowsOf(0), 3)), [{ rowOffset: 0, rows: [] }])
  })

  it("sharesOf: shares of a fixed size, the last one shorter", () => {
    assert.deepStrictEqual(layout(RemoteShares.sharesOf(rowsOf(5), 2)), [
      { rowOffset: 0, rows: [0, 1] },
      { rowOffset: 2, rows: [2, 3] },
      { rowOffset: 4, rows: [4] }
    ])
    assert.deepStrictEqual(layout(RemoteShares.sharesOf(rowsOf(0), 2)), [])
  })

  it("takeFigures: the workers' latest environment figures merged, counts and totals since the last read", () => {
    const gathered = RemoteShares.makeGathered({ shares: 0, failures: 0 })
    const env = (leases: number, waitMs: number) => ({ "env/box/leases": leases, "env/box/wait_p99_ms": waitMs })
    RemoteShares.gather(gathered, "a", { env: env(1, 9), servers: { "servers/requests": 2 } })
    RemoteShares.gather(gathered, "a", { env: env(4, 3), servers: { "servers/requests": 1 } })
    RemoteShares.gather(gathered, "b", { env: env(5, 7) })
    const first = RemoteShares.takeFigures(gathered, { shares: 3, failures: 1 })
    // a's latest (4, 3 ms) with b's (5, 7 ms): counts summed, wait times the largest.
    assert.deepStrictEqual(first, {
      "env/box/leases": 9,
      "env/box/wait_p99_ms": 7,
      "servers/requests": 3,
      "workers/shares": 3,
      "workers/failures": 1
    })
    // Environment figures are snapshots (kept); counts start again from the read.
    const second = RemoteShares.takeFigures(gathered, { shares: 5, failures: 1 })
    assert.deepStrictEqual(second, {
      "env/box/leases": 9,
      "env/box/wait_p99_ms": 7,
      "workers/shares": 2,
      "workers/failures": 0
    })
  })
})
