/**
 * `npm run bench -- NAME` runs `bench/NAME.ts`, writes `bench/results/NAME.json` and prints one summary line.
 *
 * A benchmark module default-exports a function returning its figures and a `headline`:
 * `{ metric, value, target, better: "higher" | "lower" }`, the target being the issue's. Figures are reported
 * against a baseline measured in the same run, because these machines are shared and absolute times drift.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

export interface Headline {
  readonly metric: string
  readonly value: number
  readonly target: number
  readonly better: "higher" | "lower"
}

export interface BenchResult {
  readonly headline: Headline
  readonly [figure: string]: unknown
}

const here = dirname(fileURLToPath(import.meta.url))
const name = process.argv[2]
if (name === undefined || !/^[a-z0-9_-]+$/.test(name)) {
  console.error("usage: npm run bench -- NAME   (a file bench/NAME.ts)")
  process.exit(2)
}
const bench = (await import(join(here, `${name}.ts`))) as { default: () => Promise<BenchResult> }
const result = await bench.default()
const { headline } = result
const met = headline.better === "higher" ? headline.value >= headline.target : headline.value <= headline.target
mkdirSync(join(here, "results"), { recursive: true })
writeFileSync(
  join(here, "results", `${name}.json`),
  JSON.stringify({ name, date: new Date().toISOString(), ...result }, null, 2) + "\n"
)
console.log(
  `${name}: ${headline.metric} = ${headline.value.toPrecision(4)} (target ${
    headline.better === "higher" ? "≥" : "≤"
  } ${headline.target}) ${met ? "MET" : "NOT MET"}`
)
