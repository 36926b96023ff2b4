import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import { spawn } from "node:child_process"
import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Journal from "../../actors/Journal.ts"

const tmp = () => mkdtempSync(join(tmpdir(), "journal-"))
const step = (n: number, seqs: Array<number>): Journal.Entry => ({ kind: "step", step: n, seqs, policyVersion: n })
const ckpt = (n: number, path = `ckpt-${n}`): Journal.Entry => ({ kind: "checkpoint", step: n, path })

describe("Journal", () => {
  it.effect("appends entries that a reopened journal reads back in order", () =>
    Effect.gen(function*() {
      const path = join(tmp(), "journal.jsonl")
      const entries: Array<Journal.Entry> = [
        { kind: "start", fromStep: 0, seed: 1, mode: "sync" },
        { kind: "group", seq: 0, groupId: "g0", rowIndex: 3, policyVersion: 0, meanReward: 0.5 },
        step(1, [0]),
        ckpt(1)
      ]
      yield* Effect.scoped(Effect.gen(function*() {
        const journal = yield* Journal.open(path)
        for (const e of entries) yield* journal.append(e)
      }))
      const replay = yield* Journal.read(path)
      assert.deepStrictEqual(replay.entries.map((e) => e.entry), entries)
      assert.strictEqual(replay.tornBytes, 0)
      assert.strictEqual(replay.entries.at(-1)!.end, readFileSync(path).length)
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a torn last line is cut off on open; appends then continue on a clean line", () =>
    Effect.gen(function*() {
      const path = join(tmp(), "journal.jsonl")
      writeFileSync(path, JSON.stringify(step(1, [0])) + "\n" + `{"kind":"step","step":2,"se`)
      const before = yield* Journal.read(path)
      assert.strictEqual(before.entries.length, 1)
      assert.isTrue(before.tornBytes > 0)
      yield* Effect.scoped(Effect.gen(function*() {
        const journal = yield* Journal.open(path)
        yield* journal.append(step(2, [1]))
        assert.deepStrictEqual(yield* journal.entries, [step(1, [0]), step(2, [1])])
      }))
      assert.deepStrictEqual((yield* Journal.read(path)).entries.map((e) => e.entry), [step(1, [0]), step(2, [1])])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("an invalid line before the end is corruption, not a torn tail", () =>
    Effect.gen(function*() {
      const path = join(tmp(), "journal.jsonl")
      writeFileSync(path, JSON.stringify(step(1, [0])) + "\nnot json\n" + JSON.stringify(step(2, [1])) + "\n")
      const result = yield* Effect.result(Journal.read(path))
      assert.isTrue(Result.isFailure(result) && result.failure.reason._tag === "Corrupt")
      // Where: the line and its byte offset, caught by the reason's tag.
      const at = yield* Journal.read(path).pipe(
        Effect.as(undefined),
        Effect.catchReason("JournalError", "Corrupt", ({ byte, line }) => Effect.succeed({ line, byte }))
      )
      assert.deepStrictEqual(at, { line: 2, byte: JSON.stringify(step(1, [0])).length + 1 })
      // The message names the file, the line and what is wrong with it.
      const group = { kind: "group", seq: 0, groupId: "g", rowIndex: 0, policyVersion: 0, meanReward: null }
      writeFileSync(
        path,
        JSON.stringify(step(1, [0])) + "\n" + JSON.stringify(group) + "\n" + JSON.stringify(step(2, [1])) + "\n"
      )
      const named = yield* Effect.flip(Journal.read(path))
      assert.match(named.message, /journal\.jsonl:2: invalid entry at byte \d+ \(.*meanReward.*\): \{"kind":"group"/)
      // A run that starts over (cut to 0 bytes) does not read it: the damaged file is simply replaced.
      yield* Effect.scoped(Effect.gen(function*() {
        const journal = yield* Journal.open(path, { cutAt: 0 })
        yield* journal.append(step(1, [0]))
      }))
      assert.deepStrictEqual((yield* Journal.read(path)).entries.map((e) => e.entry), [step(1, [0])])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("resume rolls back to the last usable checkpoint: later steps are cut and replayed", () =>
    Effect.gen(function*() {
      const path = join(tmp(), "journal.jsonl")
      yield* Effect.scoped(Effect.gen(function*() {
        const journal = yield* Journal.open(path)
        for (
          const e of [
            { kind: "warmup", steps: 5 } as const,
            step(1, [0, 1]),
            step(2, [2, 3]),
            ckpt(2),
            step(3, [5, 4]),
            ckpt(3, "missing"),
            step(4, [6, 7])
          ]
        ) yield* journal.append(e)
      }))
      const replay = yield* Journal.read(path)
      const point = Journal.resumePoint(replay, (c) => c.path !== "missing")
      assert.strictEqual(point.step, 2)
      assert.strictEqual(point.checkpoint, "ckpt-2")
      assert.deepStrictEqual([...point.consumed].sort(), [0, 1, 2, 3])
      assert.isTrue(point.warmupDone)
      yield* Effect.scoped(Effect.gen(function*() {
        const journal = yield* Journal.open(path, { cutAt: point.cutAt })
        yield* journal.append(step(3, [4, 5]))
      }))
      const steps = (yield* Journal.read(path)).entries.flatMap((e) => (e.entry.kind === "step" ? [e.entry.step] : []))
      assert.deepStrictEqual(steps, [1, 2, 3])
      const none = Journal.resumePoint(replay, () => false)
      assert.deepStrictEqual([none.step, none.cutAt, none.consumed.size, none.warmupDone], [0, 0, 0, false])
    }).pipe(Effect.provide(NodeServices.layer)))

  it.live("survives SIGKILL of a process appending as fast as it can", () =>
    Effect.gen(function*() {
      const dir = tmp()
      const path = join(dir, "journal.jsonl")
      const script = resolve(import.meta.dirname, "fixtures/journalWriter.ts")
      yield* Effect.callback<void>((resume) => {
        const child = spawn(process.execPath, ["--import", "tsx", script, path], {
          cwd: resolve(import.meta.dirname, "../.."),
          stdio: ["ignore", "pipe", "pipe"]
        })
        child.stdout.on("data", (d: Buffer) => {
          if (d.toString().includes("ready")) setTimeout(() => child.kill("SIGKILL"), 50)
        })
        child.stderr.on("data", (d: Buffer) => process.stderr.write(d))
        child.on("exit", () => resume(Effect.void))
      })
      // (`--import tsx` keeps the writer in this one process: the `tsx` binary would fork a child that outlives
      // the SIGKILL.) Simulate the worst case as well: a partial line left by the killed writer.
      appendFileSync(path, `{"kind":"step","step":99999,"seqs":[1,2`)
      const replay = yield* Journal.read(path)
      const steps = replay.entries.map((e) => (e.entry.kind === "step" ? e.entry.step : -1))
      assert.isTrue(steps.length >= 20)
      assert.deepStrictEqual(steps, steps.map((_, i) => i + 1), "every appended step, in order, once")
      assert.isTrue(replay.tornBytes > 0)
      yield* Effect.scoped(Journal.open(path))
      assert.strictEqual((yield* Journal.read(path)).tornBytes, 0)
    }).pipe(Effect.provide(NodeServices.layer)), 300_000)
})
