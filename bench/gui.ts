/**
 * `npm run bench -- gui`
 *
 * The GUI task through the runtime against a bare loop, the same episodes both ways: 256 held-out rows of the
 * generator (click, form and menu goals on 64 × 64 screens), one chain a row, 64 chains at once.
 *
 * - `runtime`: `Oracle.rollout` with 64 concurrent chains: chain fibers, the `click`/`type` tools through the tool
 *   actor, per-chain screens from the provider, the episode drawing and PNG-encoding a new screen after every
 *   action, the byte tokenizer and Qwen2.5 template rendering each turn, the reward;
 * - `bare`: a loop calling the same functions directly: `Screen.start`, then per action the screen's PNG
 *   (`Render.dataUrl`, as the episode shows it), the oracle reading it back (`Render.decode`, `GuiOracle.next`) and
 *   `Screen.act`, until the episode ends;
 * - `floor` (reported beside the headline): the bare loop plus the runtime's bookkeeping of each turn (see `floor`).
 *
 * Both sides draw, encode and decode every screen (rendering included, as the issue asks). Environment steps
 * (actions) per second each way; headline: runtime ÷ bare (#16's target for environments, ≥ 0.67). Medians of
 * `ROUNDS` alternating rounds after `WARMUP` untimed rounds of each side (each side in a process of its own); the
 * load average is reported (a shared machine), and so is the CPU time per action each way (`cpuRatio`: bare ÷
 * runtime).
 *
 * Why eight warm-up rounds: the runtime is far more code than the bare loop, and V8 keeps compiling it (TurboFan, on
 * its worker threads, which `process.cpuUsage` counts) for about eight rounds of 256 episodes: measured per thread
 * (`/proc/self/task`) on the runtime alone, those threads used 200–400 µs of CPU an action in rounds 1–5, 100–160 in
 * rounds 6–13 and ≈ 50 after, and the main thread's own time fell from ≈ 850 to ≈ 530 µs an action by round 9
 * (2026-12-07, load ≈ 9).
 * After one warm-up round, a fifth to a third of the runtime's CPU in the timed rounds was that warming up; a run's
 * thousands of episodes see the steady state. The warm-up rounds' CPU per action is kept in the result (`warmup`),
 * so the curve stays visible.
 *
 * Why a process a side: run in one process, the two sides disturb each other's compiled code. The bare loop calls the
 * environment's functions (`GuiOracle.next`, `Render`, `Screen`) with objects of other shapes than the runtime's, and
 * V8 keeps deoptimising and recompiling shared code on its worker threads: measured 2026-12-07 (load ≈ 14), the
 * runtime alone used ≈ 590 µs of CPU an action, ≈ 65 of them off the main thread; alternating in one process with
 * bare loops, 880–990, ≈ 320–370 off the main thread (`--trace-deopt`: "wrong map" and "weak objects" deoptimisations
 * of the same functions round after round). Each side now runs in a child process of its own (`fork`), and the
 * rounds still alternate, so that both see the same load.
 */
import { Effect, Schema } from "effect"
import { fork } from "node:child_process"
import { loadavg } from "node:os"
import { performance } from "node:perf_hooks"
import { fileURLToPath } from "node:url"
import * as Oracle from "../actors/Oracle.ts"
import * as Generator from "../environments/gui/Generator.ts"
import * as GuiOracle from "../environments/gui/GuiOracle.ts"
import * as GuiTask from "../environments/gui/GuiTask.ts"
import * as Render from "../environments/gui/Render.ts"
import * as Screen from "../environments/gui/Screen.ts"
import type { Conversation, Message } from "../src/Message.ts"
import * as Tool from "../src/Tool.ts"

const CHAINS = 64
const ROWS = 256
const ROUNDS = 7
const WARMUP = 8

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

const rows = Generator.generate(31, ROWS)
const task = GuiTask.make()

/** CPU time of the process (every thread: the decoder's pool too) since `since`, in µs. */
const cpuSince = (since: NodeJS.CpuUsage): number => {
  const used = process.cpuUsage(since)
  return used.user + used.system
}

