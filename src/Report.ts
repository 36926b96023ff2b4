/**
 * The run report: one self-contained `report.html` (no network, no scripts from anywhere) with charts of the
 * figures a run logs over steps — reward, held-out accuracy, invalid tool-call rate, turns per trajectory, tool
 * calls per tool, failures and tool errors by reason, episode ends, KL, entropy, clip fraction, throughput,
 * losses, the process's peak memory per warm-up step, RL step and evaluation (`perf/peak_rss_mb`), and the
 * environment pools' acquire waits, crashes and resets — and a trajectory viewer that shows sampled
 * trajectories token by token, coloured by source (only `policy` tokens are trained on), with their rewards.
 *
 * Charts are inline SVG drawn here; the page works with scripts disabled (a few lines of inline script only filter
 * the viewer). It is regenerated from a run directory's `metrics.jsonl` and `samples.jsonl` by `agentfly report`.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import * as Image from "./Image.ts"
import * as MessageImages from "./MessageImages.ts"
import * as TrainConfig from "./TrainConfig.ts"

// ===== Records (the files a run writes) =====

/**
 * One line of `metrics.jsonl`. `step` is the learner step (warm-up records count their own steps), `elapsed`
 * the seconds since the run started; every figure is a number under a namespaced key (`rollout/reward_mean`,
 * `learner/kl`, `eval/accuracy`, ...). `firstFailure` is the error of the record's first failed trajectory
 * (`RewardFailed: reward "buggy" threw: boom`), when one failed.
 *
 * @category models
 * @since 0.1.0
 */
export const MetricsRecord = Schema.Struct({
  phase: Schema.Literals(["warmup", "train", "eval"]),
  step: Schema.Int,
  elapsed: Schema.Number,
  figures: Schema.Record(Schema.String, Schema.Number),
  firstFailure: Schema.optionalKey(Schema.String)
})
export type MetricsRecord = typeof MetricsRecord.Type

/**
 * One line of `samples.jsonl`: a sampled trajectory with each token's text, for the viewer.
 *
 * @category models
 * @since 0.1.0
 */
export const SampleRecord = Schema.Struct({
  phase: Schema.Literals(["train", "eval"]),
  step: Schema.Int,
  groupId: Schema.String,
  /** The trajectory's (a gateway episode's) id: `agentfly tokens --recorded` finds it by `--episode`. */
  trajectoryId: Schema.optionalKey(Schema.String),
  reward: Schema.Number,
  termination: Schema.String,
  spans: Schema.Array(Schema.Struct({
    source: Schema.String,
    tokens: Schema.Array(Schema.String),
    /** The recorded token ids (`tokens` is their text). */
    ids: Schema.optionalKey(Schema.Array(Schema.Int)),
    /** Which of the trajectory's segments the span is in. */
    segment: Schema.optionalKey(Schema.Int),
    logprobs: Schema.optionalKey(Schema.Array(Schema.Number)),
    /** An image span's image (its bytes in the run's `images/<sha256>.png`, `Image.sidecarPath`). */
    image: Schema.optionalKey(Image.ImageRef)
  }))
})
export type SampleRecord = typeof SampleRecord.Type

// ===== Charts (pure SVG) =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Series {
  readonly name: string
  readonly points: ReadonlyArray<readonly [number, number]>
}

const palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"]

const escape = (s: string): string =>
  s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;" })[c]!)

/**
 * "Nice" axis ticks covering [lo, hi] (1, 2 or 5 × a power of ten apart).
 *
 * @category charts
 * @since 0.1.0
 */
export const ticks = (lo: number, hi: number, count = 5): Array<number> => {
  if (!(hi > lo)) return [lo]
  const raw = (hi - lo) / count
  const power = 10 ** Math.floor(Math.log10(raw))
  const step = [1, 2, 5, 10].map((m) => m * power)
    .sort((a, b) => Math.abs((hi - lo) / a - count) - Math.abs((hi - lo) / b - count))[0]!
  const out: Array<number> = []
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)))
  return out
}

const finitePoints = (s: Series): ReadonlyArray<readonly [number, number]> =>
  s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y))

/** Legend entries left to right, wrapping onto new rows (14 px apart); returns each entry's offset and the rows. */
const legendLayout = (names: ReadonlyArray<string>, width: number) => {
  let [x, row] = [0, 0]
  const at = names.map((name) => {
    const w = 24 + name.length * 6
    if (x > 0 && x + w > width) [x, row] = [0, row + 1]
    const here = { x, row }
    x += w
    return here
  })
  return { at, rows: row + 1 }
}

const label = (x: number): string => {
  const a = Math.abs(x)
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return x.toExponential(1)
  return Number(x.toPrecision(4)).toString()
}

