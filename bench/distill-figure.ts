/**
 * Issue 48's distillation figure: the `small` preset's trained calculator agent distilled into `tiny` by on-policy
 * distillation, against SFT on the teacher's samples and against GRPO alone, at **equal CPU time**, 3 seeds.
 *
 * - Teacher: the demo's config (`examples/calculator/demo.json`) with `model.preset: "small"`, learning rates 5e-4
 *   for the warm-up (at the demo's 2e-3 `small` does not learn it) and 7.5e-5 for RL (at the demo's 3e-4 it
 *   collapsed), seed 1, trained once (warm-up to 0.3 greedy validation, 20 GRPO steps); its step-20 checkpoint is
 *   the teacher.
 *   Or an existing teacher (`TEACHER_CHECKPOINT` and `TEACHER_MODEL`: e.g. one trained elsewhere at another learning
 *   rate), used as it is; its held-out accuracy is measured here as the arms' are.
 * - Per seed S, the three arms back to back (so that they see the same load of the shared machine):
 *   1. **GRPO**: the demo's config with seed S (its warm-up inline; its step-0 checkpoint is every arm's start);
 *      20 RL steps.
 *   2. **distil**: from that warm-up, `algorithm.distillation` (the teacher's per-token reverse KL added to GRPO's
 *      advantages, `DISTILL_COEF`·KL + `DISTILL_REWARD_WEIGHT`·A, default 1 and 1; the run is named after them, so
 *      a sweep's runs sit side by side), `DISTILL_STEPS` RL steps.
 *   3. **SFT**: the teacher samples `16·SFT_STEPS` training questions at temperature 1 (`agentfly eval --demos`,
 *      seed S; every episode that ended without an error, right or wrong: SFT on the teacher's samples, not on its
 *      correct ones), then the student's warm-up is fine-tuned on them for `SFT_STEPS` steps (batch 16, lr 2e-3 or
 *      `SFT_LR`, named in the run when not 2e-3; up to 10 warm-up steps, cosine); its held-out figure is the run's
 *      step-0 evaluation, after which the run is stopped.
 * - Budget: each arm's **CPU time** (user + sys of its process, from `/proc/PID/stat`), counting only the arm's
 *   training: GRPO and distil from the end of the step-0 evaluation to the last RL step's record; SFT the teacher's
 *   sampling process (less its fixed start-up cost, calibrated) plus the SFT steps. CPU time rather than wall time
 *   because the machine is shared and its load changes within minutes: wall time would charge an arm for other
 *   people's jobs. The step counts are fixed beforehand from one calibration (`CALIBRATE=1`: seed 1's GRPO run, which
 *   also gives an SFT step's cost from its warm-up, a 5-step distil run, the teacher sampling 16 and 80 questions) so
 *   that each arm's CPU time matches GRPO's 20 steps; the results report every arm's measured CPU and wall time,
 *   which shows how equal they came out.
 * - Held-out: 500 questions at temperature 1 (the demo's evaluation), before (GRPO's step 0) and after.
 *
 * `nice -n 10 npm run bench -- distill-figure` (env `SEEDS=1,2,3`, `DISTILL_STEPS`, `SFT_STEPS`, `CALIBRATE=1`;
 * `ARMS=grpo,distill,sft` (default), a subset (`ARMS=grpo`: the GRPO arms alone, no teacher needed), or
 * `ARMS=calibrate`: the calibration alone, which may use a stand-in teacher of the teacher's architecture (its costs
 * are the architecture's, not the weights'); `TEACHER=tiny` (`TEACHER_STEPS`): the substitute teacher).
 * Writes `runs/distill/…` and `bench/results/distill-figure.json` (with every arm's run at every setting tried).
 * A finished run is not run again, whatever the teacher: remove `runs/distill/seedN-…` when the teacher changes.
 */
