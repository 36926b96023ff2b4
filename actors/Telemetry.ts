/**
 * A run's OpenTelemetry traces and metrics, through Effect's own OTLP exporters (`effect/observability`).
 *
 * **Spans.** A run is one trace: `Train.run` (the root: task, output, seed, steps, mode) → `TrainLoop.run` →
 * `TrainLoop.warmup`, `TrainLoop.evaluate`, `TrainLoop.checkpoint`, `TrainLoop.step` (one learner step: its rollout
 * figures, failure share and where its time went) with `Learner.learn` under it, and `TrainLoop.batch` (the rollouts
 * of a step's batch) → `RolloutChain.run` (one chain: termination, reward, turns, tokens, error) →
 * `RolloutChain.lease`, `RolloutChain.turn` (tokens sampled, tool calls, sampler time), `ToolActor.call` (tool,
 * attempts, latency, error reason) and `RolloutChain.reward`. A failed tool call, a chain that ended in an error and a
 * reward that failed are spans with status ERROR (`error.type` says the reason) although the run goes on: that is
 * where a slow or failed step is read.
 *
 * **Metrics.** Every figure of a step's or an evaluation's record is also a gauge of the same name
 * (`rollout/reward_mean`, `learner/kl`, ...) with a `phase` attribute, exported with the spans.
 *
 * **When.** Export is off unless the config's `telemetry` section or `OTEL_EXPORTER_OTLP_ENDPOINT` names a collector;
 * off, nothing is exported, no exporter fiber runs, and the spans of the hot paths (chains, leases, tool calls,
 * rewards) are not made at all.
 *
 * @since 0.1.0
 */
import { Config, Context, Effect, Layer, Metric } from "effect"
import * as FetchHttpClient from "effect/http/FetchHttpClient"
import { OtlpMetrics, OtlpSerialization, OtlpTracer } from "effect/observability"
import type * as ChainPorts from "../src/ChainPorts.ts"
import type * as Report from "../src/Report.ts"
import type * as TrainConfig from "../src/TrainConfig.ts"
import type * as Trajectory from "../src/Trajectory.ts"

// ===== Settings =====

/**
 * Where and how a run exports: resolved from the config's `telemetry` section over the standard environment
 * variables.
 *
 * @category models
 * @since 0.1.0
 */
export interface Settings {
  /** The collector's base URL; `/v1/traces` and `/v1/metrics` are appended. */
  readonly endpoint: string
  readonly protocol: "http/protobuf" | "http/json"
  readonly serviceName: string
  readonly exportIntervalMs: number
}

/**
 * The environment variables {@link resolve} reads (OpenTelemetry's names).
 *
 * @category models
 * @since 0.1.0
 */
export interface Environment {
  readonly OTEL_EXPORTER_OTLP_ENDPOINT?: string | undefined
  readonly OTEL_EXPORTER_OTLP_PROTOCOL?: string | undefined
  readonly OTEL_SERVICE_NAME?: string | undefined
  readonly OTEL_SDK_DISABLED?: string | undefined
}

/**
 * The export settings of a run, or `undefined` when nothing is to be exported: the config's section first, then
 * `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL` and `OTEL_SERVICE_NAME`. `enabled: false` or
 * `OTEL_SDK_DISABLED=true` turn export off; a protocol other than the two HTTP ones (`grpc`) falls back to
 * `http/protobuf`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const resolve = (
  config: TrainConfig.TrainConfig["telemetry"],
  env: Environment
): Settings | undefined => {
  if (config?.enabled === false || env.OTEL_SDK_DISABLED?.toLowerCase() === "true") return undefined
  const endpoint = config?.endpoint ?? (env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim() || undefined)
  if (endpoint === undefined) return undefined
  const fromEnv = env.OTEL_EXPORTER_OTLP_PROTOCOL === "http/json" ? "http/json" : "http/protobuf"
  return {
    endpoint: endpoint.replace(/\/+$/, ""),
    protocol: config?.protocol ?? fromEnv,
    serviceName: config?.serviceName ?? (env.OTEL_SERVICE_NAME?.trim() || "agentfly"),
    exportIntervalMs: config?.exportIntervalMs ?? 5_000
  }
}

const variable = (name: keyof Environment) =>
  Config.String(name).pipe(Config.option, Config.map((o) => (o._tag === "Some" ? o.value : undefined)))

const envVariables = Config.all({
  OTEL_EXPORTER_OTLP_ENDPOINT: variable("OTEL_EXPORTER_OTLP_ENDPOINT"),
  OTEL_EXPORTER_OTLP_PROTOCOL: variable("OTEL_EXPORTER_OTLP_PROTOCOL"),
  OTEL_SERVICE_NAME: variable("OTEL_SERVICE_NAME"),
  OTEL_SDK_DISABLED: variable("OTEL_SDK_DISABLED")
})

/**
 * {@link resolve} over the environment as Effect's `ConfigProvider` reads it (the process's, by default).
 *
 * @category constructors
 * @since 0.1.0
 */