/**
 * A line chart as an SVG string: axes with ticks, one polyline (and dots when points are few) per series, and a
 * legend (wrapping onto more rows, which make the chart taller, when the names do not fit on one). Series without
 * points are left out; with none at all the chart says "no data". The y axis spans the points (padded when they are
 * all equal); a `fraction` chart's (rates, accuracies, shares) stays within [0, 1], so that an accuracy of 0 sits on
 * the x axis instead of mid-chart between -0.1 and 0.1.
 *
 * @category charts
 * @since 0.1.0
 */
export const lineChart = (options: {
  readonly title: string
  readonly series: ReadonlyArray<Series>
  readonly width?: number
  readonly height?: number
  readonly xLabel?: string
  readonly fraction?: boolean
}): string => {
  const width = options.width ?? 420
  const height = options.height ?? 240
  const m = { left: 52, right: 12, top: 28, bottom: 40 }
  const series = options.series.filter((s) => finitePoints(s).length > 0)
  // The x-axis label ("step") sits at the right end of the legend's first row.
  const legendAt = legendLayout(series.map((s) => s.name), width - m.left - m.right - 36)
  const full = height + (legendAt.rows - 1) * 14
  const head = `<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 ${width} ${full}" ` +
    `width="${width}" height="${full}"><title>${escape(options.title)}</title>` +
    `<text x="${m.left}" y="16" class="chart-title">${escape(options.title)}</text>`
  if (series.length === 0) {
    return head + `<text x="${width / 2}" y="${height / 2}" text-anchor="middle" class="nodata">no data</text></svg>`
  }
  const all = series.flatMap(finitePoints)
  const xs = all.map(([x]) => x)
  const ys = all.map(([, y]) => y)
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)]
  if (x1 === x0) [x0, x1] = [x0 - 1, x1 + 1]
  const [lowest, highest] = [y0, y1]
  if (y1 === y0) [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.1, y1 + (Math.abs(y1) || 1) * 0.1]
  // Within [0, 1], unless a point lies outside (then the axis still shows it).
  if (options.fraction) [y0, y1] = [Math.max(y0, Math.min(0, lowest)), Math.min(y1, Math.max(1, highest))]
  const px = (x: number) => m.left + ((x - x0) / (x1 - x0)) * (width - m.left - m.right)
  const py = (y: number) => height - m.bottom - ((y - y0) / (y1 - y0)) * (height - m.top - m.bottom)
  const grid = ticks(y0, y1, 4).map((t) =>
    `<line x1="${m.left}" x2="${width - m.right}" y1="${py(t).toFixed(1)}" y2="${py(t).toFixed(1)}" class="grid"/>` +
    `<text x="${m.left - 6}" y="${(py(t) + 4).toFixed(1)}" text-anchor="end" class="tick">${label(t)}</text>`
  ).join("")
  const xTicks = ticks(x0, x1, 5).map((t) =>
    `<text x="${px(t).toFixed(1)}" y="${height - m.bottom + 16}" text-anchor="middle" class="tick">${label(t)}</text>`
  ).join("")
  const lines = series.map((s, i) => {
    const color = palette[i % palette.length]!
    const pts = finitePoints(s)
    const path = pts.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ")
    const dots = pts.length <= 40
      ? pts.map(([x, y]) => `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="2.5" fill="${color}"/>`)
        .join("")
      : ""
    return `<polyline class="series" data-name="${escape(s.name)}" fill="none" stroke="${color}" ` +
      `stroke-width="1.8" points="${path}"/>${dots}`
  }).join("")
  const legend = series.map((s, i) =>
    `<g transform="translate(${m.left + legendAt.at[i]!.x},${height - 10 + legendAt.at[i]!.row * 14})">` +
    `<rect width="10" height="10" y="-9" ` +
    `fill="${palette[i % palette.length]}"/><text x="14" class="legend">${escape(s.name)}</text></g>`
  ).join("")
  const axes = `<line x1="${m.left}" x2="${m.left}" y1="${m.top}" y2="${height - m.bottom}" class="axis"/>` +
    `<line x1="${m.left}" x2="${width - m.right}" y1="${height - m.bottom}" y2="${height - m.bottom}" class="axis"/>` +
    `<text x="${width - m.right}" y="${height - m.bottom + 30}" text-anchor="end" class="tick">` +
    `${escape(options.xLabel ?? "step")}</text>`
  return head + grid + axes + xTicks + lines + legend + "</svg>"
}

// ===== The report =====

/**
 * Keys plotted one series per key that the run logged: every `<prefix><name><suffix>` of the phase, a series named
 * `<name>` (`<name> <label>` with a label). With `absentIsZero`, a record of the phase that lacks a key counts as 0
 * for it: for counts logged only when non-zero (`rollout/failures/<Reason>`, `rollout/tool_calls/<tool>`).
 *
 * @category models
 * @since 0.1.0
 */
export interface SeriesFamily {
  readonly phase: MetricsRecord["phase"]
  readonly prefix: string
  readonly suffix?: string
  readonly label?: string
  readonly absentIsZero?: boolean
}

