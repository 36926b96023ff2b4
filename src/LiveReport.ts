/**
 * The live view of a run (`agentfly watch RUN`): the run report's charts (`Report.ts`) with the run's status, its
 * newest step's figures and sampled chains, and a token-level view of the most recent trajectories, as one HTML
 * fragment that the page replaces whenever the run writes a record (server-sent events: no reload, no polling from
 * the page, nothing fetched from elsewhere).
 *
 * Everything here is pure: the server (`cli/watch.ts`) tails the run's files into a {@link State} and sends
 * {@link fragment}'s HTML.
 *
 * @since 0.1.0
 */
import * as Report from "./Report.ts"

// ===== Models =====

/**
 * What the live view shows: the run's records so far, its most recent samples, its config when written, whether
 * the run said it finished, and how long ago its last record was written.
 *
 * @category models
 * @since 0.1.0
 */
export interface State {
  readonly metrics: ReadonlyArray<Report.MetricsRecord>
  /** The most recent samples (the server keeps those of the last few steps). */
  readonly samples: ReadonlyArray<Report.SampleRecord>
  readonly config?: unknown
  readonly finished: boolean
  /** Seconds since a file of the run last changed, when known. */
  readonly quietFor?: number | undefined
  /** The samples' images as `data:` URLs by hash (from the run's `images/`), shown beside their tokens. */
  readonly images?: ReadonlyMap<string, string> | undefined
}

// ===== Pieces =====

const { escape } = Report.parts

const pick = (config: unknown, path: ReadonlyArray<string>): unknown =>
  path.reduce<unknown>(
    (v, k) => (typeof v === "object" && v !== null ? (v as Record<string, unknown>)[k] : undefined),
    config
  )

const fmt = (x: number | undefined, digits = 3): string => (x === undefined ? "–" : x.toFixed(digits))

/**
 * The run's status line: its phase and step of its steps, how long it has run, and whether it is live, quiet or
 * finished. `data-step` and `data-phase` carry the newest record's step and phase.
 *
 * @category constructors
 * @since 0.1.0
 */
export const status = (state: State): string => {
  const last = state.metrics.at(-1)
  if (last === undefined) {
    return `<p id="run-status" data-step="0" data-phase="none">Waiting for the run's first record…</p>`
  }
  // Warm-up steps count on their own, to the warm-up's steps.
  const steps = pick(state.config, last.phase === "warmup" ? ["warmup", "steps"] : ["algorithm", "steps"])
  const of = typeof steps === "number" ? ` of ${steps}` : ""
  const minutes = Math.floor(last.elapsed / 60)
  const elapsed = `${minutes > 0 ? `${minutes}m` : ""}${Math.round(last.elapsed % 60)}s`
  const state_ = state.finished
    ? "finished"
    : state.quietFor !== undefined && state.quietFor > 120
    ? `no record for ${Math.round(state.quietFor / 60)} min`
    : "running"
  return `<p id="run-status" data-step="${last.step}" data-phase="${last.phase}">` +
    `<b class="state">${escape(state_)}</b> · ${escape(last.phase)} step <b id="current-step">${last.step}</b>${of}` +
    ` · ${elapsed} elapsed` +
    (last.firstFailure === undefined ? "" : ` · <span class="failure">${escape(last.firstFailure)}</span>`) +
    `</p>`
}

/** The figures of the newest training step a person watches. */
const stepFigures: ReadonlyArray<readonly [label: string, key: string, digits: number]> = [
  ["reward", "rollout/reward_mean", 3],
  ["accuracy", "rollout/accuracy", 3],
  ["invalid tool calls", "rollout/invalid_tool_call_rate", 3],
  ["failed", "rollout/failure_share", 3],
  ["turns", "rollout/turns_mean", 2],
  ["KL", "learner/kl", 4],
  ["loss", "learner/loss", 4],
  ["tokens/s", "perf/tokens_per_s", 0],
  ["waiting for rollouts (s)", "time/wait_rollout_s", 2],
  ["learning (s)", "time/learn_s", 2]
]

/**
 * The newest training step: its figures and its sampled chains (group, reward, how each ended, tokens trained),
 * each linked to its tokens in the trajectory view.
 *
 * @category constructors
 * @since 0.1.0
 */