export const settings = (config: TrainConfig.TrainConfig["telemetry"]): Effect.Effect<Settings | undefined> =>
  Effect.gen(function*() {
    return resolve(config, yield* envVariables)
  }).pipe(
    // A variable that cannot be read is one that is not set.
    Effect.orElseSucceed(() => resolve(config, {}))
  )

// ===== Layers =====

/**
 * Whether spans are being exported: set by {@link layer}. The spans of the hot paths ({@link span}: every chain,
 * lease, tool call and reward) are made only then, so that a run that exports nothing pays nothing for them (a tool
 * call's own cost is a few microseconds; a span would be more).
 *
 * @category services
 * @since 0.1.0
 */
export const Exporting = Context.Reference<boolean>("agentfly/actors/Telemetry/Exporting", {
  defaultValue: () => false
})

/**
 * The OTLP/HTTP tracer and metrics exporter for `settings`: spans and metric snapshots are sent every
 * `exportIntervalMs`, and what is left when the layer's scope closes (the run's end, a failure, Ctrl-C) is sent then.
 * A collector that does not answer costs the run nothing: the exporter drops its batch and waits a minute.
 *
 * @category layers
 * @since 0.1.0
 */
export const layer = (settings: Settings) => {
  const resource = { serviceName: settings.serviceName, serviceVersion: "0.1.0" }
  const common = { resource, exportInterval: `${settings.exportIntervalMs} millis` as const }
  return Layer.mergeAll(
    OtlpTracer.layer({ url: `${settings.endpoint}/v1/traces`, ...common }),
    OtlpMetrics.layer({ url: `${settings.endpoint}/v1/metrics`, ...common }),
    Layer.succeed(Exporting, true)
  ).pipe(
    Layer.provide(settings.protocol === "http/json" ? OtlpSerialization.layerJson : OtlpSerialization.layerProtobuf),
    Layer.provide(FetchHttpClient.layer)
  )
}

/**
 * Runs `self` (a training run) as the root span `Train.run` with `attributes`, exported as `settings` say; without
 * settings, `self` as it is.
 *
 * @category combinators
 * @since 0.1.0
 */
export const exported = (settings: Settings | undefined, attributes: Record<string, unknown>) =>
<A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  settings === undefined
    ? self
    : self.pipe(Effect.withSpan("Train.run", { root: true, attributes }), Effect.provide(layer(settings)))

/**
 * The root span's attributes: what the run is (task, output, seed, steps, mode, model).
 *
 * @category getters
 * @since 0.1.0
 */
export const runAttributes = (task: string, config: TrainConfig.TrainConfig): Record<string, unknown> => ({
  "run.task": task,
  "run.output": config.output,
  "run.seed": config.seed,
  "run.steps": config.algorithm.steps,
  "run.mode": config.mode,
  "run.advantage": config.algorithm.advantage,
  "run.groups_per_step": config.algorithm.groupsPerStep,
  "run.chains": config.agent.numChains,
  ...(config.model.preset === undefined ? {} : { "run.model_preset": config.model.preset }),
  "run.model": config.model.path
})

// ===== Spans =====

/**
 * What a span learns from its effect's result: attributes to add and, for a result that is a failure although the
 * effect succeeded (a tool call that failed, a chain that ended in an error), the error's type and message.
 *
 * @category models
 * @since 0.1.0
 */