/**
 * A chart of the report: a title, the metric keys (with the phase they are logged in) it plots, and families of
 * keys plotted one series per key found. A chart sits in a section of the page (`group`, default "Training
 * curves"). Charts for figures every run logs say "no data" when they have none (something is missing); an
 * `optional` one (figures only some runs log: failures, environment pools) is left out, and so is a section left
 * empty.
 *
 * @category models
 * @since 0.1.0
 */
export interface ChartSpec {
  readonly title: string
  readonly series: ReadonlyArray<
    { readonly name: string; readonly phase: MetricsRecord["phase"]; readonly key: string }
  >
  readonly families?: ReadonlyArray<SeriesFamily>
  readonly optional?: boolean
  readonly group?: string
  /** Its figures are fractions (rates, accuracies, shares): the y axis stays within [0, 1]. */
  readonly fraction?: boolean
}

const trainCounts = (prefix: string): ReadonlyArray<SeriesFamily> => [{ phase: "train", prefix, absentIsZero: true }]

/** `env/<resource>/<figure>` for each figure, one series per resource (named `<resource> <label>` with a label). */
const perPool = (
  figures: ReadonlyArray<readonly [figure: string, label?: string]>
): ReadonlyArray<SeriesFamily> =>
  figures.map(([figure, label]) => ({
    phase: "train",
    prefix: "env/",
    suffix: `/${figure}`,
    ...(label === undefined ? {} : { label })
  }))

/**
 * The charts of a training run. Keys under `rollout/tool_calls/`, `rollout/failures/`, `rollout/tool_errors/` and
 * `rollout/episode_end/` are plotted one series per tool or reason; the environment pools' figures
 * (`env/<resource>/…`, from a provider's `stats`) one series per resource and figure.
 *
 * @category constants
 * @since 0.1.0
 */
export const charts: ReadonlyArray<ChartSpec> = [
  {
    title: "Reward",
    series: [{ name: "train (sampled)", phase: "train", key: "rollout/reward_mean" }, {
      name: "held-out",
      phase: "eval",
      key: "eval/reward_mean"
    }]
  },
  {
    // Train first in every chart with both, so that each keeps its colour from chart to chart.
    title: "Accuracy",
    fraction: true,
    series: [{ name: "train (sampled)", phase: "train", key: "rollout/accuracy" }, {
      name: "held-out",
      phase: "eval",
      key: "eval/accuracy"
    }]
  },
  {
    title: "Invalid tool-call rate",
    fraction: true,
    series: [{ name: "train", phase: "train", key: "rollout/invalid_tool_call_rate" }, {
      name: "held-out",
      phase: "eval",
      key: "eval/invalid_tool_call_rate"
    }]
  },
  { title: "Turns per trajectory", series: [{ name: "mean turns", phase: "train", key: "rollout/turns_mean" }] },
  { title: "Tool calls per tool", series: [], families: trainCounts("rollout/tool_calls/") },
  {
    title: "Failures by reason (train)",
    series: [],
    families: trainCounts("rollout/failures/"),
    optional: true
  },
  { title: "Tool errors by reason", series: [], families: trainCounts("rollout/tool_errors/"), optional: true },
  {
    title: "Episode ends",
    series: [],
    families: trainCounts("rollout/episode_end/"),
    optional: true,
    fraction: true
  },
  {
    title: "KL",
    series: [{ name: "to reference", phase: "train", key: "learner/kl" }, {
      name: "approx. old → new",
      phase: "train",
      key: "learner/approx_kl"
    }]
  },
  {
    title: "Groups with a learning signal",
    series: [{ name: "trained on, rewards differ", phase: "train", key: "learner/groups_with_signal" }, {
      name: "sampled (dynamic sampling)",
      phase: "train",
      key: "rollout/groups_sampled"
    }],
    optional: true
  },
  { title: "Entropy", series: [{ name: "entropy", phase: "train", key: "learner/entropy" }] },
  {
    title: "Clip fraction",
    series: [{ name: "clip fraction", phase: "train", key: "learner/clip_frac" }],
    fraction: true
  },
  { title: "Throughput (tokens/s)", series: [{ name: "train", phase: "train", key: "perf/tokens_per_s" }] },
  { title: "Policy loss", series: [{ name: "loss", phase: "train", key: "learner/loss" }] },
  // What the optimiser did: the schedule's rate (a cosine or warm-up is seen, not inferred) and the gradient's norm
  // before clipping at algorithm.gradClip (Dr.GRPO's sums run an order of magnitude above GRPO's means).
  { title: "Learning rate", series: [{ name: "learning rate", phase: "train", key: "learner/lr" }] },
  { title: "Gradient norm", series: [{ name: "before clipping", phase: "train", key: "learner/grad_norm" }] },
  {
    title: "Values and returns",
    series: [{ name: "critic's value (mean)", phase: "train", key: "critic/value_mean" }, {
      name: "return (mean)",
      phase: "train",
      key: "critic/return_mean"
    }],
    optional: true,
    group: "Critic"
  },
  {
    title: "Critic loss and explained variance",
    series: [{ name: "value loss", phase: "train", key: "critic/loss" }, {
      name: "explained variance",
      phase: "train",
      key: "critic/explained_variance"
    }],
    optional: true,
    group: "Critic"
  },
  { title: "Warm-up loss (SFT)", series: [{ name: "masked NLL", phase: "warmup", key: "warmup/loss" }] },
  {
    title: "Warm-up validation accuracy",
    fraction: true,
    series: [{ name: "greedy", phase: "warmup", key: "warmup/validation_accuracy" }]
  },
  {
    title: "Peak RSS (MB)",
    series: [{ name: "RL step", phase: "train", key: "perf/peak_rss_mb" }, {
      name: "evaluation",
      phase: "eval",
      key: "perf/peak_rss_mb"
    }],
    optional: true,
    group: "Memory"
  },
  {
    title: "Peak RSS, warm-up (MB)",
    series: [{ name: "warm-up step", phase: "warmup", key: "perf/peak_rss_mb" }],
    optional: true,
    group: "Memory"
  },
  {
    title: "Acquire wait (ms)",
    series: [],
    families: perPool([["acquire_wait_p50_ms", "p50"], ["acquire_wait_p99_ms", "p99"]]),
    optional: true,
    group: "Environment pools"
  },
  {
    title: "Crashes (since start)",
    series: [],
    families: perPool([["crashes"]]),
    optional: true,
    group: "Environment pools"
  },
  {
    title: "Resets for reuse (since start)",
    series: [],
    families: perPool([["resets"]]),
    optional: true,
    group: "Environment pools"
  }
]

