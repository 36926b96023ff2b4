/**
 * What HTTP rollout workers and the Redis queue share: a batch cut into contiguous shares (each knowing its first
 * row's place in the batch), the figures a trainer gathers from its workers' answers, a run's id as trainer and
 * workers compute it, and the HMAC that binds an answer to its run and share.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as RemoteShares from "../../../actors/internal/remoteShares.ts"
import type * as Dataset from "../../../src/Dataset.ts"
import * as TrainConfig from "../../../src/TrainConfig.ts"

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

  it.effect("runIdOf: the same on machines that keep the config elsewhere; another output name, seed or servers, another run", () =>
    Effect.gen(function*() {
      const config = (over: Record<string, unknown>) =>
        TrainConfig.decode({
          output: "/home/a/runs/x",
          model: { path: "/m" },
          data: { train: "t.jsonl" },
          algorithm: { steps: 1 },
          engine: { servers: ["http://10.0.0.2:8000/v1"] },
          ...over
        })
      const id = RemoteShares.runIdOf("calculator", yield* config({}))
      assert.strictEqual(RemoteShares.runIdOf("calculator", yield* config({ output: "/srv/other/runs/x" })), id)
      for (
        const other of [
          { output: "/home/a/runs/y" },
          { seed: 12 },
          { engine: { servers: ["http://10.0.0.3:8000/v1"] } },
          { agent: { numChains: 2 } }
        ]
      ) assert.notStrictEqual(RemoteShares.runIdOf("calculator", yield* config(other)), id, JSON.stringify(other))
      assert.notStrictEqual(RemoteShares.runIdOf("guess", yield* config({})), id)
    }))

  it("resultMac: binds the token, the run, the share and every part of the answer", () => {
    const answer = { groups: [{ rowIndex: 0, reward: 0 }], env: { "env/x": 1 }, servers: { "servers/requests": 2 } }
    const mac = RemoteShares.resultMac("t", "run1", "s1", answer)
    assert.match(mac, /^[0-9a-f]{64}$/)
    assert.isTrue(RemoteShares.macOk("t", "run1", "s1", JSON.parse(JSON.stringify(answer)), mac))
    for (
      const [token, run, share, changed] of [
        ["u", "run1", "s1", answer],
        ["t", "run2", "s1", answer],
        ["t", "run1", "s2", answer],
        ["t", "run1", "s1", { ...answer, groups: [{ rowIndex: 0, reward: 1 }] }],
        ["t", "run1", "s1", { ...answer, env: { "env/x": 2 } }],
        ["t", "run1", "s1", { ...answer, error: "failed" }]
      ] as const
    ) assert.isFalse(RemoteShares.macOk("t", run, share, changed, RemoteShares.resultMac(token, "run1", "s1", answer)))
    // Nothing, or not a digest, is refused; without a token there is nothing to check.
    for (const bad of [undefined, "", "zz", mac.slice(0, 62), 42]) {
      assert.isFalse(RemoteShares.macOk("t", "run1", "s1", answer, bad))
    }
    assert.isTrue(RemoteShares.macOk(undefined, "run1", "s1", answer, undefined))
    assert.deepStrictEqual(RemoteShares.signed(undefined, "run1", "s1", answer), answer)
    assert.strictEqual((RemoteShares.signed("t", "run1", "s1", answer) as { mac?: string }).mac, mac)
  })
})
