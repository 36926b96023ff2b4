/**
 * No silent sync in a run: a LoRA run with `engine.servers` checks every sampled response's adapter digest against
 * what it published for that version. A proxy in front of `agentfly serve` passes the warm-up's adapter loads on
 * and then keeps the server on the last of them: every later load is passed on with that folder under the new
 * version number, so the server answers the new version (the version check alone passes) with the old adapter's digest.
 * (The proxy passes the warm-up's loads on: an adapter changes only when the learner trains it, and a random base
 * finds no reward signal in RL; the warm-up's SFT steps always change it.)
 * The run catches it at the next batch, counts it and stops, training on nothing it sampled.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import * as Http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as Train from "../../cli/train.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { calculatorRun } from "../utils/agentfly.ts"

const quiet = (lines: Array<string>) => ({ write: (t: string) => void lines.push(t), tty: false })

interface Load {
  readonly version: number
  readonly name: string
  readonly path: string
  readonly sent: string
}

/**
 * A proxy to `target`; with `lie`, it passes the warm-up's adapter loads (negative versions) on and answers every
 * later one by loading the last of those folders again under the new version (acknowledged, the old adapter kept).
 */
const proxy = (target: string, lie: boolean) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ server: Http.Server; url: string; loads: Array<Load> }>((resolve) => {
        const loads: Array<Load> = []
        const server = Http.createServer(async (req, res) => {
          const chunks: Array<Buffer> = []
          for await (const c of req) chunks.push(c as Buffer)
          let body: string | undefined = req.method === "GET" ? undefined : Buffer.concat(chunks).toString("utf8")
          // The run's probe before its first load (an empty body, refused as bad) passes through unrecorded.
          if (req.url?.endsWith("/load_lora_adapter") && body !== undefined && body !== "{}") {
            const load = JSON.parse(body) as { lora_name: string; lora_path: string; policy_version: number }
            // From the first RL version on, the newest folder loaded before it stays.
            const keep = lie && load.policy_version >= 0 && loads.length > 0
            const sent = keep ? loads[loads.length - 1]!.sent : load.lora_path
            loads.push({ version: load.policy_version, name: load.lora_name, path: load.lora_path, sent })
            body = JSON.stringify({ ...load, lora_path: sent })
          }
          const upstream = await fetch(`${target}${req.url!.replace(/^\/v1/, "")}`, {
            method: req.method!,
            headers: { "content-type": "application/json" },
            ...(body === undefined ? {} : { body })
          })
          res.writeHead(upstream.status, { "content-type": "application/json" }).end(await upstream.text())
        })
        server.listen(0, "127.0.0.1", () => {
          const port = (server.address() as { port: number }).port
          resolve({ server, url: `http://127.0.0.1:${port}/v1`, loads })
        })
      })
    ),
    ({ server }) => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve())))
  )

const lora = { rank: 2, alpha: 4, targets: ["q_proj", "v_proj"] }

/** A LoRA run (an SFT warm-up trains the adapter, then GRPO) sampled by `agentfly serve` behind a proxy. */
const setup = (lie: boolean) =>
  Effect.gen(function*() {
    // Removed with the test's scope (the run leaves a model, checkpoints and adapter folders).
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "lora-digest-"))),
      (made) => Effect.sync(() => rmSync(made, { recursive: true, force: true }))
    )
    yield* Generate.write({ dir: join(dir, "data"), seed: 4, train: 8, heldOut: 2, validation: 2, demos: 16, noise: 0 })
    yield* ModelFolder.init(join(dir, "model"), { preset: "tiny", seed: 3 })
    const folder = yield* ModelFolder.load(join(dir, "model"))
    const engine = yield* PolicyEngine.make({ config: folder.config, weights: folder.weights })
    const server = yield* OpenAiServer.make(folder, { acceptWeights: {}, loraBase: folder.weights }).pipe(
      Effect.provideService(PolicyEngine.PolicyEngine, engine)
    )
    const front = yield* proxy(server.baseUrl, lie)
    const config = join(dir, "config.json")
    writeFileSync(config, JSON.stringify(calculatorRun({
      seed: 5,
      output: "run",
      model: { path: "model", preset: "tiny", initSeed: 3, lora },
      // A check at warm-up step 2 loads that adapter; version 0 (after step 3) is another.
      warmup: {
        data: "data/demos.jsonl",
        steps: 3,
        batchSize: 4,
        lr: 0.01,
        stopAt: { data: "data/validation.jsonl", accuracy: 1, every: 2, size: 1 }
      },
      algorithm: { steps: 2, groupsPerStep: 2, lr: 0.003 },
      engine: { servers: [front.url] },
      checkpoint: { every: 10 }
    }, { maxNewTokens: 8, numChains: 2 })))
    return { dir, config, front }
  })

