/**
 * On-policy distillation on the README's first command's task, against GRPO alone, 3 seeds, the same 20 RL steps.
 *
 * The teacher is the demo's GRPO-trained policy of seed 1 (`runs/bench-losses/seed1-grpo`, step 20: held-out 0.648),
 * the students each seed's warm-up (`runs/bench-losses/seedN-grpo/checkpoints/step-000000`), so run
 * `npm run bench -- losses` (its GRPO runs at least: `LOSSES=grpo`) first. Each student trains with
 * `algorithm.distillation` (coef 1, rewardWeight 1: the teacher's reverse KL added to GRPO's advantages); the GRPO
 * arm is that bench's run of the seed. Held-out accuracy (500 questions, T = 1) before and after, and the RL phase's
 * wall time, are read from each run's `metrics.jsonl`. A finished run is not run again.
 *
 * `nice -n 10 npm run bench -- distill` (env `SEEDS=1,2` chooses seeds).
 */
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import type { BenchResult } from "./run.ts"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const losses = join(root, "runs", "bench-losses")
const out = join(root, "runs", "bench-distill")

interface Entry {
  readonly step: number
  readonly phase?: string
  readonly elapsed: number
  readonly figures: { readonly [key: string]: number }
}

const records = (dir: string) =>
  readFileSync(join(dir, "metrics.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Entry)

const evals = (dir: string) => records(dir).filter((r) => r.figures["eval/accuracy"] !== undefined)

const finished = (dir: string) => existsSync(join(dir, "metrics.jsonl")) && evals(dir).some((r) => r.step === 20)

/** Seconds from the end of the step-0 evaluation to the last training step. */
const rlSeconds = (dir: string) => {
  const all = records(dir)
  const start = all.find((r) => r.phase === "eval")!.elapsed
  return all.filter((r) => r.phase === "train").at(-1)!.elapsed - start
}

const distill = (seed: number) => {
  const dir = join(out, `seed${seed}-distill`)
  if (finished(dir)) return dir
  const base = JSON.parse(readFileSync(join(losses, `seed${seed}-grpo.json`), "utf8"))
  const { warmup: _warmup, ...rest } = base
  const config = {
    ...rest,
    output: dir,
    model: { ...base.model, from: join(losses, `seed${seed}-grpo`, "checkpoints", "step-000000") },
    algorithm: {
      ...base.algorithm,
      distillation: {
        teacher: {
          path: join(losses, "models", "seed1"),
          checkpoint: join(losses, "seed1-grpo/checkpoints/step-000020")
        },
        coef: 1,
        rewardWeight: 1
      }
    }
  }
  mkdirSync(out, { recursive: true })
  const path = join(out, `seed${seed}-distill.json`)
  writeFileSync(path, JSON.stringify(config, null, 2))
  const child = spawnSync(join(root, "bin/agentfly.mjs"), ["train", path, "--overwrite"], {
    cwd: root,
    encoding: "utf8",
    maxBuffer: 64 * 2 ** 20
  })
  if (child.status !== 0) throw new Error(`seed ${seed}: exited with ${child.status}\n${child.stderr}\n${child.stdout}`)
  return dir
}

export default async (): Promise<BenchResult> => {
  const seeds = (process.env["SEEDS"] ?? "1,2,3").split(",").map(Number)
  const rows: Array<Record<string, number | string>> = []
  for (const seed of seeds) {
    for (const [arm, dir] of [["grpo", join(losses, `seed${seed}-grpo`)], ["distill", distill(seed)]] as const) {
      if (!finished(dir)) throw new Error(`${dir} is not a finished run: run npm run bench -- losses first`)
      const e = evals(dir)
      const first = e[0]!.figures, last = e.at(-1)!.figures
      const row = {
        seed,
        arm,
        before: first["eval/accuracy"]!,
        after: last["eval/accuracy"]!,
        afterSe: last["eval/accuracy_se"]!,
        gain: last["eval/accuracy"]! - first["eval/accuracy"]!,
        rlSeconds: rlSeconds(dir)
      }
      rows.push(row)
      console.error(JSON.stringify(row))
    }
  }
  const mean = (arm: string) => {
    const g = rows.filter((r) => r.arm === arm).map((r) => r.gain as number)
    return g.reduce((a, b) => a + b, 0) / Math.max(1, g.length)
  }
  return {
    headline: {
      metric: "distillation's mean held-out gain minus GRPO's",
      value: mean("distill") - mean("grpo"),
      target: 0,
      better: "higher"
    },
    rows
  }
}
