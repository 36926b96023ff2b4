/**
 * The server's fair scheduler without the server: places in the batch go to the lanes (requests) with a waiting
 * sequence in turn, never more than the capacity at once; a sequence interrupted while it waits gives its turn up,
 * and one interrupted after its place was granted gives the place back.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import * as Fair from "../../../actors/internal/fairScheduler.ts"

/** Lets every forked fiber run as far as it can. */
const settle = Effect.forEach([1, 2, 3, 4], () => Effect.yieldNow, { discard: true })

describe("fairScheduler", () => {
  it.effect("places go to the waiting lanes in turn, at most `capacity` at once", () =>
    Effect.gen(function*() {
      const slots = Fair.makeSlots(2)
      const big = Fair.makeLane(), small = Fair.makeLane()
      const started: Array<string> = []
      const gates = new Map<string, Deferred.Deferred<void>>()
      const sequence = (lane: Fair.Lane, name: string) => {
        const gate = Deferred.makeUnsafe<void>()
        gates.set(name, gate)
        return Fair.withSlot(slots, lane, Effect.andThen(Effect.sync(() => started.push(name)), Deferred.await(gate)))
      }
      const fibers: Array<Fiber.Fiber<void>> = []
      for (const n of ["b1", "b2", "b3", "b4"]) fibers.push(yield* Effect.forkChild(sequence(big, n)))
      for (const n of ["s1", "s2"]) fibers.push(yield* Effect.forkChild(sequence(small, n)))
      const release = (name: string) =>
        Effect.andThen(Deferred.succeed(gates.get(name)!, undefined), settle)
      yield* settle
      // The big request came first and took both places; its next sequences wait, its lane in turn before the small.
      assert.deepStrictEqual(started, ["b1", "b2"])
      assert.strictEqual(slots.running, 2)
      yield* release("b1")
      assert.deepStrictEqual(started, ["b1", "b2", "b3"])
      // The big lane went to the back of the turns: the next place is the small request's, not b4's.
      yield* release("b2")
      assert.deepStrictEqual(started, ["b1", "b2", "b3", "s1"])
      yield* release("b3")
      assert.deepStrictEqual(started, ["b1", "b2", "b3", "s1", "b4"])
      for (const gate of gates.values()) yield* Deferred.succeed(gate, undefined)
      for (const fiber of fibers) yield* Fiber.join(fiber)
      assert.deepStrictEqual(started, ["b1", "b2", "b3", "s1", "b4", "s2"])
      assert.deepStrictEqual([slots.running, slots.turns.length], [0, 0])
    }))

  it.effect("a waiting sequence interrupted gives its turn up; a running one interrupted gives its place back", () =>
    Effect.gen(function*() {
      const slots = Fair.makeSlots(1)
      const lane = Fair.makeLane(), other = Fair.makeLane()
      const hold = Deferred.makeUnsafe<void>()
      const running = yield* Effect.forkChild(Fair.withSlot(slots, lane, Deferred.await(hold)))
      const waiting = yield* Effect.forkChild(Fair.withSlot(slots, other, Effect.void))
      yield* settle
      assert.deepStrictEqual([slots.running, slots.turns.length, other.waiting.length], [1, 1, 1])
      yield* Fiber.interrupt(waiting)
      assert.deepStrictEqual([slots.running, slots.turns.length, other.waiting.length, other.queued], [1, 0, 0, false])
      yield* Fiber.interrupt(running)
      assert.strictEqual(slots.running, 0)
      // The place is free again: the next sequence runs at once.
      assert.strictEqual(yield* Fair.withSlot(slots, other, Effect.succeed("ran")), "ran")
    }))
})