export interface Said {
  readonly attributes?: Record<string, unknown> | undefined
  readonly error?: { readonly type: string; readonly message: string } | undefined
}

/** Carries a result out of its span, which it marks failed; only {@link span} makes and removes one. */
class MarkedFailed extends Error {
  readonly value: unknown
  constructor(value: unknown, message: string) {
    super(message)
    this.value = value
  }
}

/**
 * Runs `self` in a span `name` with `attributes` while spans are exported ({@link Exporting}), as it is otherwise;
 * `said` adds attributes from its result and marks a result that is a failure as an error (status ERROR with the
 * message, `error.type` the reason), though `self` succeeded and its result goes on unchanged.
 *
 * @category combinators
 * @since 0.1.0
 */
export const span = <A>(name: string, attributes: Record<string, unknown>, said?: (a: A) => Said) =>
<E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.withFiber((fiber) => (fiber.getRef(Exporting) ? traced(self, name, attributes, said) : self))

const traced = <A, E, R>(
  self: Effect.Effect<A, E, R>,
  name: string,
  attributes: Record<string, unknown>,
  said: ((a: A) => Said) | undefined
): Effect.Effect<A, E, R> => {
  const options = { attributes, captureStackTrace: false }
  if (said === undefined) return Effect.withSpan(self, name, options) as Effect.Effect<A, E, R>
  const inside = Effect.flatMap(self, (a): Effect.Effect<A, MarkedFailed> => {
    const s = said(a)
    const annotated = s.attributes === undefined ? Effect.void : Effect.annotateCurrentSpan(s.attributes)
    if (s.error === undefined) return Effect.as(annotated, a)
    return Effect.andThen(
      Effect.andThen(annotated, Effect.annotateCurrentSpan("error.type", s.error.type)),
      Effect.fail(new MarkedFailed(a, s.error.message))
    )
  })
  return Effect.withSpan(inside, name, options).pipe(
    Effect.catchIf((e): e is MarkedFailed => e instanceof MarkedFailed, (e) => Effect.succeed(e.value as A))
  ) as Effect.Effect<A, E, R>
}

/**
 * What a chain's span says of its trajectory: how it ended, its reward, turns, tool calls and tokens, and its error.
 *
 * @category getters
 * @since 0.1.0
 */
export const chainSaid = (trajectory: Trajectory.Trajectory): Said => ({
  attributes: {
    "chain.termination": trajectory.termination,
    "chain.reward": trajectory.reward,
    "chain.reward_status": trajectory.rewardStatus,
    "chain.masked": trajectory.masked,
    ...Object.fromEntries(Object.entries(trajectory.metrics).map(([k, v]) => [`chain.${k}`, v])),
    ...(trajectory.episodeEnd === undefined ? {} : { "chain.episode_end": trajectory.episodeEnd })
  },
  error: trajectory.error === undefined
    ? undefined
    : { type: trajectory.errorReason ?? "Error", message: trajectory.error }
})

/**
 * A turn's span (`RolloutChain.turn`) around a chain's turn: its index, the tokens it sampled and how it ended the
 * chain, if it did; read from the chain's counters, which were `turns` and `tokens` before it. A last call that
 * only finds the turn limit reached says `turn.sampled: false`.
 *
 * @category combinators
 * @since 0.1.0
 */
export const turnSpan = (
  chain: { readonly turns: number; readonly tokens: number },
  turns: number,
  tokens: number
) =>
<A extends { readonly termination: string } | undefined, E, R>(self: Effect.Effect<A, E, R>) =>
  span<A>("RolloutChain.turn", { "turn.index": turns + 1 }, (ending) => ({
    attributes: {
      "turn.sampled": chain.turns > turns,
      "turn.tokens": chain.tokens - tokens,
      ...(ending === undefined ? {} : { "turn.ends_chain": ending.termination })
    }
  }))(self)

/**
 * What a tool call's span says: attempts, latency, whether its output was cut, and the call's error (a failed call
 * is the model's to read, and the span's status says it failed).
 *
 * @category getters
 * @since 0.1.0
 */
