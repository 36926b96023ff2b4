/**
 * The `python` tool: runs code in the chain's Python sandbox (`PythonSandbox`), whose variables persist from
 * call to call. Failures the model should see (a time limit, an interpreter killed for memory, an unavailable
 * sandbox) are returned as observations; a crashed sandbox is retried once on the fresh instance the resource
 * manager starts in its place.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import { EnvError } from "../../src/Environment.ts"
import { Tool } from "../../src/index.ts"
import { observation, PythonError, PythonSandbox } from "./PythonSandbox.ts"

/**
 * The tool. Provide `PythonSandbox` per chain with `PythonSandbox.provider`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const python = Tool.make("python", {
  description: "Run Python 3 code in a sandbox and return its output. Variables, functions and files persist " +
    "between calls in this episode; the value of a final expression is printed. No network access; each call " +
    "has a time limit.",
  parameters: Schema.Struct({
    code: Schema.String.annotate({ description: "Python source code to execute" })
  }),
  success: Schema.String,
  failure: Schema.Union([PythonError, EnvError]),
  dependencies: [PythonSandbox],
  // A crashed sandbox (`EnvError(Crashed)`, retryable) is replaced by the manager; one retry runs the call there.
  retry: { times: 1 },
  handler: ({ code }) => Effect.flatMap(PythonSandbox, (sandbox) => Effect.map(sandbox.run(code), observation))
})