const runtime = Effect.gen(function*() {
  const start = performance.now()
  const cpu = process.cpuUsage()
  const played = yield* Oracle.rollout({ task, rows, policy: GuiOracle.oracle, concurrency: CHAINS })
  const cpuMicros = cpuSince(cpu)
  const seconds = (performance.now() - start) / 1000
  const steps = played.reduce((n, t) => n + t.metrics["reward/gui/steps"]!, 0)
  return {
    stepsPerSecond: steps / seconds,
    cpuMicrosPerStep: cpuMicros / steps,
    steps,
    solved: played.filter((t) => t.reward === 1).length
  }
})

/** The bare loop: the oracle reads each screen from its PNG, as it does through the runtime. */
const bare = () => {
  const start = performance.now()
  const cpu = process.cpuUsage()
  let steps = 0
  let solved = 0
  for (const row of rows) {
    let state = Screen.start(row.layout, row.goal, row.maxSteps)
    const messages: Array<Conversation[number]> = [{ role: "user", content: row.question }]
    while (state.outcome === undefined) {
      messages.push(GuiTask.screenMessage(state))
      const reply = GuiOracle.next(messages, Render.decode(GuiOracle.latestImage(messages)!))
      const call = reply.toolCalls?.[0]
      if (call === undefined) break
      const args = call.function.arguments as { x: number; y: number; text: string }
      const outcome = Screen.act(state, call.function.name === "type" ? { _tag: "type", text: args.text } : {
        _tag: "click",
        x: args.x,
        y: args.y
      })
      state = outcome.state
      steps++
      messages.push({ role: "assistant", content: "", tool_calls: [call] })
      messages.push({ role: "tool", tool_call_id: call.id, content: outcome.text })
    }
    if (state.outcome === "solved") solved++
  }
  const cpuMicrosPerStep = cpuSince(cpu) / steps
  return { stepsPerSecond: steps / ((performance.now() - start) / 1000), cpuMicrosPerStep, steps, solved }
}

interface Round {
  readonly stepsPerSecond: number
  readonly cpuMicrosPerStep: number
  readonly steps: number
  readonly solved: number
}

/** A side in a child process of its own: `round()` runs one round there and returns its figures. */
const side = (name: "runtime" | "bare" | "floor") => {
  const child = fork(fileURLToPath(import.meta.url), [sideFlag, name])
  let waiting: ((round: Round) => void) | undefined
  child.on("message", (message) => {
    const resolve = waiting
    waiting = undefined
    resolve?.(message as Round)
  })
  const round = () => Effect.promise(() => new Promise<Round>((resolve) => ((waiting = resolve), child.send("round"))))
  return { round, close: () => child.kill() }
}

const sideFlag = "--gui-bench-side"

const format = Oracle.visionByteFormat()
const decodeArguments = {
  click: Schema.decodeUnknownExit(Tool.argumentsCodec(GuiTask.click)),
  type: Schema.decodeUnknownExit(Tool.argumentsCodec(GuiTask.type))
}

/**
 * The floor of a synchronous turn: the bare loop plus the runtime's bookkeeping of a turn (the prompt rendered, the
 * assistant turn and the observations appended through the same format: Qwen2.5's tail renderer, the byte tokenizer,
 * the trajectory builder, the screens' image refs; the arguments decoded by the tools' Schemas), one episode after
 * the other, with no chain, actor, lease, reward or effect around them: what the runtime would cost if a turn of
 * in-process tools and environment ran as one synchronous step.
 */
const floor = () => {
  const start = performance.now()
  const cpu = process.cpuUsage()
  let steps = 0
  let solved = 0
  // What the runtime returns, kept to the end of the round as its trajectories are (the heap the GC walks).
  const kept: Array<unknown> = []
  for (const row of rows) {
    let state = Screen.start(row.layout, row.goal, row.maxSteps)
    const prompt: Conversation = [
      { role: "system", content: GuiTask.systemPrompt },
      { role: "user", content: row.question },
      GuiTask.screenMessage(state)
    ]
    const transcript = Effect.runSync(format.start(prompt, []))
    while (state.outcome === undefined) {
      const seen = transcript.messages()
      const reply = GuiOracle.next(seen, Render.decode(GuiOracle.latestImage(seen)!))
      const call = reply.toolCalls?.[0]
      if (call === undefined) break
      const turn: Message = { role: "assistant", content: reply.content ?? "", tool_calls: [call] }
      Effect.runSync(transcript.appendAssistant!(turn))
      const name = call.function.name === "type" ? "type" : "click"
      const args = decodeArguments[name](call.function.arguments)
      if (args._tag === "Failure") break
      const action = args.value as { x: number; y: number; text: string }
      const outcome = Screen.act(state, name === "type" ? { _tag: "type", text: action.text } : {
        _tag: "click",
        x: action.x,
        y: action.y
      })
      state = outcome.state
      steps++
      const observations: Array<Message> = [{ role: "tool", content: outcome.text, tool_call_id: call.id, name }]
      if (state.outcome === undefined) observations.push(GuiTask.screenMessage(state))
      Effect.runSync(transcript.appendObservations(observations))
    }
    if (state.outcome === "solved") solved++
    kept.push({ messages: transcript.messages(), segments: transcript.segments() })
  }
  const cpuMicrosPerStep = cpuSince(cpu) / steps
  return { stepsPerSecond: steps / ((performance.now() - start) / 1000), cpuMicrosPerStep, steps, solved }
}

