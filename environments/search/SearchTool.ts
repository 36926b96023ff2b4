/**
 * The `search` tool: the top passages of a query from the chain's search session (`SearchSession`), as one short
 * observation. The agent finishes with the `answer` tool (`environments/answer/Answer.ts`).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { EnvError } from "../../src/Environment.ts"
import { Tool } from "../../src/index.ts"
import { SearchSession } from "./SearchSession.ts"

/**
 * The tool, with `k` allowed from 1 to `maxK` (a `k` out of range is an invalid-arguments observation).
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (maxK: number) =>
  Tool.make("search", {
    description: "Search the passages; returns the top k of them.",
    parameters: Schema.Struct({
      query: Schema.String.annotate({ description: "Words to look for, e.g. a name" }),
      k: Schema.optionalKey(
        Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: maxK })).annotate({ description: "How many passages" })
      )
    }),
    success: Schema.String,
    failure: EnvError,
    dependencies: [SearchSession],
    handler: ({ query, k }) => Effect.flatMap(SearchSession, (session) => session.search(query, k))
  })

/**
 * The tool with `k` up to 5.
 *
 * @category constructors
 * @since 0.1.0
 */
export const search = make(5)