const seriesOf = (
  metrics: ReadonlyArray<MetricsRecord>,
  phase: MetricsRecord["phase"],
  key: string
): Array<readonly [number, number]> =>
  metrics.flatMap((r) =>
    r.phase === phase && r.figures[key] !== undefined ? [[r.step, r.figures[key]!] as const] : []
  )

/** One series per key of the family that the run logged. */
const familySeries = (metrics: ReadonlyArray<MetricsRecord>, family: SeriesFamily): Array<Series> => {
  const suffix = family.suffix ?? ""
  const records = metrics.filter((r) => r.phase === family.phase)
  const keys = [...new Set(records.flatMap((r) => Object.keys(r.figures)))]
    .filter((k) => k.startsWith(family.prefix) && k.endsWith(suffix) && k.length > family.prefix.length + suffix.length)
    .sort()
  return keys.map((key) => {
    const name = key.slice(family.prefix.length, key.length - suffix.length)
    return {
      name: family.label === undefined ? name : `${name} ${family.label}`,
      points: family.absentIsZero
        ? records.map((r) => [r.step, r.figures[key] ?? 0] as const)
        : seriesOf(metrics, family.phase, key)
    }
  })
}

/** The series of a chart: its fixed keys, then its families' (sorted by name, so a resource's series sit together). */
const chartSeries = (metrics: ReadonlyArray<MetricsRecord>, chart: ChartSpec): Array<Series> => [
  ...chart.series.map((s) => ({ name: s.name, points: seriesOf(metrics, s.phase, s.key) })),
  ...(chart.families ?? []).flatMap((f) => familySeries(metrics, f))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
]

/** The page's sections of charts, in the order of {@link charts}; optional charts without data are left out. */
const chartSections = (metrics: ReadonlyArray<MetricsRecord>): string => {
  const sections = new Map<string, Array<string>>()
  for (const chart of charts) {
    const series = chartSeries(metrics, chart)
    if (chart.optional && !series.some((s) => finitePoints(s).length > 0)) continue
    const group = chart.group ?? "Training curves"
    const svg = lineChart({ title: chart.title, series, fraction: chart.fraction === true })
    sections.set(group, [...(sections.get(group) ?? []), svg])
  }
  return [...sections].map(([group, svgs]) => `<h2>${escape(group)}</h2><div class="charts">${svgs.join("")}</div>`)
    .join("")
}

/** A trajectory's termination as a reader says it (`no_tool_call`: the last turn answered without a call). */
const endings: Record<string, string> = {
  no_tool_call: "answered (last turn without a tool call)",
  stop: "turn cut at maxNewTokens",
  context_length: "context full",
  max_turns: "turn limit",
  episode_end: "episode ended",
  answer: "a terminal tool (answer)",
  error: "error",
  interrupted: "interrupted"
}

const sourceColours: Record<string, string> = {
  prompt: "#e5e7eb",
  policy: "#bbf7d0",
  tool: "#fed7aa",
  env: "#e9d5ff",
  template: "#dbeafe"
}

