/**
 * A chain's search session: the run's shared index seen through a per-chain budget of searches, and the rendering
 * of results as one short observation. Each chain gets its own session (its searches and queries); the index
 * behind it is the run's.
 *
 * An observation lists the top passages, best first, one per line, each cut to `passageChars` and all of them to
 * `observationChars` (`...` marks a cut):
 *
 * ```text
 * Kavo Meli was born in Tobar.
 * Kavo Meli works as a baker.
 * Dilumo was founded by Kavo Meli.
 * ```
 *
 * A query with no word in it, a `k` out of range and a search past the budget fail with
 * `EnvError(InvalidAction)`, which the model reads as the tool's observation.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer, Ref } from "effect"
import { EnvError, envError } from "../../src/Environment.ts"
import type * as Corpus from "./Corpus.ts"
import { SearchIndex } from "./SearchIndex.ts"

// ===== Models =====

/**
 * How searches are answered.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  /** Results of a search that does not say how many. */
  readonly k: number
  /** The most results a search may ask for. */
  readonly maxK: number
  /** Searches per episode. */
  readonly maxSearches: number
  /** The most characters of one passage in an observation. */
  readonly passageChars: number
  /** The most characters of a whole observation. */
  readonly observationChars: number
}

/**
 * The defaults: 2 results (at most 5), 4 searches per episode, passages cut at 120 characters and observations at
 * 400. Two results hold every fact a generated question needs (a name's own passages rank first: their titles
 * match) and keep a two-hop episode inside the tiny policy's 512 positions; a larger model may ask for more.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaults: Options = { k: 2, maxK: 5, maxSearches: 4, passageChars: 120, observationChars: 400 }

/**
 * What a session has done: the searches it ran, their queries in order.
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  readonly queries: ReadonlyArray<string>
}

/**
 * A chain's session.
 *
 * @category services
 * @since 0.1.0
 */
export class SearchSession extends Context.Service<SearchSession, {
  /** The observation of a search (the top `k`, default `options.k`), counted against the budget. */
  readonly search: (query: string, k?: number | undefined) => Effect.Effect<string, EnvError>
  readonly state: Effect.Effect<State>
}>()("agentfly/environments/search/SearchSession") {}

// ===== Rendering =====

const cut = (
  text: string,
  max: number
): string => (text.length <= max ? text : `${text.slice(0, Math.max(0, max - 3))}...`)

/** A passage as shown: its text, after its title when the text does not begin with it. */
const shown = (passage: Corpus.Passage): string =>
  passage.title === undefined || passage.title === "" || passage.text.startsWith(passage.title)
    ? passage.text
    : `${passage.title}: ${passage.text}`

/**
 * The observation of a search's results: one line per passage, best first, each cut to `passageChars`, the whole
 * to `observationChars`; `No results.` when there are none.
 *
 * @category getters
 * @since 0.1.0
 */
export const render = (
  hits: ReadonlyArray<Corpus.Passage>,
  options: Pick<Options, "passageChars" | "observationChars">
): string => {
  if (hits.length === 0) return "No results."
  const lines = hits.map((p) => cut(shown(p).replace(/\s+/g, " "), options.passageChars))
  return cut(lines.join("\n"), options.observationChars)
}

// ===== Constructors =====

const invalid = (message: string) => envError("search", "search", "InvalidAction", message)

/**
 * A session over an index.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (
  index: SearchIndex["Service"],
  options: Options = defaults
): Effect.Effect<SearchSession["Service"]> =>
  Effect.map(Ref.make<State>({ queries: [] }), (state) =>
    SearchSession.of({
      search: (query, k) =>
        Effect.flatMap(Ref.get(state), (s) => {
          const q = query.trim()
          if (!/[\p{L}\p{N}]/u.test(q)) return Effect.fail(invalid("empty query: search for a name"))
          const top = k ?? options.k
          if (!Number.isInteger(top) || top < 1 || top > options.maxK) {
            return Effect.fail(invalid(`k must be a whole number from 1 to ${options.maxK}`))
          }
          if (s.queries.length >= options.maxSearches) {
            return Effect.fail(invalid(`no searches left (${options.maxSearches} per episode): answer now`))
          }
          return Effect.as(Ref.set(state, { queries: [...s.queries, q] }), render(index.search(q, top), options))
        }),
      state: Ref.get(state)
    }))

/**
 * Each chain's session, over the `SearchIndex` in context (the run's).
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (options: Options = defaults): Layer.Layer<SearchSession, never, SearchIndex> =>
  Layer.effect(SearchSession, Effect.flatMap(SearchIndex, (index) => make(index, options)))