export const toolSaid = (result: {
  readonly error?: { readonly reason: { readonly _tag: string }; readonly message: string } | undefined
  readonly attempts: number
  readonly latencyMs: number
  readonly truncated: boolean
}): Said => ({
  attributes: {
    "tool.attempts": result.attempts,
    "tool.latency_ms": result.latencyMs,
    "tool.truncated": result.truncated
  },
  error: result.error === undefined ? undefined : { type: result.error.reason._tag, message: result.error.message }
})

/**
 * What a reward's span says: the reward, its status, and the failure its error policy scored.
 *
 * @category getters
 * @since 0.1.0
 */
export const rewardSaid = (result: ChainPorts.RewardResult): Said => ({
  attributes: {
    "reward.value": result.reward,
    "reward.status": result.status,
    "reward.masked": result.masked === true
  },
  error: result.failure === undefined ? undefined : { type: result.failure.reason, message: result.failure.message }
})

/**
 * What a learner step's span says: whether it applied an update (or why not), its loss and KL.
 *
 * @category getters
 * @since 0.1.0
 */
export const learnSaid = (
  outcome: { readonly _tag: string; readonly loss?: number; readonly figures: Readonly<Record<string, number>> }
): Said => ({
  attributes: {
    "learner.outcome": outcome._tag,
    ...(outcome.loss === undefined ? {} : { "learner.loss": outcome.loss }),
    ...Object.fromEntries(
      ["learner/kl", "learner/grad_norm", "learner/clip_frac", "learner/tokens"].flatMap((k) =>
        outcome.figures[k] === undefined ? [] : [[k, outcome.figures[k]]]
      )
    )
  }
})

/** The figures a step's span carries: those that say why a step was slow or failed. */
const stepKeys = [
  "rollout/reward_mean",
  "rollout/accuracy",
  "rollout/failure_share",
  "rollout/invalid_tool_call_rate",
  "rollout/turns_mean",
  "rollout/policy_tokens",
  "learner/loss",
  "learner/kl",
  "perf/tokens_per_s",
  "perf/peak_rss_mb",
  "time/step_s",
  "time/wait_rollout_s",
  "time/learn_s"
]

/**
 * A metrics record's attributes for its span: the figures that explain a slow or failed step (rewards, failure
 * share, tokens, where the time went), failures by reason, and the first failure's message.
 *
 * @category getters
 * @since 0.1.0
 */
export const recordAttributes = (record: Report.MetricsRecord): Record<string, unknown> => {
  const out: Record<string, unknown> = { phase: record.phase, step: record.step }
  for (const [key, value] of Object.entries(record.figures)) {
    if (stepKeys.includes(key) || key.startsWith("rollout/failures/") || key.startsWith("eval/")) out[key] = value
  }
  if (record.firstFailure !== undefined) out["first_failure"] = record.firstFailure
  return out
}

/**
 * A learner step's span (`Learner.learn`) around the learner's call.
 *
 * @category combinators
 * @since 0.1.0
 */
export const learning = (step: number) =>
<A extends Parameters<typeof learnSaid>[0], E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  span<A>("Learner.learn", { step }, learnSaid)(self)

// ===== Metrics =====

const gauges = new Map<string, Metric.Gauge<number>>()

/**
 * Sets a gauge per figure of `record` (named as the figure, with the record's `phase`), for the metrics exporter.
 *
 * @category constructors
 * @since 0.1.0
 */
export const recordFigures = (record: Report.MetricsRecord): Effect.Effect<void> =>
  Effect.forEach(Object.entries(record.figures), ([key, value]) => {
    if (!Number.isFinite(value)) return Effect.void
    let gauge = gauges.get(key)
    if (gauge === undefined) {
      gauge = Metric.gauge(key)
      gauges.set(key, gauge)
    }
    return Metric.update(Metric.withAttributes(gauge, { phase: record.phase }), value)
  }, { discard: true })

/**
 * What a step or an evaluation says when its record is written: the record's attributes on the current span (the
 * step's, the evaluation's) and its figures as gauges.
 *
 * @category constructors
 * @since 0.1.0
 */
export const observe = (record: Report.MetricsRecord): Effect.Effect<void> =>
  Effect.andThen(Effect.annotateCurrentSpan(recordAttributes(record)), recordFigures(record))