const figures = Effect.gen(function*() {
  const loadBefore = loadavg()[0]!
  const sides = { runtime: side("runtime"), bare: side("bare"), floor: side("floor") }
  const warmup = { runtimeCpuMicrosPerStep: [] as Array<number>, bareCpuMicrosPerStep: [] as Array<number> }
  for (let r = 0; r < WARMUP; r++) {
    warmup.runtimeCpuMicrosPerStep.push((yield* sides.runtime.round()).cpuMicrosPerStep)
    warmup.bareCpuMicrosPerStep.push((yield* sides.bare.round()).cpuMicrosPerStep)
    yield* sides.floor.round()
  }
  const through: Array<number> = []
  const direct: Array<number> = []
  const throughCpu: Array<number> = []
  const directCpu: Array<number> = []
  const floorCpu: Array<number> = []
  let last = { runtime: { steps: 0, solved: 0 }, bare: { steps: 0, solved: 0 } }
  for (let r = 0; r < ROUNDS; r++) {
    const a = yield* sides.runtime.round()
    const b = yield* sides.bare.round()
    floorCpu.push((yield* sides.floor.round()).cpuMicrosPerStep)
    through.push(a.stepsPerSecond)
    direct.push(b.stepsPerSecond)
    throughCpu.push(a.cpuMicrosPerStep)
    directCpu.push(b.cpuMicrosPerStep)
    last = { runtime: a, bare: b }
  }
  sides.runtime.close()
  sides.bare.close()
  sides.floor.close()
  const state = Screen.start(rows[0]!.layout, rows[0]!.goal, rows[0]!.maxSteps)
  const t0 = performance.now()
  for (let i = 0; i < 200; i++) Render.png(state)
  const renderMs = (performance.now() - t0) / 200
  return {
    headline: {
      metric: `gui actions/s: runtime (Oracle.rollout, ${CHAINS} chains, the pixel-reading oracle) / bare loop`,
      value: median(through) / median(direct),
      target: 0.67,
      better: "higher" as const
    },
    runtime: {
      ...last.runtime,
      stepsPerSecond: median(through),
      rounds: through,
      cpuMicrosPerStep: median(throughCpu)
    },
    bare: { ...last.bare, stepsPerSecond: median(direct), rounds: direct, cpuMicrosPerStep: median(directCpu) },
    // CPU time per action, bare ÷ runtime: what the ratio would be on an idle machine (wall time at load 10–20
    // on 2 cores mostly measures the other jobs).
    cpuRatio: median(directCpu) / median(throughCpu),
    // The floor of a synchronous turn (`floor`): its CPU per action and bare ÷ floor, the bound of any redesign
    // of the chain that keeps the turn's bookkeeping.
    floor: { cpuMicrosPerStep: median(floorCpu), rounds: floorCpu, cpuRatio: median(directCpu) / median(floorCpu) },
    renderPngMs: renderMs,
    warmup,
    settings: {
      chains: CHAINS,
      rows: ROWS,
      rounds: ROUNDS,
      warmupRounds: WARMUP,
      width: 64,
      height: 64,
      template: "qwen2.5"
    },
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
})

// In a side's child process: a round per message, its figures sent back.
if (process.argv[2] === sideFlag) {
  const name = process.argv[3]
  process.on("message", () => {
    const round = name === "bare" ? Effect.sync(bare) : name === "floor" ? Effect.sync(floor) : runtime
    void Effect.runPromise(round).then((figures) => process.send!(figures))
  })
}

export default () => Effect.runPromise(figures)