import { spawn, spawnSync } from "node:child_process"
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import type { BenchResult } from "./run.ts"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const out = join(root, "runs", "distill")
const agentfly = join(root, "bin/agentfly.mjs")
/**
 * The teacher: `small` (the issue's: the demo's config on the small preset) or `tiny` (a substitute where `small`
 * cannot be trained: seed 1's GRPO arm trained `TEACHER_STEPS`, default 40, more GRPO steps from its step 20).
 */
const teacherKind = process.env["TEACHER"] ?? "small"
/**
 * An existing teacher, used as it is (not trained here): `TEACHER_CHECKPOINT` (a checkpoint directory) and
 * `TEACHER_MODEL` (its model folder), both or neither. Its held-out accuracy is measured here (`agentfly eval`).
 */
const externalCheckpoint = process.env["TEACHER_CHECKPOINT"]
const externalModel = process.env["TEACHER_MODEL"]
if ((externalCheckpoint === undefined) !== (externalModel === undefined)) {
  throw new Error("TEACHER_CHECKPOINT and TEACHER_MODEL name an existing teacher together: give both or neither")
}
const external = externalCheckpoint !== undefined
const teacherSteps = teacherKind === "small" ? 20 : Number(process.env["TEACHER_STEPS"] ?? "40")
const teacherName = external ? "teacher-external" : teacherKind === "small" ? "teacher" : `teacher-tiny${teacherSteps}`
/** Appended to the distillation and SFT arms' names: each substitute teacher's arms are runs of their own. */
const tag = teacherKind === "small" ? "" : `-${teacherName}`
const teacherModel = externalModel ?? join(out, "models", teacherKind)
const teacherCheckpoint = externalCheckpoint ??
  join(out, teacherName, "checkpoints", `step-${String(teacherSteps).padStart(6, "0")}`)
/** The distillation arms' weights (`algorithm.distillation`'s `coef` and `rewardWeight`), in their names. */
const coef = Number(process.env["DISTILL_COEF"] ?? "1")
const rewardWeight = Number(process.env["DISTILL_REWARD_WEIGHT"] ?? "1")
/** The SFT arm's learning rate (the demo's warm-up's, 2e-3, by default). */
const sftLr = Number(process.env["SFT_LR"] ?? "0.002")

interface Entry {
  readonly step: number
  readonly phase?: string
  readonly elapsed: number
  readonly figures: { readonly [key: string]: number }
}

/** A process's CPU seconds so far (user + sys), from `/proc/PID/stat` (clock ticks of 1/100 s). */
const cpuOf = (pid: number): number | undefined => {
  const stat = existsSync(`/proc/${pid}/stat`) ? readFileSync(`/proc/${pid}/stat`, "utf8") : undefined
  if (stat === undefined) return undefined
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return (Number(fields[11]) + Number(fields[12])) / 100
}

const records = (dir: string): Array<Entry> =>
  existsSync(join(dir, "metrics.jsonl"))
    ? readFileSync(join(dir, "metrics.jsonl"), "utf8").trim().split("\n").filter((l) => l !== "")
      .map((l) => JSON.parse(l) as Entry)
    : []

const evalAt = (dir: string, step: number) =>
  records(dir).find((r) => r.phase === "eval" && r.step === step && r.figures["eval/accuracy"] !== undefined)

interface Mark {
  readonly cpu: number
  readonly wall: number
}

/**
 * Runs a command, reading its CPU time and the wall clock whenever `watch` (given the run's records so far) names a
 * new mark; `stop` ends the process early (SIGTERM) once it holds. Resolves with the marks and the totals.
 */
