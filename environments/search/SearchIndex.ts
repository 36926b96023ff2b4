/**
 * The BM25 index of a corpus (`minisearch`): built once per run from the passages, then shared read-only by every
 * chain. Titles count twice as much as text, so that a search for a name ranks the passages about it above those
 * that only mention it.
 *
 * @since 0.1.0
 */
import { Context, Effect, Layer } from "effect"
import MiniSearch from "minisearch"
import type * as Corpus from "./Corpus.ts"

// ===== Models =====

/**
 * The index: its number of passages, and the top `k` passages of a query, best first (none when no word of the
 * query occurs in the corpus).
 *
 * @category services
 * @since 0.1.0
 */
export class SearchIndex extends Context.Service<SearchIndex, {
  readonly size: number
  readonly search: (query: string, k: number) => ReadonlyArray<Corpus.Passage>
}>()("agentfly/environments/search/SearchIndex") {}

// ===== Constructors =====

/** The weight of a title match relative to a text match. */
const titleBoost = 2

/**
 * Indexes passages (synchronously: about a second per 100,000 short passages).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (passages: ReadonlyArray<Corpus.Passage>): SearchIndex["Service"] => {
  const index = new MiniSearch<{ readonly id: number; readonly title: string; readonly text: string }>({
    fields: ["title", "text"],
    storeFields: [],
    searchOptions: { boost: { title: titleBoost } }
  })
  index.addAll(passages.map((p, id) => ({ id, title: p.title ?? "", text: p.text })))
  return SearchIndex.of({
    size: passages.length,
    search: (query, k) => index.search(query).slice(0, k).map((hit) => passages[hit.id as number]!)
  })
}

/**
 * The index of the passages an effect produces (a generated world, a corpus file), built when the layer is.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = <E, R>(
  passages: Effect.Effect<ReadonlyArray<Corpus.Passage>, E, R>
): Layer.Layer<SearchIndex, E, R> => Layer.effect(SearchIndex, Effect.map(passages, make))
