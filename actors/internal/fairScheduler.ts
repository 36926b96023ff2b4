/**
 * The OpenAI-compatible server's fair scheduler (`OpenAiServer.ts`, "Fair scheduling"): the places in the engine's
 * batch ({@link Slots}) go to the requests ({@link Lane}s) with a waiting sequence in turn, so that a request of
 * thousands of prompts holds a few places and a small one beside it starts at the next step. Every step is a
 * synchronous change of plain state (fibers are cooperative, so a step is atomic).
 *
 * @since 0.1.0
 */
import { Deferred, Effect } from "effect"

/**
 * One request's sequences waiting for a place in the batch.
 *
 * @category models
 * @since 0.1.0
 */
export interface Lane {
  readonly waiting: Array<Deferred.Deferred<void>>
  /** In `Slots.turns`. */
  queued: boolean
}

/**
 * The places in the engine's batch, given to the requests with a waiting sequence in turn.
 *
 * @category models
 * @since 0.1.0
 */
export interface Slots {
  readonly capacity: number
  running: number
  readonly turns: Array<Lane>
}

/**
 * Free slots for `capacity` sequences at once (at least one).
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeSlots = (capacity: number): Slots => ({ capacity: Math.max(1, capacity), running: 0, turns: [] })

/**
 * A request's lane, with nothing waiting.
 *
 * @category constructors
 * @since 0.1.0
 */
export const makeLane = (): Lane => ({ waiting: [], queued: false })

const grant = (slots: Slots): void => {
  while (slots.running < slots.capacity && slots.turns.length > 0) {
    const lane = slots.turns.shift()!
    const next = lane.waiting.shift()!
    if (lane.waiting.length > 0) slots.turns.push(lane)
    else lane.queued = false
    slots.running++
    Deferred.doneUnsafe(next, Effect.void)
  }
}

const leave = (slots: Slots): void => {
  slots.running--
  grant(slots)
}

/**
 * Runs `effect` (one sequence) once its lane's turn comes and the batch has a free place, and frees the place when
 * it ends. A sequence interrupted while it waits gives its turn up (or its place, if it was granted meanwhile).
 *
 * @category combinators
 * @since 0.1.0
 */
export const withSlot = <A, E, R>(slots: Slots, lane: Lane, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.uninterruptibleMask((restore) => {
    const turn = Deferred.makeUnsafe<void>()
    lane.waiting.push(turn)
    if (!lane.queued) {
      lane.queued = true
      slots.turns.push(lane)
    }
    grant(slots)
    const giveUp = Effect.sync(() => {
      if (Deferred.isDoneUnsafe(turn)) return leave(slots)
      lane.waiting.splice(lane.waiting.indexOf(turn), 1)
      if (lane.waiting.length === 0 && lane.queued) {
        lane.queued = false
        slots.turns.splice(slots.turns.indexOf(lane), 1)
      }
    })
    return restore(Deferred.await(turn)).pipe(
      Effect.onInterrupt(() => giveUp),
      Effect.andThen(Effect.ensuring(restore(effect), Effect.sync(() => leave(slots))))
    )
  })