const measured = (
  args: ReadonlyArray<string>,
  watch: (entries: ReadonlyArray<Entry>) => ReadonlyArray<string>,
  dir: string | undefined,
  stop: (entries: ReadonlyArray<Entry>) => boolean = () => false
) =>
  new Promise<{ marks: Record<string, Mark>; total: Mark }>((resolve, reject) => {
    const started = performance.now()
    const child = spawn(args[0]!, args.slice(1), { cwd: root, stdio: ["ignore", "ignore", "pipe"] })
    let stderr = ""
    let last = 0
    child.stderr.on("data", (chunk: Buffer) => void (stderr = (stderr + chunk.toString()).slice(-20_000)))
    const marks: Record<string, Mark> = {}
    let stopped = false
    const poll = () => {
      const cpu = cpuOf(child.pid!)
      if (cpu !== undefined) last = cpu
      if (dir === undefined || cpu === undefined) return
      const entries = records(dir)
      for (const name of watch(entries)) {
        if (marks[name] === undefined) marks[name] = { cpu, wall: (performance.now() - started) / 1000 }
      }
      if (!stopped && stop(entries)) {
        stopped = true
        child.kill("SIGTERM")
      }
    }
    const timer = setInterval(poll, 200)
    child.on("exit", (code) => {
      clearInterval(timer)
      poll()
      const total = { cpu: last, wall: (performance.now() - started) / 1000 }
      if (code !== 0 && !stopped) reject(new Error(`${args.join(" ")}: exited with ${code}\n${stderr}`))
      else resolve({ marks, total })
    })
  })

const demo = () => JSON.parse(readFileSync(join(root, "examples/calculator/demo.json"), "utf8"))

const baseConfig = (seed: number, output: string) => {
  const d = demo()
  return {
    ...d,
    seed,
    output,
    model: { ...d.model, path: join(out, "models", "tiny") },
    data: { train: join(out, "data/train.jsonl"), eval: join(out, "data/heldout.jsonl") },
    warmup: {
      ...d.warmup,
      data: join(out, "data/demos.jsonl"),
      stopAt: { ...d.warmup.stopAt, data: join(out, "data/validation.jsonl") }
    },
    checkpoint: { every: 10, keep: 3 }
  }
}

const write = (name: string, config: unknown) => {
  const path = join(out, `${name}.json`)
  writeFileSync(path, JSON.stringify(config, null, 2))
  return path
}

const trainArgs = (path: string) => ["nice", "-n", "10", agentfly, "train", path, "--overwrite"]

/**
 * Marks: `start` at the end of the step-0 evaluation, `end` at step `steps`' training record (the arm's RL steps);
 * `warmStart`/`warmEnd` at the warm-up's steps 1 and 99 (an SFT step's cost, before its first validation check).
 */
const rlWatch = (steps: number) => (entries: ReadonlyArray<Entry>) => [
  ...(entries.some((r) => r.phase === "warmup" && r.step === 1) ? ["warmStart"] : []),
  ...(entries.some((r) => r.phase === "warmup" && r.step === 99) ? ["warmEnd"] : []),
  ...(entries.some((r) => r.phase === "eval" && r.step === 0) ? ["start"] : []),
  ...(entries.some((r) => r.phase === "train" && r.step === steps) ? ["end"] : [])
]

const span = (marks: Record<string, Mark>) => ({
  cpu: marks["end"]!.cpu - marks["start"]!.cpu,
  wall: marks["end"]!.wall - marks["start"]!.wall
})

interface Arm {
  readonly before?: number
  readonly after: number
  readonly afterSe: number
  readonly cpu: number
  readonly wall: number
  readonly steps: number
  readonly teacherKl?: number
  /** CPU seconds of one warm-up (SFT) step, batch 16: the GRPO arm's warm-up steps 2–99. */
  readonly sftStepCpu?: number
}

const saved = (name: string): Arm | undefined =>
  existsSync(join(out, `${name}.result.json`))
    ? JSON.parse(readFileSync(join(out, `${name}.result.json`), "utf8")) as Arm
    : undefined

const save = (name: string, arm: Arm) => {
  writeFileSync(join(out, `${name}.result.json`), JSON.stringify(arm, null, 2))
  console.error(`${name}: ${JSON.stringify(arm)}`)
  return arm
}