/**
 * Makes whitespace and control characters of a token visible without changing its meaning: other C0 controls and
 * DEL (a byte-level policy samples them; HTML does not allow them in text) as their Unicode control pictures (␛).
 */
const showToken = (token: string): string =>
  escape(token).replace(/\n/g, "↵\n").replace(/\t/g, "→").replace(/ /g, "&#183;").replace(
    /[\u0000-\u0008\u000b-\u001f\u007f]/g,
    (c) => String.fromCharCode(c === "\u007f" ? 0x2421 : 0x2400 + c.charCodeAt(0))
  )

/**
 * The samples the viewer shows: those of at most `maxSteps` steps per phase, evenly spread and always including
 * the first and the last (a long run records thousands; the page stays small).
 *
 * @category getters
 * @since 0.1.0
 */
export const selectSamples = (samples: ReadonlyArray<SampleRecord>, maxSteps = 12): Array<SampleRecord> => {
  const keep = new Set<string>()
  for (const phase of ["train", "eval"] as const) {
    const steps = [...new Set(samples.filter((s) => s.phase === phase).map((s) => s.step))].sort((a, b) => a - b)
    const n = Math.min(maxSteps, steps.length)
    for (let i = 0; i < n; i++) {
      keep.add(`${phase} ${steps[n === 1 ? 0 : Math.round((i * (steps.length - 1)) / (n - 1))]}`)
    }
  }
  return samples.filter((s) => keep.has(`${s.phase} ${s.step}`))
}

/** An image span: the image itself where its sidecar was read (`images`, by hash), and its label. */
const imageSpan = (
  span: SampleRecord["spans"][number] & { readonly image: Image.ImageRef },
  images: ReadonlyMap<string, string>
): string => {
  const text = Image.label(span.image, span.tokens.length)
  const url = images.get(span.image.sha256)
  const img = url === undefined
    ? ""
    : `<img class="image" src="${escape(url)}" alt="${escape(text)}" width="${span.image.width}" ` +
      `height="${span.image.height}">`
  return `<span class="tok src-${escape(span.source)}" title="${escape(span.source)}">${img}${escape(text)}</span>`
}

const viewer = (all: ReadonlyArray<SampleRecord>, images: ReadonlyMap<string, string> = new Map()): string => {
  if (all.length === 0) return `<p class="nodata">No sampled trajectories were recorded.</p>`
  const samples = selectSamples(all)
  const steps = [...new Set(samples.map((s) => `${s.phase} ${s.step}`))]
  const options = steps.map((s) => `<option value="${escape(s)}">${escape(s)}</option>`).join("")
  const cards = samples.map((sample, i) => {
    const tokens = sample.spans.map((span) =>
      span.image !== undefined ? imageSpan({ ...span, image: span.image }, images) : span.tokens.map((t, j) => {
        const lp = span.logprobs?.[j]
        const title = `${span.source}${lp === undefined ? "" : ` · logprob ${lp.toFixed(3)}`}`
        return `<span class="tok src-${escape(span.source)}" title="${escape(title)}">${showToken(t)}</span>`
      }).join("")
    ).join("")
    const trained = sample.spans.reduce((n, s) => n + (s.source === "policy" ? s.tokens.length : 0), 0)
    const total = sample.spans.reduce((n, s) => n + s.tokens.length, 0)
    return `<div class="card" data-step="${escape(`${sample.phase} ${sample.step}`)}" id="sample-${i}">` +
      `<div class="meta">${escape(sample.phase)} step ${sample.step} · group ${escape(sample.groupId)} · ` +
      `<b>reward ${sample.reward.toFixed(3)}</b> · ` +
      `ended: ${escape(endings[sample.termination] ?? sample.termination)} · ` +
      `${trained}/${total} tokens trained` +
      `</div><pre class="tokens">${tokens}</pre></div>`
  }).join("")
  const legend = Object.entries(sourceColours).map(([source, colour]) =>
    `<span class="tok" style="background:${colour}">${source}</span>`
  ).join(" ")
  return `<p>Sources: ${legend} — only <b>policy</b> tokens are in the loss mask. Hover a token for its logprob.</p>` +
    `<label>Step <select id="step-filter"><option value="">all</option>${options}</select></label>` +
    `<div id="viewer">${cards}</div>`
}

const summary = (metrics: ReadonlyArray<MetricsRecord>): string => {
  const evals = metrics.filter((r) => r.phase === "eval")
  if (evals.length === 0) return ""
  const first = evals[0]!
  const last = evals.at(-1)!
  const row = (name: string, key: string) => {
    const a = first.figures[key]
    const b = last.figures[key]
    if (a === undefined && b === undefined) return ""
    const fmt = (x: number | undefined) => (x === undefined ? "–" : x.toFixed(3))
    const delta = a !== undefined && b !== undefined ? `${b - a >= 0 ? "+" : ""}${(b - a).toFixed(3)}` : "–"
    return `<tr><td>${name}</td><td>${fmt(a)}</td><td>${fmt(b)}</td><td>${delta}</td></tr>`
  }
  return `<table class="summary"><tr><th>held-out</th><th>step ${first.step} (before RL)</th>` +
    `<th>step ${last.step}</th><th>change</th></tr>` + row("accuracy", "eval/accuracy") +
    row("invalid tool-call rate", "eval/invalid_tool_call_rate") + row("reward", "eval/reward_mean") + `</table>`
}

