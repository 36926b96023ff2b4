/**
 * A run's OpenTelemetry export (`actors/Telemetry.ts`), checked against an OTLP/HTTP receiver started here on
 * loopback: what arrives is decoded (JSON serialization) and its span tree read back — names, parent links,
 * attributes, and a failed tool call marked as an error — with the run's figures as metrics beside it.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Effect, Layer, Schema } from "effect"
import { mkdtempSync, readFileSync } from "node:fs"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Oracle from "../../actors/Oracle.ts"
import * as Resume from "../../actors/Resume.ts"
import * as Telemetry from "../../actors/Telemetry.ts"
import * as ToolActor from "../../actors/ToolActor.ts"
import * as Train from "../../actors/Train.ts"
import * as Generate from "../../examples/guess/generate.ts"
import { task } from "../../examples/guess/task.ts"
import { Tool } from "../../src/index.ts"

// ===== An OTLP/HTTP receiver =====

interface Received {
  readonly path: string
  readonly contentType: string
  readonly body: Buffer
}

/** An OTLP/HTTP receiver on 127.0.0.1 (a free port): keeps every request, answers 200 `{}` as a collector does. */
const receiver = Effect.acquireRelease(
  Effect.callback<{ readonly url: string; readonly received: Array<Received>; readonly server: Http.Server }>(
    (resume) => {
      const received: Array<Received> = []
      const server = Http.createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          received.push({
            path: req.url ?? "",
            contentType: String(req.headers["content-type"] ?? ""),
            body: Buffer.concat(chunks)
          })
          res.writeHead(200, { "content-type": "application/json" }).end("{}")
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({ url: `http://127.0.0.1:${port}`, received, server }))
      })
    }
  ),
  ({ server }) => Effect.callback<void>((resume) => void server.close(() => resume(Effect.void)))
)

/** OTLP JSON's attribute values (`AnyValue`), decoded to plain values. */
interface AnyValue {
  readonly stringValue?: string
  readonly intValue?: string | number
  readonly doubleValue?: number
  readonly boolValue?: boolean
}
interface Span {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly name: string
  readonly attributes: ReadonlyArray<{ readonly key: string; readonly value: AnyValue }>
  readonly status: { readonly code: number; readonly message?: string }
}

const valueOf = (v: AnyValue): unknown =>
  v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : undefined) ?? v.doubleValue ?? v.boolValue

const attributes = (span: Span): Record<string, unknown> =>
  Object.fromEntries(span.attributes.map((a) => [a.key, valueOf(a.value)]))

const TraceData = Schema.fromJsonString(Schema.Struct({
  resourceSpans: Schema.Array(Schema.Struct({
    resource: Schema.Unknown,
    scopeSpans: Schema.Array(Schema.Struct({ spans: Schema.Array(Schema.Unknown) }))
  }))
}))

/** Every span received at `/v1/traces`, decoded. */
const spansOf = (received: ReadonlyArray<Received>): Array<Span> =>
  received.filter((r) => r.path === "/v1/traces").flatMap((r) => {
    assert.include(r.contentType, "application/json")
    const data = Schema.decodeUnknownSync(TraceData)(r.body.toString("utf8"))
    return data.resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans as ReadonlyArray<Span>))
  })

/** Every metric name received at `/v1/metrics`. */
const metricNames = (received: ReadonlyArray<Received>): Set<string> =>
  new Set(received.filter((r) => r.path === "/v1/metrics").flatMap((r) => {
    const data = JSON.parse(r.body.toString("utf8")) as {
      resourceMetrics: Array<{ scopeMetrics: Array<{ metrics: Array<{ name: string }> }> }>
    }
    return data.resourceMetrics.flatMap((rm) => rm.scopeMetrics.flatMap((sm) => sm.metrics.map((m) => m.name)))
  }))

const StatusError = 2

// ===== Tests =====

class NotFound extends Schema.TaggedError<NotFound>()("NotFound", { message: Schema.String }) {}