/** An RL arm (GRPO, or distillation from the warm-up of `seed`): `steps` RL steps, measured. */
const rlArm = async (name: string, config: Record<string, unknown>, steps: number): Promise<Arm> => {
  const done = saved(name)
  if (done !== undefined) return done
  const dir = join(out, name)
  const { marks } = await measured(trainArgs(write(name, config)), rlWatch(steps), dir)
  const first = evalAt(dir, 0)!.figures, last = evalAt(dir, steps)!.figures
  const kl = records(dir).filter((r) => r.phase === "train" && r.figures["learner/teacher_kl"] !== undefined)
  return save(name, {
    before: first["eval/accuracy"]!,
    after: last["eval/accuracy"]!,
    afterSe: last["eval/accuracy_se"]!,
    steps,
    ...span(marks),
    ...(marks["warmEnd"] === undefined ? {} : { sftStepCpu: (marks["warmEnd"].cpu - marks["warmStart"]!.cpu) / 98 }),
    ...(kl.length === 0 ? {} : { teacherKl: kl.at(-1)!.figures["learner/teacher_kl"]! })
  })
}

const warm = (seed: number) => join(out, `seed${seed}-grpo`, "checkpoints", "step-000000")

const grpo = (seed: number) => rlArm(`seed${seed}-grpo`, baseConfig(seed, join(out, `seed${seed}-grpo`)), 20)

/** Named after its weights, and its step count where `DISTILL_STEPS` overrides the calibrated one. */
const distillName = (seed: number) =>
  `seed${seed}-distill-c${coef}-rw${rewardWeight}${
    process.env["DISTILL_STEPS"] === undefined ? "" : `-s${process.env["DISTILL_STEPS"]}`
  }${tag}`

const distill = (seed: number, steps: number, name = distillName(seed), evalSize = 500) => {
  const { warmup: _warmup, ...base } = baseConfig(seed, join(out, name))
  return rlArm(name, {
    ...base,
    model: { ...base.model, from: warm(seed) },
    algorithm: {
      ...base.algorithm,
      steps,
      distillation: {
        teacher: { path: teacherModel, checkpoint: teacherCheckpoint },
        coef,
        rewardWeight
      }
    },
    eval: { ...base.eval, every: steps, size: evalSize }
  }, steps)
}

/** The teacher's samples of the first `questions` training questions, as demonstrations; its CPU and wall time. */
const teacherSamples = async (seed: number, questions: number, file: string) => {
  const { total } = await measured(
    [
      "nice",
      "-n",
      "10",
      agentfly,
      "eval",
      join(out, `${teacherName}.json`),
      "--checkpoint",
      teacherCheckpoint,
      "--data",
      join(out, "data/train.jsonl"),
      "--size",
      String(questions),
      "--temperature",
      "1",
      "--seed",
      String(seed),
      "--output",
      `${file}.eval.json`,
      "--demos",
      file
    ],
    () => [],
    undefined
  )
  return total
}