const style =
  `body{font:14px system-ui,sans-serif;margin:24px;color:#111}h1{font-size:20px}h2{font-size:16px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{background:#fff;border:1px solid #e5e7eb;border-radius:6px}
.chart-title{font-weight:600;font-size:13px}.tick,.legend{font-size:10px;fill:#374151}.grid{stroke:#f3f4f6}
.axis{stroke:#9ca3af}.nodata{fill:#9ca3af;color:#6b7280}.summary{border-collapse:collapse}
.summary td,.summary th{border:1px solid #e5e7eb;padding:4px 10px;text-align:right}
.card{border:1px solid #e5e7eb;border-radius:6px;margin:10px 0;padding:8px}.meta{font-size:12px;color:#374151}
.tokens{white-space:pre-wrap;word-break:break-all;font:12px ui-monospace,monospace;line-height:1.7;margin:6px 0 0}
.tok{border-radius:2px;padding:0 1px;margin:0 0.5px}.image{display:block;max-width:320px;height:auto;` +
  `image-rendering:pixelated;margin:2px 0}` +
  Object.entries(sourceColours).map(([s, c]) => `.src-${s}{background:${c}}`).join("")

const script = `document.getElementById("step-filter")?.addEventListener("change",function(e){var v=e.target.value;` +
  `document.querySelectorAll("#viewer .card").forEach(function(c){c.style.display=!v||c.dataset.step===v?"":"none"})})`

/**
 * The pieces of the report page, for pages built from them (the live view of `agentfly watch`): the chart sections,
 * the trajectory viewer, the held-out summary table, the page's CSS, HTML escaping and a termination as a reader
 * says it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const parts = {
  charts: chartSections,
  viewer,
  summary,
  style,
  escape,
  ending: (termination: string): string => endings[termination] ?? termination
} as const

/**
 * Renders the report page.
 *
 * @category constructors
 * @since 0.1.0
 */
export const render = (input: {
  readonly title: string
  readonly metrics: ReadonlyArray<MetricsRecord>
  readonly samples: ReadonlyArray<SampleRecord>
  readonly config?: unknown
  /** The images of image spans as `data:` URLs, by hash (`read` gathers them from the run's sidecar files). */
  readonly images?: ReadonlyMap<string, string> | undefined
}): string => {
  const config = input.config === undefined
    ? ""
    : `<details><summary>Configuration</summary><pre>${escape(JSON.stringify(input.config, null, 2))}</pre></details>`
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(input.title)}</title>` +
    `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; ` +
    `script-src 'unsafe-inline'; img-src data:">` +
    `<style>${style}</style></head><body><h1>${escape(input.title)}</h1>${summary(input.metrics)}` +
    chartSections(input.metrics) +
    `<h2>Sampled trajectories</h2>${viewer(input.samples, input.images)}${config}` +
    `<script>${script}</script></body></html>\n`
}

// ===== Comparison of runs =====

/**
 * One run of a comparison: a name for its legend entries, its metric records and its recorded config.
 *
 * @category models
 * @since 0.1.0
 */
export interface RunFigures {
  readonly name: string
  readonly metrics: ReadonlyArray<MetricsRecord>
  readonly config?: unknown
}

/**
 * The charts of a comparison: every fixed series of {@link charts} that some run logged, one series per run (a
 * family's keys differ from run to run, so families are left to each run's own report).
 *
 * @category constants
 * @since 0.1.0
 */
export const comparedSeries: ReadonlyArray<{
  readonly title: string
  readonly phase: MetricsRecord["phase"]
  readonly key: string
  readonly fraction: boolean
  readonly group: string
}> = charts.flatMap((chart) =>
  chart.series.map((s) => ({
    title: chart.series.length === 1 ? chart.title : `${chart.title}: ${s.name}`,
    phase: s.phase,
    key: s.key,
    fraction: chart.fraction === true,
    group: chart.group ?? "Training curves"
  }))
)

/**
 * Seconds of the RL phase: from the record before the first RL step (the warm-up's end, or the first evaluation) to the
 * last RL step.
 */
const rlSeconds = (metrics: ReadonlyArray<MetricsRecord>): number | undefined => {
  const first = metrics.findIndex((r) => r.phase === "train")
  if (first < 0) return undefined
  const last = metrics.filter((r) => r.phase === "train").at(-1)!
  return last.elapsed - (first === 0 ? 0 : metrics[first - 1]!.elapsed)
}

