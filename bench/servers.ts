/**
 * `npm run bench -- servers`
 *
 * Sampling on inference servers that follow the learner (`actors/InferenceServers.ts`, `engine.servers`): the same
 * rollout-shaped load (`REQUESTS` token-id prompts of 40 ids, `NEW_TOKENS` sampled tokens each at temperature 1,
 * `CONCURRENCY` in flight, as a run's chains send them) on
 *
 * - `local`: a `PolicyEngine` in this process (batch 32, one onnxruntime thread), as a run without servers samples;
 * - `oneServer`: through `InferenceServers` to one `agentfly serve --accept-weights` process (batch 32, one thread);
 * - `twoServers`: the same to two such processes.
 *
 * Rounds alternate local / one / two after a warm-up round of each; medians of `ROUNDS`, with the CPU seconds of this
 * process and of each server per round (where the cores go). Also the learner's side: how long `push` takes to send
 * one version's weights to both servers (serialize, HTTP PUT over loopback, the servers' checks and new sessions),
 * for the tiny and small presets (medians of 5).
 *
 * Headline: one server ÷ local tokens/s, i.e. what moving sampling out of the trainer's process costs on the same
 * machine (target ≥ 0.67, chosen here: no issue sets this figure). Two servers on these 2 cores cannot show scaling
 * (one server and the client already keep both cores busy); the figure is recorded with its CPU split. The load
 * average is reported because the machine is shared.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect, FileSystem } from "effect"
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { readFileSync } from "node:fs"
import { loadavg } from "node:os"
import { join, resolve } from "node:path"
import * as InferenceServers from "../actors/InferenceServers.ts"
import * as PolicyEngine from "../actors/PolicyEngine.ts"
import type { Sampler } from "../src/Sampler.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"

const REQUESTS = 256
const CONCURRENCY = 64
const NEW_TOKENS = 64
const ROUNDS = 5

const root = resolve(import.meta.dirname, "..")
const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const prompt = (i: number) => Array.from({ length: 40 }, (_, k) => 20 + ((i * 7 + k * 13) % 200))

/** `agentfly serve --accept-weights` in a child process; its API root once it listens. */
const serve = (modelDir: string) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly child: ChildProcess; readonly url: string }, Error>((resume) => {
      const args = [
        "--import",
        "tsx",
        "cli/main.ts",
        "serve",
        "--model-dir",
        modelDir,
        "--port",
        "0",
        "--accept-weights"
      ]
      const child = spawn(process.execPath, args, { cwd: root, stdio: ["ignore", "pipe", "pipe"] })
      let text = ""
      child.stdout.on("data", (chunk: Buffer) => {
        text += chunk.toString()
        const url = /at (http:\/\/\S+\/v1)/.exec(text)?.[1]
        if (url !== undefined) resume(Effect.succeed({ child, url }))
      })
      child.on("exit", (code) => resume(Effect.fail(new Error(`serve exited with ${code}: ${text}`))))
    }),
    ({ child }) => Effect.sync(() => child.kill("SIGKILL"))
  )

/** CPU seconds a process has used (user + system), from `/proc`. */
const cpuSeconds = (pid: number) => {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")
  return (Number(fields[11]) + Number(fields[12])) / 100
}

/** One round: every request through `sampler`; tokens/s and the CPU seconds of this process and of `pids`. */
const round = (sampler: Pick<Sampler["Service"], "generate">, seed: number, pids: ReadonlyArray<number> = []) =>
  Effect.gen(function*() {
    const cpu0 = pids.map(cpuSeconds)
    const self0 = process.cpuUsage()
    const start = performance.now()
    const results = yield* Effect.forEach(
      Array.from({ length: REQUESTS }, (_, i) => i),
      (i) =>
        sampler.generate({
          promptTokenIds: prompt(i),
          sampling: { temperature: 1, maxTokens: NEW_TOKENS, seed: seed * 100_000 + i }
        }),
      { concurrency: CONCURRENCY }
    )
    const seconds = (performance.now() - start) / 1000
    const tokens = results.reduce((n, r) => n + r.tokenIds.length, 0)
    const self = process.cpuUsage(self0)
    return {
      tokensPerSecond: tokens / seconds,
      seconds,
      cpu: { self: (self.user + self.system) / 1e6, servers: pids.map((pid, i) => cpuSeconds(pid) - cpu0[i]!) }
    }
  })

