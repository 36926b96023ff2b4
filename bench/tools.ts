/**
 * `npm run bench -- tools`
 *
 * Overhead of the tool actor per call, against calling the handler directly in the same run. The tool is a no-op
 * (`{ text } → text`), so the figures are the actor's own cost: argument decoding with the parameter Schema, the
 * clock reads for latency, the exit classification, result encoding and rendering, the truncation check, the
 * tool message and the metrics.
 *
 * - `direct`: `yield* tool.handler(params)` in a loop.
 * - `execute`: `actor.execute(call)` in a loop (one call per turn, the common case).
 * - `executeTurn×8`: turns of 8 calls run concurrently (one fiber per call), per call.
 * - `execute+policies`: the same no-op tool with a timeout, a concurrency limit and a retry policy.
 *
 * Headline: `execute` time per call / (2 × direct + 20 µs), the allowance; target ≤ 1.
 * Each figure is the median of 7 alternating rounds of N calls, in CPU time per call (the minimum is reported
 * too).
 */
import { Effect, Schema } from "effect"
import { loadavg } from "node:os"
import * as ToolActor from "../actors/ToolActor.ts"
import { Tool } from "../src/index.ts"

const N = 20_000
const ROUNDS = 7

const Noop = Tool.make("noop", {
  description: "Returns its input",
  parameters: Schema.Struct({ text: Schema.String }),
  handler: ({ text }) => Effect.succeed(text)
})

const Guarded = Tool.make("guarded", {
  description: "Returns its input, under a timeout, a concurrency limit and retries",
  parameters: Schema.Struct({ text: Schema.String }),
  timeout: "10 seconds",
  concurrency: 64,
  retry: { times: 2 },
  handler: ({ text }) => Effect.succeed(text)
})

const call = (name: string, i: number) => ({
  id: `call_${i}`,
  type: "function" as const,
  function: { name, arguments: { text: "hello" } }
})

const median = (xs: ReadonlyArray<number>): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

/**
 * Microseconds of CPU time per call of `body` run `n` times in one fiber. CPU time (`process.cpuUsage`), not wall
 * time: on a shared 2-core machine a process is often descheduled, and wall time then measures the neighbours.
 */
const time = <E>(n: number, body: (i: number) => Effect.Effect<unknown, E>) =>
  Effect.gen(function*() {
    const start = process.cpuUsage()
    for (let i = 0; i < n; i++) yield* body(i)
    const used = process.cpuUsage(start)
    return (used.user + used.system) / n
  })

export default async () => {
  const program = Effect.gen(function*() {
    const actor = yield* ToolActor.make([Noop, Guarded])
    const calls = Array.from({ length: N }, (_, i) => call("noop", i))
    const guardedCalls = Array.from({ length: N }, (_, i) => call("guarded", i))
    const turns = Array.from({ length: N / 8 }, (_, t) => calls.slice(t * 8, t * 8 + 8))
    const params = { text: "hello" }
    const ctx = { toolCallId: "call_0" }
    const samples = {
      direct: [] as Array<number>,
      execute: [] as Array<number>,
      turn8: [] as Array<number>,
      policies: [] as Array<number>
    }
    // warm-up
    yield* time(2000, () => Noop.handler(params, ctx))
    yield* time(2000, (i) => actor.execute(calls[i]!))
    for (let r = 0; r < ROUNDS; r++) {
      samples.direct.push(yield* time(N, () => Noop.handler(params, ctx)))
      samples.execute.push(yield* time(N, (i) => actor.execute(calls[i]!)))
      samples.turn8.push((yield* time(N / 8, (t) => actor.executeTurn(turns[t]!))) / 8)
      samples.policies.push(yield* time(N, (i) => actor.execute(guardedCalls[i]!)))
    }
    const metrics = yield* actor.metrics
    return { samples, errors: metrics["tool/noop/errors"]! + metrics["tool/guarded/errors"]! }
  })
  const { samples, errors } = await Effect.runPromise(program)
  if (errors !== 0) throw new Error(`the no-op tool failed ${errors} times`)
  const direct = median(samples.direct)
  const execute = median(samples.execute)
  const turn8 = median(samples.turn8)
  const policies = median(samples.policies)
  const allowance = 2 * direct + 20
  return {
    headline: {
      metric: "execute µs per call / (2 × direct + 20 µs)",
      value: execute / allowance,
      target: 1,
      better: "lower"
    },
    callsPerRound: N,
    rounds: ROUNDS,
    directUsPerCall: direct,
    executeUsPerCall: execute,
    executeTurn8UsPerCall: turn8,
    executeWithPoliciesUsPerCall: policies,
    executeMinUsPerCall: Math.min(...samples.execute),
    directMinUsPerCall: Math.min(...samples.direct),
    loadAverage: loadavg()[0],
    executeOverDirect: execute / direct,
    executeOverheadUs: execute - direct,
    allowanceUs: allowance,
    samples
  }
}
