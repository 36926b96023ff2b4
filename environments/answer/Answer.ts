/**
 * The `answer` tool: the agent's way to finish. A successful call ends the chain (`terminal`), and its
 * observation — the answer itself — is the trajectory's final response, which rewards score.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { Tool } from "../../src/index.ts"

/**
 * Makes a finishing tool under another name or description (AgentFly's `answer_math`, `answer_qa`).
 * Numbers are accepted and printed as text, since models often write `{"answer": 42}`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <const Name extends string>(name: Name, description: string) =>
  Tool.make(name, {
    description,
    parameters: Schema.Struct({
      answer: Schema.Union([Schema.String, Schema.Finite]).annotate({ description: "The final answer" })
    }),
    success: Schema.String,
    terminal: true,
    handler: ({ answer }) => Effect.succeed(String(answer).trim())
  })

/**
 * The `answer` tool.
 *
 * @category constructors
 * @since 0.1.0
 */
export const answer = make("answer", "Give your final answer. This ends the episode.")