type RoundFigures = Effect.Success<ReturnType<typeof round>>

const pushTimes = (preset: "tiny" | "small", dir: string) =>
  Effect.scoped(Effect.gen(function*() {
    const modelDir = join(dir, preset)
    yield* ModelFolder.init(modelDir, { preset, seed: 1 })
    const folder = yield* ModelFolder.load(modelDir)
    const a = yield* serve(modelDir)
    const b = yield* serve(modelDir)
    const parameters = Qwen2.parameters(folder.config)
    const servers = yield* InferenceServers.make({ urls: [a.url, b.url], parameters })
    const weights = Qwen2.initWeights(folder.config, 9)
    const ms: Array<number> = []
    for (let v = 1; v <= 6; v++) {
      const start = performance.now()
      yield* servers.push(v, weights)
      if (v > 1) ms.push(performance.now() - start)
    }
    const megabytes = parameters.reduce((n, p) => n + 4 * p.shape.reduce((x, y) => x * y, 1), 0) / 2 ** 20
    return { preset, megabytes, pushMs: median(ms), rounds: ms }
  }))

const figures = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const dir = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-bench-servers-" })
  const loadBefore = loadavg()[0]!
  const modelDir = join(dir, "tiny-sampling")
  yield* ModelFolder.init(modelDir, { preset: "tiny", seed: 1 })
  const folder = yield* ModelFolder.load(modelDir)
  const parameters = Qwen2.parameters(folder.config)
  const a = yield* serve(modelDir)
  const b = yield* serve(modelDir)
  const one = yield* InferenceServers.make({ urls: [a.url], parameters })
  const two = yield* InferenceServers.make({ urls: [a.url, b.url], parameters })
  // The same weights as version 1 through both clients (each is a run of its own: the later push replaces).
  const weights = Qwen2.initWeights(folder.config, 7)
  yield* one.push(1, weights)
  yield* two.push(1, weights)
  const engine = yield* PolicyEngine.make({ config: folder.config, weights, version: 1, maxBatchSize: 32 })
  const sides = {
    local: (seed: number) => round(engine, seed),
    oneServer: (seed: number) => round(one.sampler(1), seed, [a.child.pid!]),
    twoServers: (seed: number) => round(two.sampler(1), seed, [a.child.pid!, b.child.pid!])
  }
  for (const side of Object.values(sides)) yield* side(0)
  const rounds = {
    local: [] as Array<RoundFigures>,
    oneServer: [] as Array<RoundFigures>,
    twoServers: [] as Array<RoundFigures>
  }
  for (let r = 1; r <= ROUNDS; r++) {
    for (const [name, side] of Object.entries(sides)) rounds[name as keyof typeof sides].push(yield* side(r))
  }
  const summary = (xs: ReadonlyArray<RoundFigures>) => {
    const mid = [...xs].sort((x, y) => x.tokensPerSecond - y.tokensPerSecond)[Math.floor(xs.length / 2)]!
    return { tokensPerSecond: mid.tokensPerSecond, medianRound: mid, rounds: xs.map((x) => x.tokensPerSecond) }
  }
  const served = yield* two.status
  const push = [yield* pushTimes("tiny", dir), yield* pushTimes("small", dir)]
  const local = summary(rounds.local)
  const oneServer = summary(rounds.oneServer)
  const twoServers = summary(rounds.twoServers)
  return {
    headline: {
      metric: "sampling tokens/s: one agentfly serve process through InferenceServers / the local engine",
      value: oneServer.tokensPerSecond / local.tokensPerSecond,
      target: 0.67,
      better: "higher" as const
    },
    local,
    oneServer,
    twoServers: { ...twoServers, servedPerServer: served.map((s) => s.served) },
    twoOverOne: twoServers.tokensPerSecond / oneServer.tokensPerSecond,
    push,
    settings: { requests: REQUESTS, concurrency: CONCURRENCY, newTokens: NEW_TOKENS, promptTokens: 40, rounds: ROUNDS },
    loadAverage: { before: loadBefore, after: loadavg()[0]! }
  }
})

export default () => Effect.runPromise(Effect.scoped(figures).pipe(Effect.provide(NodeServices.layer)))