/** SFT on the teacher's samples from the warm-up of `seed`: `steps` steps of 16 samples, each sample used once. */
const sft = async (
  seed: number,
  steps: number,
  samplingFixed: number,
  name = `seed${seed}-sft${sftLr === 0.002 ? "" : `-lr${sftLr}`}${tag}`
): Promise<Arm> => {
  const done = saved(name)
  if (done !== undefined) return done
  const demos = join(out, `${name}-teacher.jsonl`)
  const sampling = await teacherSamples(seed, 16 * steps, demos)
  const teacherAccuracy = (JSON.parse(readFileSync(`${demos}.eval.json`, "utf8")) as {
    figures: Record<string, number>
  }).figures["eval/accuracy"]!
  const base = baseConfig(seed, join(out, name))
  const config = {
    ...base,
    model: { ...base.model, from: warm(seed) },
    warmup: {
      data: demos,
      steps,
      lr: sftLr,
      lrSchedule: "cosine",
      warmupSteps: Math.min(10, Math.floor(steps / 5)),
      batchSize: 16
    },
    algorithm: { ...base.algorithm, steps: 1 }
  }
  const dir = join(out, name)
  const watch = (entries: ReadonlyArray<Entry>) => [
    ...(entries.some((r) => r.phase === "warmup" && r.step === 1) ? ["start"] : []),
    ...(entries.some((r) => r.phase === "warmup" && r.step === steps) ? ["end"] : [])
  ]
  const { marks } = await measured(
    trainArgs(write(name, config)),
    watch,
    dir,
    (entries) => entries.some((r) => r.phase === "eval" && r.step === 0)
  )
  const tuned = span(marks)
  // The marks start after step 1: its share is added back as the mean of the others.
  const scale = steps / (steps - 1)
  const after = evalAt(dir, 0)!.figures
  return save(name, {
    after: after["eval/accuracy"]!,
    afterSe: after["eval/accuracy_se"]!,
    steps,
    // The sampling process's fixed cost (calibrated) is left out, as the RL arms' start-up is.
    cpu: sampling.cpu - samplingFixed + tuned.cpu * scale,
    wall: sampling.wall * (1 - samplingFixed / sampling.cpu) + tuned.wall * scale,
    samplingCpu: sampling.cpu,
    samplingWall: sampling.wall,
    // How often the teacher's samples (all of them are the SFT data) answered right.
    teacherSampleAccuracy: teacherAccuracy
  } as Arm)
}

/** Trains the teacher unless it is trained; its held-out accuracy before and after its RL steps. */
const trainTeacher = () => {
  const dir = join(out, teacherName)
  if (evalAt(dir, teacherSteps) === undefined) {
    const base = baseConfig(1, dir)
    const { warmup: _warmup, ...rest } = base
    const path = write(
      teacherName,
      teacherKind === "small"
        ? {
          ...base,
          model: { path: teacherModel, preset: "small", initSeed: 1 },
          // The demo's warm-up learning rate, 2e-3, leaves `small` on the loss plateau of 0.35 (no digit copied) for
          // 150+ steps; at 5e-4 it reaches 0.93 greedy validation accuracy at step 250 (BENCHMARKS, "distillation").
          warmup: { ...base.warmup, lr: 0.0005 },
          // At the demo's RL learning rate, 3e-4, the `small` policy collapsed in 2 steps (every tool call invalid,
          // reward 0 from step 3, held-out 0.000). 7.5e-5 keeps the warm-up's ratio to the demo; not yet measured.
          algorithm: { ...base.algorithm, lr: 0.000075 },
          checkpoint: demo().checkpoint
        }
        : {
          ...rest,
          model: { ...rest.model, from: join(out, "seed1-grpo", "checkpoints", "step-000020") },
          algorithm: { ...rest.algorithm, steps: teacherSteps },
          eval: { ...rest.eval, every: teacherSteps }
        }
    )
    const child = spawnSync(trainArgs(path)[0]!, trainArgs(path).slice(1), { cwd: root, encoding: "utf8" })
    if (child.status !== 0) throw new Error(`${teacherName}: exited with ${child.status}\n${child.stderr}`)
  }
  const accuracy = (step: number) => evalAt(dir, step)!.figures["eval/accuracy"]!
  return { before: accuracy(0), after: accuracy(teacherSteps) }
}

/**
 * An existing teacher (`TEACHER_CHECKPOINT`): its config for sampling (the demo's with its model folder), and its
 * held-out accuracy measured as the arms' are (500 questions, temperature 1), once.
 */
const externalConfig = () =>
  write(teacherName, { ...baseConfig(1, join(out, teacherName)), model: { path: teacherModel } })