const records = (dir: string) =>
  readFileSync(join(dir, "run", "metrics.jsonl"), "utf8").split("\n").filter((l) => l !== "").map((l) =>
    JSON.parse(l) as { phase: string; step: number; figures: Record<string, number>; firstFailure?: string }
  )

describe("a LoRA run with inference servers: the adapter digest of every response", () => {
  it.live("is what was published on an honest server: every batch is sampled and kept", () =>
    Effect.gen(function*() {
      const { dir, config, front } = yield* setup(false)
      const result = yield* Effect.result(Train.run({ config, output: join(dir, "run"), ...quiet([]) }))
      // A random base finds no reward signal in 2 steps (the run says so); what matters is that it sampled them.
      const failure = result._tag === "Failure" ? (result.failure as Error).message : undefined
      if (failure !== undefined) assert.include(failure, "no step trained", failure)
      // Two adapters checked: the warm-up check's (version -2) and version 0's (after the last warm-up step).
      assert.deepStrictEqual(front.loads.map((l) => l.version), [-2, 0, 1, 2])
      // Each under a name of its own that carries its version and digest.
      for (const l of front.loads) assert.match(l.name, new RegExp(`^policy-v${l.version}-[0-9a-f]{16}$`))
      const phases = records(dir).filter((r) => r.phase !== "warmup")
      assert.deepStrictEqual(phases.map((r) => `${r.phase} ${r.step}`), ["eval 0", "train 1", "train 2", "eval 2"])
      for (const r of phases) {
        assert.strictEqual(r.figures[`${r.phase === "train" ? "rollout" : "eval"}/failure_share`], 0)
      }
      assert.strictEqual(phases[1]!.figures["servers/failures"], 0)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)

  it.live("catches a server that acknowledges a load and keeps the old adapter under the new version", () =>
    Effect.gen(function*() {
      const { dir, config, front } = yield* setup(true)
      const error = (yield* Effect.flip(Train.run({ config, output: join(dir, "run"), ...quiet([]) }))) as Error
      // The lie: version 0 was loaded from the warm-up check's folder, under version 0 (the version check passes).
      const lied = front.loads.find((l) => l.version === 0)!
      assert.match(lied.sent, /policy-v-2$/)
      // Each mismatch had the server load the version again; it kept lying.
      assert.isAbove(front.loads.filter((l) => l.version === 0).length, 1)
      // Caught by the digest at the next batch (the evaluation before step 1), counted, and the run stopped.
      const reason = (error as { reason?: { _tag: string } }).reason
      assert.strictEqual(reason?._tag, "Failures", error.message)
      assert.include(error.message, "evaluation at step 0")
      const said = /sampler AdapterMismatch: a response was sampled with adapter version 0 \(digest ([0-9a-f]{16})\), /
      assert.match(error.message, said)
      const published = /not the published version 0 \(digest ([0-9a-f]{16})\)/
      assert.match(error.message, published)
      assert.notStrictEqual(said.exec(error.message)![1], published.exec(error.message)![1])
      const [checked] = records(dir).filter((r) => r.phase !== "warmup")
      assert.strictEqual(checked!.phase, "eval")
      assert.strictEqual(checked!.figures["eval/failure_share"], 1)
      assert.strictEqual(checked!.figures["eval/failures/SamplerTransient"], checked!.figures["eval/trajectories"])
      assert.include(checked!.firstFailure, "AdapterMismatch")
      // Nothing it sampled was trained on: no training step was recorded.
      assert.isFalse(records(dir).some((r) => r.phase === "train"))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
