import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as RunError from "../../actors/RunError.ts"
import * as DiskFull from "../../src/internal/diskFull.ts"

describe("RunError", () => {
  it.effect("a reason is a class: Effect.catchReason handles one, its message is the error's", () =>
    Effect.gen(function*() {
      const failing = Effect.fail(RunError.runError("Resume", "run started with another config"))
      const caught = yield* failing.pipe(
        Effect.catchReason("RunError", "Resume", (reason) => Effect.succeed(`caught: ${reason.message}`))
      )
      assert.strictEqual(caught, "caught: run started with another config")
      const other = yield* Effect.flip(
        Effect.fail(RunError.runError("Workers", "no worker")).pipe(
          Effect.catchReason("RunError", "Resume", () => Effect.succeed("wrong"))
        )
      )
      assert.strictEqual(other.reason._tag, "Workers")
      assert.strictEqual(other.message, "no worker")
    }))

  it("wrap keeps the cause, passes a RunError through, and makes a full disk DiskFull with what to do", () => {
    const cause = new Error("EACCES: permission denied")
    const wrapped = RunError.wrap("Journal")(cause)
    assert.strictEqual(wrapped.reason._tag, "Journal")
    assert.strictEqual(wrapped.message, "EACCES: permission denied")
    assert.strictEqual(wrapped.reason.cause, cause)
    assert.strictEqual(RunError.wrap("Learner")(wrapped), wrapped, "already a RunError")
    const full = RunError.wrap("Checkpoint")(
      Object.assign(new Error("ENOSPC: no space left on device"), { code: "ENOSPC" })
    )
    assert.strictEqual(full.reason._tag, "DiskFull")
    assert.isTrue(full.message.startsWith(DiskFull.marker), full.message)
    assert.include(full.message, "free space on its filesystem, then resume")
  })

  it("round-trips through its Schema (as it would cross a process boundary), reason and message intact", () => {
    const error = RunError.runError("Failures", "step 3: 4 of 4 trajectories failed with EnvFailed")
    const codec = Schema.toCodecJson(RunError.RunError)
    const decoded = Schema.decodeUnknownSync(codec)(Schema.encodeUnknownSync(codec)(error))
    assert.strictEqual(decoded.reason._tag, "Failures")
    assert.strictEqual(decoded.message, error.message)
  })
})