const externalTeacher = () => {
  const path = externalConfig()
  const result = join(out, `${teacherName}.heldout.json`)
  if (!existsSync(result)) {
    const args = ["nice", "-n", "10", agentfly, "eval", path, "--checkpoint", teacherCheckpoint, "--output", result]
    const child = spawnSync(args[0]!, args.slice(1), { cwd: root, encoding: "utf8" })
    if (child.status !== 0) throw new Error(`${teacherName}: eval exited with ${child.status}\n${child.stderr}`)
  }
  const { figures } = JSON.parse(readFileSync(result, "utf8")) as { figures: Record<string, number> }
  return {
    checkpoint: teacherCheckpoint,
    after: figures["eval/accuracy"]!,
    afterSe: figures["eval/accuracy_se"]!,
    invalidToolCallRate: figures["eval/invalid_tool_call_rate"]!
  }
}

interface Calibration {
  /**
   * CPU seconds: GRPO's 20 steps (seed 1), a distillation step, the teacher's sampling process (`samplingFixed`: its
   * start-up, loading and the like, + `samplingPerQuestion` a question), an SFT step.
   */
  readonly budget: number
  readonly distillStep: number
  readonly samplingFixed: number
  readonly samplingPerQuestion: number
  readonly sftStep: number
  readonly distillSteps: number
  readonly sftSteps: number
}

/**
 * Seed 1's GRPO run (the budget, and an SFT step's cost from its warm-up), a 5-step distillation run (evaluated on
 * 50 questions), the teacher sampling 16 and 80 questions (a line through the two: a question's cost and the
 * process's fixed cost, which the RL arms' budgets do not count either: theirs start after their start-up).
 */
const calibrate = async (): Promise<Calibration> => {
  const reference = await grpo(1)
  const pilot = await distill(1, 5, `calibrate-distill${tag}`, 50)
  const few = await teacherSamples(1, 16, join(out, `calibrate-16${tag}.jsonl`))
  const many = await teacherSamples(1, 80, join(out, `calibrate-80${tag}.jsonl`))
  const samplingPerQuestion = (many.cpu - few.cpu) / 64
  const samplingFixed = Math.max(0, few.cpu - 16 * samplingPerQuestion)
  const sftStep = reference.sftStepCpu!
  const distillStep = pilot.cpu / 5
  const calibration: Calibration = {
    budget: reference.cpu,
    distillStep,
    samplingFixed,
    samplingPerQuestion,
    sftStep,
    distillSteps: Math.round(reference.cpu / distillStep),
    sftSteps: Math.floor(reference.cpu / (16 * samplingPerQuestion + sftStep))
  }
  writeFileSync(join(out, `calibration${tag}.json`), JSON.stringify(calibration, null, 2))
  console.error(`calibration: ${JSON.stringify(calibration)}`)
  return calibration
}

const mean = (xs: ReadonlyArray<number>) => xs.reduce((a, b) => a + b, 0) / xs.length
const se = (xs: ReadonlyArray<number>) =>
  Math.sqrt(xs.reduce((a, x) => a + (x - mean(xs)) ** 2, 0) / (xs.length - 1) / xs.length)

const armNames = ["grpo", "distill", "sft"] as const
type ArmName = typeof armNames[number]

/** Per arm: the mean and standard error (over seeds) of its held-out accuracy after, and of its gain. */
const summaryOf = (rows: ReadonlyArray<Record<string, number | string>>) =>
  Object.fromEntries(armNames.filter((arm) => rows.some((r) => r.arm === arm)).map((arm) => {
    const of = rows.filter((r) => r.arm === arm)
    const after = of.map((r) => r["after"] as number), gain = of.map((r) => r["gain"] as number)
    return [arm, { after: mean(after), afterSe: se(after), gain: mean(gain), gainSe: se(gain) }]
  }))

