/**
 * The environment service: one chain's world, reset with its row, acting one command at a time and counting the
 * steps against the row's limit. Everything it does is the engine's (`Engine.ts`) on the world the generator built
 * (`World.generate`); this module holds the episode's state and cuts long answers to the observation budget.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer } from "effect"
import * as Engine from "./Engine.ts"
import type * as Goal from "./Goal.ts"
import * as World from "./World.ts"

// ===== Models =====

/**
 * What an episode starts from: a row's world and its step limit.
 *
 * @category models
 * @since 0.1.0
 */
export interface Episode extends World.Source {
  readonly maxSteps: number
}

/**
 * One step's result: the answer (cut to the budget), the refusal reason if any, the goal's status and the count.
 *
 * @category models
 * @since 0.1.0
 */
export interface Step {
  readonly text: string
  readonly reason: Engine.Reason | undefined
  readonly status: Engine.Status
  readonly steps: number
  readonly outOfSteps: boolean
}

/**
 * The episode so far, as the reward reads it.
 *
 * @category models
 * @since 0.1.0
 */
export interface Snapshot {
  readonly type: Goal.TaskType | undefined
  readonly status: Engine.Status
  readonly steps: number
  readonly maxSteps: number
  /** Commands that did nothing, by reason. */
  readonly refused: Readonly<Partial<Record<Engine.Reason, number>>>
}

/**
 * Cuts an answer to `max` characters, marking the cut.
 *
 * @category getters
 * @since 0.1.0
 */
export const truncate = (text: string, max: number): string =>
  text.length <= max ? text : `${text.slice(0, Math.max(0, max - 4)).trimEnd()} ...`

// ===== Service =====

interface State {
  world: World.World | undefined
  maxSteps: number
  steps: number
  status: Engine.Status
  refused: Partial<Record<Engine.Reason, number>>
}

/**
 * A chain's household (or science) world.
 *
 * @category services
 * @since 0.1.0
 */
export class Household extends Context.Service<Household, {
  /** Builds the row's world; returns what the agent sees first (the room). */
  readonly reset: (episode: Episode) => Effect.Effect<string>
  /** Runs one command (a line of text) and counts it. */
  readonly act: (line: string) => Effect.Effect<Step>
  readonly snapshot: Effect.Effect<Snapshot>
}>()("agentfly/environments/household/Household") {
  /**
   * A fresh world per build (the task provides it per chain), answers cut to `maxObservation` characters.
   *
   * @category layers
   * @since 0.1.0
   */
  static readonly layer = (maxObservation: number): Layer.Layer<Household> =>
    Layer.sync(Household, () => {
      const state: State = { world: undefined, maxSteps: 0, steps: 0, status: "open", refused: {} }
      return Household.of({
        reset: (episode) =>
          Effect.sync(() => {
            state.world = World.generate(episode)
            state.maxSteps = episode.maxSteps
            state.steps = 0
            state.status = Engine.status(state.world)
            state.refused = {}
            return World.describeRoom(state.world)
          }),
        act: (line) => Effect.sync(() => step(state, line, maxObservation)),
        snapshot: Effect.sync(() => ({
          type: state.world?.goal.type,
          status: state.status,
          steps: state.steps,
          maxSteps: state.maxSteps,
          refused: { ...state.refused }
        }))
      })
    })
}

/** One command against the state: before a reset, every command is refused (a wiring bug shows up plainly). */
const step = (state: State, line: string, maxObservation: number): Step => {
  const world = state.world
  if (world === undefined) {
    const text = "Nothing happens: the episode has not started."
    return { text, reason: "NotAllowed", status: "open", steps: 0, outOfSteps: true }
  }
  const outcome = Engine.act(world, line)
  state.steps++
  if (outcome.reason !== undefined) state.refused[outcome.reason] = (state.refused[outcome.reason] ?? 0) + 1
  // A goal, once reached or lost, stays so for the episode (the chain ends there anyway).
  if (state.status === "open") state.status = Engine.status(world)
  return {
    text: truncate(outcome.text, maxObservation),
    reason: outcome.reason,
    status: state.status,
    steps: state.steps,
    outOfSteps: state.status === "open" && state.steps >= state.maxSteps
  }
}