const Lookup = Tool.make("lookup", {
  description: "Look up a key",
  parameters: Schema.Struct({ key: Schema.String }),
  failure: NotFound,
  handler: ({ key }) =>
    key === "a" ? Effect.succeed("apple") : Effect.fail(new NotFound({ message: `no entry for "${key}"` }))
})

describe("Telemetry", () => {
  it("settings: the config's section over the standard environment variables; off unless one names a collector", () => {
    assert.isUndefined(Telemetry.resolve(undefined, {}))
    assert.deepStrictEqual(Telemetry.resolve(undefined, { OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/" }), {
      endpoint: "http://collector:4318",
      protocol: "http/protobuf",
      serviceName: "agentfly",
      exportIntervalMs: 5000
    })
    const env = {
      OTEL_EXPORTER_OTLP_ENDPOINT: "http://a:4318",
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_SERVICE_NAME: "svc"
    }
    assert.deepStrictEqual(Telemetry.resolve({ endpoint: "http://b:4318", exportIntervalMs: 50 }, env), {
      endpoint: "http://b:4318",
      protocol: "http/json",
      serviceName: "svc",
      exportIntervalMs: 50
    })
    assert.isUndefined(Telemetry.resolve({ enabled: false }, env))
    assert.isUndefined(Telemetry.resolve(undefined, { ...env, OTEL_SDK_DISABLED: "true" }))
    // gRPC is not spoken here: the HTTP default instead.
    assert.strictEqual(
      Telemetry.resolve(undefined, { ...env, OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" })?.protocol,
      "http/protobuf"
    )
  })

  it.effect("settings reads the variables from the process's environment (Effect's ConfigProvider)", () =>
    Effect.gen(function*() {
      const env = { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318", OTEL_SERVICE_NAME: "from-env" }
      const read = yield* Telemetry.settings(undefined).pipe(
        Effect.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord(env)))
      )
      assert.strictEqual(read?.endpoint, "http://127.0.0.1:4318")
      assert.strictEqual(read?.serviceName, "from-env")
      const none = yield* Telemetry.settings(undefined).pipe(
        Effect.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({})))
      )
      assert.isUndefined(none)
    }))

  it.live("a failed tool call is a span with status ERROR and its reason, under the span that made the call", () =>
    Effect.gen(function*() {
      const { url, received } = yield* receiver
      const settings = { endpoint: url, protocol: "http/json" as const, serviceName: "t", exportIntervalMs: 50 }
      yield* Effect.scoped(
        Effect.gen(function*() {
          const actor = yield* ToolActor.make([Lookup])
          const turn = yield* actor.executeTurn([
            { id: "c1", type: "function", function: { name: "lookup", arguments: { key: "a" } } },
            { id: "c2", type: "function", function: { name: "lookup", arguments: { key: "z" } } }
          ])
          // The run goes on: the failure is the model's observation.
          assert.strictEqual(turn.errors, 1)
        }).pipe(Effect.withSpan("turn"), Effect.provide(Layer.fresh(Telemetry.layer(settings))))
      )
      const spans = spansOf(received)
      const parent = spans.find((s) => s.name === "turn")!
      const calls = spans.filter((s) => s.name === "ToolActor.call")
      assert.strictEqual(calls.length, 2, spans.map((s) => s.name).join(", "))
      for (const c of calls) {
        assert.strictEqual(c.parentSpanId, parent.spanId)
        assert.strictEqual(c.traceId, parent.traceId)
        assert.strictEqual(attributes(c)["tool.name"], "lookup")
      }
      const ok = calls.find((c) => c.status.code !== StatusError)!
      const failed = calls.find((c) => c.status.code === StatusError)
      assert.isDefined(failed, "the failed call is marked as an error")
      assert.strictEqual(attributes(failed!)["error.type"], "HandlerFailure")
      assert.include(failed!.status.message ?? "", `no entry for "z"`)
      assert.strictEqual(attributes(ok)["tool.attempts"], 1)
      assert.notStrictEqual(parent.status.code, StatusError, "the turn itself did not fail")
    }))

  it.live("through the rollout runtime: a refused tool call is an ERROR span under its turn, under its chain", () =>
    Effect.gen(function*() {
      const { url, received } = yield* receiver
      const settings = { endpoint: url, protocol: "http/json" as const, serviceName: "t", exportIntervalMs: 50 }
      // The first turn guesses a word where a number belongs (refused by the tool's Schema), the next ones give up.
      const policy: Oracle.Policy = (messages) =>
        messages.some((m) => m.role === "assistant")
          ? { content: "I give up" }
          : { toolCalls: [Oracle.call(messages, "guess", { n: "seven" })] }
      const played = yield* Oracle.rollout({ task, rows: [{ question: "Find my number.", secret: 7 }], policy }).pipe(
        Effect.withSpan("oracle"),
        Effect.provide(Layer.fresh(Telemetry.layer(settings)))
      )
      assert.strictEqual(played.length, 1)
      const spans = spansOf(received)
      const byId = new Map(spans.map((s) => [s.spanId, s]))
      const parentOf = (s: Span) => byId.get(s.parentSpanId ?? "")
      const call = spans.find((s) => s.name === "ToolActor.call")
      assert.isDefined(call, spans.map((s) => s.name).join(", "))
      assert.strictEqual(call!.status.code, StatusError)
      assert.strictEqual(attributes(call!)["error.type"], "DecodeError")
      assert.strictEqual(attributes(call!)["tool.name"], "guess")
      const turn = parentOf(call!)!
      assert.strictEqual(turn.name, "RolloutChain.turn")
      assert.strictEqual(attributes(turn)["turn.index"], 1)
      const chain = parentOf(turn)!
      assert.strictEqual(chain.name, "RolloutChain.run")
      assert.strictEqual(parentOf(chain)?.name, "oracle")
      // The model read the refusal and the chain went on: the chain itself did not fail.
      assert.notStrictEqual(chain.status.code, StatusError)
      // Turns that sampled (the last span of a chain at its turn limit only finds it reached).
      const turns = spans.filter((s) =>
        s.name === "RolloutChain.turn" && s.parentSpanId === chain.spanId && attributes(s)["turn.sampled"] === true
      )
      assert.strictEqual(attributes(chain)["chain.turns"], turns.length)
      assert.isAbove(turns.length, 1)
    }))

  it.live(
    "a run exports one trace: run → step → learner step, batch → chain → lease, turn, reward; figures as metrics",
    () =>
      Effect.gen(function*() {
        const { url, received } = yield* receiver
        const dir = mkdtempSync(join(tmpdir(), "telemetry-run-"))
        yield* Generate.write(
          { dir: join(dir, "data"), seed: 3, train: 8, heldOut: 2, validation: 0, demos: 0, noise: 0 },
          task.defaults.systemPrompt!
        ).pipe(Effect.provide(NodeServices.layer))
        const config = {
          seed: 1,
          output: "run",
          model: { path: "model", preset: "tiny", initSeed: 1 },
          data: { train: "data/train.jsonl", eval: "data/heldout.jsonl" },
          agent: { numChains: 2 },
          algorithm: { steps: 2, groupsPerStep: 2, microBatchSize: 4, advantage: "reinforce++", entropyCoef: 0.01 },
          eval: { every: 100, size: 2 }
        } as const
        const telemetry = { endpoint: url, protocol: "http/json", serviceName: "agentfly-test", exportIntervalMs: 100 }
        const run = (extra: object) => Train.run({ task, dir, config: { ...config, ...extra }, write: () => {}, tty: false })
        const result = yield* run({ telemetry })
        // Traced or not, the same run: the same weights and held-out figures.
        const untracedRun = yield* run({ output: "untraced" })
        assert.strictEqual(untracedRun.summary.fingerprint, result.summary.fingerprint)
        assert.deepStrictEqual(untracedRun.summary.evals, result.summary.evals)
        const spans = spansOf(received)
        const byId = new Map(spans.map((s) => [s.spanId, s]))
        const parentName = (s: Span) => (s.parentSpanId === undefined ? undefined : byId.get(s.parentSpanId)?.name)
        const named = (name: string) => spans.filter((s) => s.name === name)

        // One trace, rooted at the run, whose attributes say what the run is.
        const [root] = named("Train.run")
        assert.isDefined(root, spans.map((s) => s.name).join(", "))
        assert.isTrue(root!.parentSpanId === undefined || root!.parentSpanId === "", "the run is the root")
        assert.strictEqual(new Set(spans.map((s) => s.traceId)).size, 1)
        assert.strictEqual(attributes(root!)["run.task"], task.name)
        assert.strictEqual(attributes(root!)["run.steps"], 2)
        assert.strictEqual(named("TrainLoop.run").length, 1)
        assert.strictEqual(parentName(named("TrainLoop.run")[0]!), "Train.run")

        // Steps, with the figures that explain a slow or failed one; the learner's step under each.
        const steps = named("TrainLoop.step")
        assert.deepStrictEqual(steps.map((s) => attributes(s)["step"]).sort(), [1, 2])
        for (const s of steps) {
          assert.strictEqual(parentName(s), "TrainLoop.run")
          const a = attributes(s)
          for (const key of ["rollout/reward_mean", "time/wait_rollout_s", "time/learn_s", "perf/tokens_per_s"]) {
            assert.isNumber(a[key], key)
          }
        }
        const learns = named("Learner.learn")
        assert.strictEqual(learns.length, 2)
        for (const l of learns) {
          assert.strictEqual(parentName(l), "TrainLoop.step")
          assert.oneOf(attributes(l)["learner.outcome"], ["Applied", "Skipped", "CriticOnly"])
        }
        assert.strictEqual(named("TrainLoop.evaluate").length, 2, "before RL and at the last step")

        // Chains under their batch (2 steps × 2 groups × 2 chains) and the evaluations' (2 × 2 questions).
        const chains = named("RolloutChain.run")
        assert.strictEqual(chains.filter((c) => parentName(c) === "TrainLoop.batch").length, 8)
        assert.strictEqual(chains.filter((c) => parentName(c) === "TrainLoop.evaluate").length, 4)
        for (const c of chains) {
          const a = attributes(c)
          assert.isString(a["chain.id"])
          assert.isString(a["chain.termination"])
          assert.isNumber(a["chain.reward"])
          assert.isNumber(a["chain.turns"])
        }
        for (const name of ["RolloutChain.lease", "RolloutChain.turn", "RolloutChain.reward"]) {
          const children = named(name)
          assert.isAbove(children.length, 0, name)
          for (const s of children) assert.strictEqual(parentName(s), "RolloutChain.run", name)
        }
        assert.strictEqual(named("RolloutChain.lease").length, chains.length, "one lease a chain")
        // Every chain's first turn sampled its tokens.
        const firstTurns = named("RolloutChain.turn").map(attributes).filter((a) => a["turn.index"] === 1)
        assert.strictEqual(firstTurns.length, chains.length)
        for (const a of firstTurns) {
          assert.strictEqual(a["turn.sampled"], true)
          assert.isAbove(a["turn.tokens"] as number, 0)
        }

        // The figures of metrics.jsonl, as gauges of the same names.
        const names = metricNames(received)
        for (const key of ["rollout/reward_mean", "learner/loss", "eval/accuracy"]) assert.isTrue(names.has(key), key)
        const logged = readFileSync(join(result.config.output, "metrics.jsonl"), "utf8").trim().split("\n").length
        assert.isAtLeast(logged, 4)

        // Where traces go is no change of the run: resumed without the section (or with another), it is not refused.
        const { telemetry: _, ...untraced } = result.config
        const checked = yield* Resume.check(untraced, { resume: true }).pipe(Effect.provide(NodeServices.layer))
        assert.deepStrictEqual(checked.changed, [])
        const reseeded = yield* Effect.flip(Resume.check({ ...untraced, seed: 2 }, { resume: true }))
          .pipe(Effect.provide(NodeServices.layer))
        assert.include(reseeded.message, "seed: 1 → 2")
      }),
    240_000
  )
})