const pick = (config: unknown, path: ReadonlyArray<string>): unknown =>
  path.reduce<unknown>(
    (v, k) => (typeof v === "object" && v !== null ? (v as Record<string, unknown>)[k] : undefined),
    config
  )

/**
 * The table of a comparison: per run what it was (seed, mode, estimator), how long its RL took, and its held-out
 * figures.
 */
const comparisonTable = (runs: ReadonlyArray<RunFigures>): string => {
  const fmt = (x: number | undefined, digits = 3) => (x === undefined ? "–" : x.toFixed(digits))
  const rows = runs.map((run) => {
    const evals = run.metrics.filter((r) => r.phase === "eval")
    const [first, last] = [evals[0], evals.at(-1)]
    const before = first?.figures["eval/accuracy"]
    const after = last?.figures["eval/accuracy"]
    const se = last?.figures["eval/accuracy_se"]
    const change = before !== undefined && after !== undefined && evals.length > 1
      ? `${after - before >= 0 ? "+" : ""}${(after - before).toFixed(3)}`
      : "–"
    const cells = [
      run.name,
      String(pick(run.config, ["seed"]) ?? "–"),
      String(pick(run.config, ["mode"]) ?? "–"),
      String(pick(run.config, ["algorithm", "advantage"]) ?? "–"),
      String(run.metrics.filter((r) => r.phase === "train").length),
      fmt(rlSeconds(run.metrics), 1),
      fmt(before),
      `${fmt(after)}${se === undefined ? "" : ` ± ${se.toFixed(3)}`}`,
      change,
      fmt(last?.figures["eval/invalid_tool_call_rate"]),
      fmt(last?.figures["eval/reward_mean"])
    ]
    const row = cells.map((c, i) => (i === 0 ? `<td class="name">${escape(c)}</td>` : `<td>${escape(c)}</td>`))
    return `<tr>${row.join("")}</tr>`
  })
  const head = ["run", "seed", "mode", "advantage", "RL steps", "RL time (s)", "held-out accuracy first", "last",
    "change", "invalid tool-call rate (last)", "reward (last)"]
  return `<table class="summary"><tr>${head.map((h) => `<th>${escape(h)}</th>`).join("")}</tr>${rows.join("")}</table>`
}

/** What each run's config changes from the first run's (paths aside): what the comparison is about. */
const configChanges = (runs: ReadonlyArray<RunFigures>): string => {
  const [base, ...others] = runs
  if (base === undefined || base.config === undefined) return ""
  const ignore = ["output", "model.path", "model.from", "data.train", "data.eval", "data.validation", "warmup.data",
    "warmup.stopAt.data", "name"]
  const items = others.map((run) => {
    const changes = run.config === undefined ? ["no config.json"] : TrainConfig.changes(base.config, run.config, ignore)
    const said = changes.length === 0 ? "the same config" : escape(changes.join("; "))
    return `<li><b>${escape(run.name)}</b>: ${said}</li>`
  })
  return items.length === 0
    ? ""
    : `<p>Configs against <b>${escape(base.name)}</b>:</p><ul class="changes">${items.join("")}</ul>`
}

/**
 * Renders a page comparing runs: a table (seed, mode, estimator, RL steps and time, held-out figures first and
 * last), what each config changes from the first run's, held-out accuracy and RL progress over wall-clock time (what
 * sync against async or one machine against several is about), and every chart of the run report with one series
 * per run.
 *
 * @category constructors
 * @since 0.1.0
 */
export const renderComparison = (
  input: { readonly title: string; readonly runs: ReadonlyArray<RunFigures> }
): string => {
  const minutes = (run: RunFigures, phase: MetricsRecord["phase"], y: (r: MetricsRecord) => number | undefined) =>
    run.metrics.flatMap((r) => {
      const value = r.phase === phase ? y(r) : undefined
      return value === undefined ? [] : [[r.elapsed / 60, value] as const]
    })
  const overTime = [
    lineChart({
      title: "Held-out accuracy over time",
      xLabel: "minutes",
      fraction: true,
      series: input.runs.map((run) => ({
        name: run.name,
        points: minutes(run, "eval", (r) => r.figures["eval/accuracy"])
      }))
    }),
    lineChart({
      title: "RL steps over time",
      xLabel: "minutes",
      series: input.runs.map((run) => ({ name: run.name, points: minutes(run, "train", (r) => r.step) }))
    })
  ]
  const sections = new Map<string, Array<string>>([["Over time", overTime]])
  for (const chart of comparedSeries) {
    const series = input.runs.map((run) => ({ name: run.name, points: seriesOf(run.metrics, chart.phase, chart.key) }))
    if (!series.some((s) => finitePoints(s).length > 0)) continue
    const svg = lineChart({ title: chart.title, series, fraction: chart.fraction })
    sections.set(chart.group, [...(sections.get(chart.group) ?? []), svg])
  }
  const body = [...sections].map(([group, svgs]) =>
    `<h2>${escape(group)}</h2><div class="charts">${svgs.join("")}</div>`
  )
    .join("")
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(input.title)}</title>` +
    `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; ` +
    `img-src data:">` +
    `<style>${style}.summary td.name{text-align:left}</style></head><body><h1>${escape(input.title)}</h1>` +
    comparisonTable(input.runs) + configChanges(input.runs) + body + `</body></html>\n`
}