/**
 * Every arm's run of every seed, by name: the figure's, and those at other settings (the `DISTILL_COEF`,
 * `DISTILL_REWARD_WEIGHT`, `DISTILL_STEPS` and `SFT_LR` sweeps).
 */
const allRuns = () =>
  Object.fromEntries(
    readdirSync(out).filter((f) => /^seed\d+-.*\.result\.json$/.test(f)).map((f) => {
      const name = f.replace(/\.result\.json$/, "")
      return [name, saved(name)!]
    })
  )

/** Calibration: read, or measured when `CALIBRATE=1` or none is saved. */
const calibration = async (): Promise<Calibration> =>
  process.env["CALIBRATE"] === "1" || !existsSync(join(out, `calibration${tag}.json`))
    ? await calibrate()
    : JSON.parse(readFileSync(join(out, `calibration${tag}.json`), "utf8")) as Calibration

const generateData = () => {
  if (existsSync(join(out, "data/train.jsonl"))) return
  const generated = spawnSync(
    "npx",
    ["tsx", "examples/calculator/generate.ts", join(out, "data"), "12345", "0.5", "--kind", "sums"],
    { cwd: root, encoding: "utf8" }
  )
  if (generated.status !== 0) throw new Error(`generate: ${generated.stderr}`)
}

export default async (): Promise<BenchResult> => {
  mkdirSync(out, { recursive: true })
  generateData()
  const seeds = (process.env["SEEDS"] ?? "1,2,3").split(",").map(Number)
  const requested = (process.env["ARMS"] ?? armNames.join(",")).split(",")
  if (requested.includes("calibrate")) {
    // The calibration alone: with a stand-in teacher of the same architecture (the cost is the architecture's).
    if (external) externalConfig()
    else trainTeacher()
    const calibrated = await calibrate()
    return {
      headline: {
        metric: "distillation steps in GRPO's CPU budget",
        value: calibrated.distillSteps,
        target: 1,
        better: "higher"
      },
      calibration: calibrated
    }
  }
  const arms = armNames.filter((arm) => requested.includes(arm))
  const needsTeacher = arms.some((arm) => arm !== "grpo")
  const teacher = !needsTeacher ? undefined : external ? externalTeacher() : trainTeacher()
  const calibrated = needsTeacher ? await calibration() : undefined
  const distillSteps = Number(process.env["DISTILL_STEPS"] ?? calibrated?.distillSteps ?? 0)
  const sftSteps = Number(process.env["SFT_STEPS"] ?? calibrated?.sftSteps ?? 0)
  const runArm = (arm: ArmName, seed: number): Promise<Arm> =>
    arm === "grpo" ? grpo(seed) : arm === "distill" ? distill(seed, distillSteps) :
    sft(seed, sftSteps, calibrated!.samplingFixed)
  const rows: Array<Record<string, number | string>> = []
  for (const seed of seeds) {
    // The arms of a seed back to back: the same load of the shared machine. GRPO's step 0 is every arm's start.
    const before = (await grpo(seed)).before!
    for (const arm of arms) {
      const r = await runArm(arm, seed)
      rows.push({ seed, arm, before, ...r, gain: r.after - before })
    }
  }
  const summary = summaryOf(rows)
  const headline = summary["distill"] === undefined || summary["grpo"] === undefined
    ? { metric: `mean held-out gain of ${arms.join(", ")}`, value: mean(rows.map((r) => r["gain"] as number)) }
    : {
      metric: "distillation's mean held-out gain minus GRPO's, at equal CPU time",
      value: summary["distill"].gain - summary["grpo"].gain
    }
  return {
    headline: { ...headline, target: 0, better: "higher" },
    ...(teacher === undefined ? {} : { teacher: { kind: teacherKind, external, ...teacher } }),
    ...(calibrated === undefined ? {} : { calibration: calibrated }),
    distillation: { steps: distillSteps, coef, rewardWeight },
    sftSteps,
    rows,
    summary,
    runs: allRuns()
  }
}