export const currentStep = (state: State): string => {
  const last = state.metrics.filter((r) => r.phase === "train").at(-1)
  if (last === undefined) return `<h2>Current step</h2><p class="nodata">No training step yet.</p>`
  const figures = stepFigures.flatMap(([label, key, digits]) => {
    const value = last.figures[key]
    return value === undefined ? [] : [`<tr><td>${escape(label)}</td><td>${fmt(value, digits)}</td></tr>`]
  })
  const chains = state.samples.filter((s) => s.phase === "train" && s.step === last.step)
  const rows = chains.map((s) => {
    const trained = s.spans.reduce((n, span) => n + (span.source === "policy" ? span.tokens.length : 0), 0)
    const total = s.spans.reduce((n, span) => n + span.tokens.length, 0)
    return `<tr class="chain"><td class="name">${escape(s.groupId)}</td><td>${fmt(s.reward)}</td>` +
      `<td class="name">${escape(Report.parts.ending(s.termination))}</td><td>${trained}/${total}</td></tr>`
  })
  const table = rows.length === 0
    ? `<p class="nodata">No chain of step ${last.step} was sampled (sampleTrajectories: 0).</p>`
    : `<table class="summary chains"><tr><th>group</th><th>reward</th><th>ended</th><th>tokens trained</th></tr>` +
      rows.join("") + `</table>`
  return `<h2>Current step: ${last.step}</h2><div class="step"><table class="summary figures">${figures.join("")}` +
    `</table>${table}</div>`
}

/**
 * The samples of the last `steps` steps that have samples, newest first (training and evaluation alike).
 *
 * @category getters
 * @since 0.1.0
 */
export const recentSamples = (
  samples: ReadonlyArray<Report.SampleRecord>,
  steps = 3
): Array<Report.SampleRecord> => {
  const keys = [...new Set(samples.map((s) => `${s.phase} ${s.step}`))].slice(-steps)
  const keep = new Set(keys)
  return samples.filter((s) => keep.has(`${s.phase} ${s.step}`)).reverse()
}

/**
 * The live view's content: status, held-out summary, the current step, the charts and the recent trajectories token
 * by token.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fragment = (state: State): string =>
  status(state) + Report.parts.summary(state.metrics) + currentStep(state) + Report.parts.charts(state.metrics) +
  `<h2>Recent trajectories</h2>${Report.parts.viewer(recentSamples(state.samples), state.images)}`

// ===== The page =====

/**
 * The page's script: the server's `update` events replace the content in place (the viewer's step filter is kept),
 * and the connection's state is said in the corner.
 */
const script = `(function(){var live=document.getElementById("live"),conn=document.getElementById("connection");` +
  `var chosen="";function filter(){document.querySelectorAll("#viewer .card").forEach(function(c){` +
  `c.style.display=!chosen||c.dataset.step===chosen?"":"none"});var s=document.getElementById("step-filter");` +
  `if(s)s.value=chosen}document.addEventListener("change",function(e){if(e.target&&e.target.id==="step-filter"){` +
  `chosen=e.target.value;filter()}});var es=new EventSource("events");es.addEventListener("update",function(e){` +
  `live.innerHTML=JSON.parse(e.data).html;filter();conn.textContent="live";conn.className="ok"});` +
  `es.onerror=function(){conn.textContent="reconnecting…";conn.className="lost"}})()`

/**
 * The live page: the report's style, `content` (the first {@link fragment}) and the script that keeps it current.
 * Its Content-Security-Policy allows only its own inline style and script and the event stream of its own origin.
 *
 * @category constructors
 * @since 0.1.0
 */
export const page = (title: string, content: string): string =>
  `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title>` +
  `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; ` +
  `script-src 'unsafe-inline'; connect-src 'self'; img-src data:">` +
  `<style>${Report.parts.style}.summary td.name{text-align:left}#connection{position:fixed;top:8px;right:12px;` +
  `font-size:12px;padding:2px 8px;border-radius:10px;background:#f3f4f6}#connection.ok{background:#dcfce7}` +
  `#connection.lost{background:#fee2e2}.step{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}` +
  `.failure{color:#b91c1c}</style></head><body><h1>${escape(title)}</h1>` +
  `<span id="connection">connecting…</span><div id="live">${content}</div><script>${script}</script></body></html>\n`