// ===== Files =====

const decodeMetrics = Schema.decodeUnknownResult(Schema.fromJsonString(MetricsRecord))
const decodeSample = Schema.decodeUnknownResult(Schema.fromJsonString(SampleRecord))

/**
 * A directory that holds no training run (no `metrics.jsonl`), or none at all: there is nothing to report.
 *
 * @category errors
 * @since 0.1.0
 */
export class ReportError extends Schema.TaggedError<ReportError>()("ReportError", {
  dir: Schema.String,
  message: Schema.String
}) {}

/**
 * Fails with {@link ReportError} unless `dir` holds a training run's `metrics.jsonl`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const requireRun = Effect.fn("Report.requireRun")(function*(dir: string) {
  const fs = yield* FileSystem.FileSystem
  if (yield* fs.exists(`${dir}/metrics.jsonl`)) return
  const what = (yield* fs.exists(dir)) ? "holds no training run (no metrics.jsonl)" : "does not exist"
  return yield* new ReportError({
    dir,
    message: `${dir} ${what}: give a run's output directory (its config's output, or the --output it ran with)`
  })
})

/**
 * Reads a run directory's `metrics.jsonl` and `samples.jsonl` (a missing file reads as empty; invalid lines, such
 * as a torn last line after a crash, are skipped).
 *
 * @category constructors
 * @since 0.1.0
 */
export const read = Effect.fn("Report.read")(function*(dir: string) {
  const fs = yield* FileSystem.FileSystem
  const lines = (name: string) =>
    fs.readFileString(`${dir}/${name}`).pipe(
      Effect.map((text) => text.split("\n").filter((l) => l.trim() !== "")),
      Effect.orElseSucceed((): Array<string> => [])
    )
  const metrics = (yield* lines("metrics.jsonl")).flatMap((l) => {
    const r = decodeMetrics(l)
    return r._tag === "Success" ? [r.success] : []
  })
  const samples = (yield* lines("samples.jsonl")).flatMap((l) => {
    const r = decodeSample(l)
    return r._tag === "Success" ? [r.success] : []
  })
  const refs = samples.flatMap((sample) => sample.spans.flatMap((span) => span.image === undefined ? [] : [span.image]))
  const images = refs.length === 0 ? new Map<string, string>() : yield* MessageImages.readSidecars(refs, dir)
  return { metrics, samples, images }
})

/**
 * Regenerates `report.html` in a run directory from its files (and `config.json` when present). Returns the
 * report's path.
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("Report.write")(function*(dir: string, options: { readonly title?: string } = {}) {
  const fs = yield* FileSystem.FileSystem
  const { metrics, samples, images } = yield* read(dir)
  const config = yield* fs.readFileString(`${dir}/config.json`).pipe(
    Effect.flatMap(Schema.decodeUnknownEffect(Schema.fromJsonString(Schema.Unknown))),
    Effect.orElseSucceed((): unknown => undefined)
  )
  const title = options.title ?? `agentfly run: ${dir.replace(/\/+$/, "").split("/").at(-1)}`
  const path = `${dir}/report.html`
  yield* fs.writeFileString(path, render({ title, metrics, samples, config, images }))
  return path
})

/**
 * Writes a page comparing the runs in `dirs` (each a run directory, named in the legends by its folder, or by its
 * path when two folders share a name) to `out`. Returns `out`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const writeComparison = Effect.fn("Report.writeComparison")(function*(
  dirs: ReadonlyArray<string>,
  out: string
) {
  const fs = yield* FileSystem.FileSystem
  const trimmed = dirs.map((d) => d.replace(/\/+$/, ""))
  const base = (d: string) => d.split("/").at(-1) ?? d
  const runs: Array<RunFigures> = []
  for (const dir of trimmed) {
    yield* requireRun(dir)
    const { metrics } = yield* read(dir)
    const config = yield* fs.readFileString(`${dir}/config.json`).pipe(
      Effect.flatMap(Schema.decodeUnknownEffect(Schema.fromJsonString(Schema.Unknown))),
      Effect.orElseSucceed((): unknown => undefined)
    )
    const name = trimmed.filter((d) => base(d) === base(dir)).length > 1 ? dir : base(dir)
    runs.push({ name, metrics, config })
  }
  const title = `agentfly runs: ${runs.map((r) => r.name).join(" · ")}`
  yield* fs.writeFileString(out, renderComparison({ title, runs }))
  return out
})
