/**
 * The RL losses on the README's first command's task (`examples/calculator/demo.json`): GRPO as shipped against
 * GSPO, CISPO and DAPO (clip-higher + over-long shaping), 3 seeds, the same 20 RL steps, one run at a time.
 *
 * Each seed's GRPO run is the demo config with that seed (warm-up included); the other losses start from that run's
 * warm-up checkpoint (`model.from: …/checkpoints/step-000000`, no warm-up), so that every loss of a seed starts from
 * the same policy. Held-out accuracy (500 questions, T = 1) before and after is read from each run's `metrics.jsonl`.
 * A finished run is not run again (delete `runs/bench-losses/seedN-LOSS` to redo it).
 *
 * `npm run bench -- losses` (env `LOSSES=grpo,gspo` and `SEEDS=1,2` choose a subset; run it under `nice -n 10`).
 * `bench/losses-offpolicy.ts` (or `MINI_BATCHES=4`) splits each step into 4 optimiser steps
 * (`algorithm.miniBatches`), so that all but the first train on samples of an older policy, where the losses
 * differ; its runs are `seedN-LOSS-mb4`, every loss of a seed (GRPO's too) starting from the seed's warm-up.
 */
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import type { BenchResult } from "./run.ts"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const out = join(root, "runs", "bench-losses")

/** Each loss: its `algorithm` keys on top of the demo's. */
const variants: Readonly<Record<string, Record<string, unknown>>> = {
  grpo: {},
  gspo: { policyLoss: "gspo", aggregation: "seq-mean-token-mean", clipLow: 0.0003, clipHigh: 0.0004 },
  cispo: { policyLoss: "cispo", clipLow: 1, clipHigh: 0.28 },
  dapo: { clipHigh: 0.28, overlong: { maxTokens: 192, bufferTokens: 48 } }
}

interface Record_ {
  readonly step: number
  readonly phase?: string
  readonly figures: { readonly [key: string]: number }
}

const evals = (dir: string) =>
  readFileSync(join(dir, "metrics.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record_)
    .filter((r) => r.figures["eval/accuracy"] !== undefined)

const finished = (dir: string) =>
  existsSync(join(dir, "metrics.jsonl")) && evals(dir).some((r) => r.step === 20)

const run = (seed: number, loss: string, miniBatches: number) => {
  const name = `seed${seed}-${loss}${miniBatches === 1 ? "" : `-mb${miniBatches}`}`
  const fromWarmup = loss !== "grpo" || miniBatches !== 1
  const dir = join(out, name)
  if (finished(dir)) return dir
  const demo = JSON.parse(readFileSync(join(root, "examples/calculator/demo.json"), "utf8"))
  const warm = join(out, `seed${seed}-grpo`, "checkpoints", "step-000000")
  const config = {
    ...demo,
    seed,
    output: dir,
    model: { ...demo.model, path: join(out, "models", `seed${seed}`), ...(fromWarmup ? { from: warm } : {}) },
    data: { train: join(out, "data/train.jsonl"), eval: join(out, "data/heldout.jsonl") },
    warmup: !fromWarmup
      ? {
        ...demo.warmup,
        data: join(out, "data/demos.jsonl"),
        stopAt: { ...demo.warmup.stopAt, data: join(out, "data/validation.jsonl") }
      }
      : undefined,
    algorithm: { ...demo.algorithm, ...variants[loss], ...(miniBatches === 1 ? {} : { miniBatches }) },
    checkpoint: { every: 10, keep: 3 }
  }
  const path = join(out, `${name}.json`)
  writeFileSync(path, JSON.stringify(config, null, 2))
  const started = performance.now()
  const child = spawnSync(join(root, "bin/agentfly.mjs"), ["train", path, "--overwrite"], {
    cwd: root,
    encoding: "utf8",
    maxBuffer: 64 * 2 ** 20
  })
  if (child.status !== 0) throw new Error(`${name}: exited with ${child.status}\n${child.stderr}\n${child.stdout}`)
  console.error(`${name}: ${((performance.now() - started) / 1000).toFixed(0)} s`)
  return dir
}

export default async (miniBatches = Number(process.env["MINI_BATCHES"] ?? "1")): Promise<BenchResult> => {
  mkdirSync(out, { recursive: true })
  if (!existsSync(join(out, "data/train.jsonl"))) {
    const generated = spawnSync(
      "npx",
      ["tsx", "examples/calculator/generate.ts", join(out, "data"), "12345", "0.5", "--kind", "sums"],
      { cwd: root, encoding: "utf8" }
    )
    if (generated.status !== 0) throw new Error(`generate: ${generated.stderr}`)
  }
  const seeds = (process.env["SEEDS"] ?? "1,2,3").split(",").map(Number)
  const losses = (process.env["LOSSES"] ?? Object.keys(variants).join(",")).split(",")
  const rows: Array<Record<string, number | string>> = []
  // Loss by loss (GRPO first: the others start from its warm-ups), so that a cut-short run has whole comparisons.
  for (const loss of losses) {
    for (const seed of seeds) {
      const dir = run(seed, loss, miniBatches)
      const e = evals(dir)
      const first = e[0]!.figures, last = e.at(-1)!.figures
      const row = {
        seed,
        loss,
        before: first["eval/accuracy"]!,
        beforeSe: first["eval/accuracy_se"]!,
        after: last["eval/accuracy"]!,
        afterSe: last["eval/accuracy_se"]!,
        gain: last["eval/accuracy"]! - first["eval/accuracy"]!
      }
      rows.push(row)
      console.error(JSON.stringify(row))
    }
  }
  const meanGain = (loss: string) => {
    const g = rows.filter((r) => r.loss === loss).map((r) => r.gain as number)
    return g.reduce((a, b) => a + b, 0) / Math.max(1, g.length)
  }
  const gains = Object.fromEntries(losses.map((l) => [l, meanGain(l)]))
  const best = Math.max(...losses.filter((l) => l !== "grpo").map(meanGain))
  return {
    headline: {
      metric: "best other loss's mean gain minus GRPO's",
      value: best - meanGain("grpo"),
      target: 0,
      better: "higher"
    },
    rows,
    gains
  }
}
