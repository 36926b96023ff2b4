import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn, spawnSync } from "node:child_process"
import { cpSync, mkdtempSync, truncateSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as Train from "../../actors/Train.ts"
import * as Generate from "../../examples/guess/generate.ts"
import { task } from "../../examples/guess/task.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { cli } from "../utils/agentfly.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")

/** Starts `agentfly serve ARGS…`, runs `use` with its API root, then stops it. */
const serving = <A>(args: ReadonlyArray<string>, use: (baseUrl: string) => Promise<A>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => spawn(process.execPath, [cli, "serve", ...args], { cwd: repoRoot })),
    (child) =>
      Effect.promise(() =>
        new Promise<A>((resolve, reject) => {
          let text = ""
          const onData = (chunk: Buffer) => {
            text += chunk.toString()
            const url = /at (http:\/\/\S+\/v1)/.exec(text)?.[1]
            if (url !== undefined) {
              child.stdout.off("data", onData)
              use(url).then(resolve, reject)
            }
          }
          child.stdout.on("data", onData)
          child.on("exit", (code) => reject(new Error(`serve exited with ${code}: ${text}`)))
        })
      ),
    (child) => Effect.sync(() => child.kill("SIGTERM"))
  )

const post = (url: string, body: object) =>
  fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }).then(
    async (r) => ({ status: r.status, type: r.headers.get("content-type"), json: await r.json() })
  )

describe("agentfly serve", () => {
  it.live("the request limits are flags; a bad streaming request gets a 4xx JSON error; bad limits exit non-zero", () =>
    Effect.gen(function*() {
      const dir = join(mkdtempSync(join(tmpdir(), "agentfly-serve-cli-")), "tiny-cli")
      yield* ModelFolder.init(dir, { preset: "tiny", seed: 2 }).pipe(Effect.provide(NodeServices.layer))
      const ids = Array.from({ length: 10 }, (_, i) => 30 + i)
      const answers = yield* serving(
        ["--model-dir", dir, "--port", "0", "--max-prompts", "2", "--max-request-tokens", "50"],
        (url) =>
          Promise.all([
            post(`${url}/completions`, { prompt: [ids, ids, ids], max_tokens: 1 }),
            post(`${url}/completions`, { prompt: [ids, ids], max_tokens: 30 }),
            post(`${url}/completions`, { prompt: [ids, ids], max_tokens: 10 }),
            post(`${url}/completions`, { prompt: [1, 99999], stream: true })
          ])
      )
      const [three, overBudget, fits, badStream] = answers
      assert.strictEqual(three.status, 400)
      assert.match(three.json.error.message, /3 prompts; this server takes at most 2/)
      assert.strictEqual(overBudget.status, 400)
      assert.match(overBudget.json.error.message, /80 tokens .*at most 50/)
      assert.strictEqual(fits.status, 200)
      assert.strictEqual(fits.json.choices.length, 2)
      assert.strictEqual(badStream.status, 400)
      assert.strictEqual(badStream.type, "application/json")
      assert.match(badStream.json.error.message, /outside the vocabulary/)

      const flags = ["--model-dir", dir, "--port", "0", "--max-running-per-request", "0"]
      const bad = spawnSync(process.execPath, [cli, "serve", ...flags], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.notStrictEqual(bad.status, 0)
      assert.include(bad.stdout + bad.stderr, "--max-running-per-request must be at least 1, got 0")
    }), { timeout: 300_000 })

  it.live("--checkpoint serves a training run's weights at that checkpoint; a corrupt one exits with its reason", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "agentfly-serve-ckpt-"))
      yield* Generate.write(
        { dir: join(dir, "data"), seed: 3, train: 8, heldOut: 2, validation: 0, demos: 0, noise: 0 },
        task.defaults.systemPrompt!
      ).pipe(Effect.provide(NodeServices.layer))
      yield* Train.run({
        task,
        dir,
        config: {
          output: "run",
          model: { path: "model", preset: "tiny", initSeed: 1 },
          data: { train: "data/train.jsonl" },
          agent: { numChains: 2 },
          algorithm: { steps: 2, groupsPerStep: 2, lr: 0.01, advantage: "reinforce++", entropyCoef: 0.01 }
        },
        write: () => {},
        tty: false
      })
      const checkpoint = join(dir, "run", "checkpoints", "step-000002")
      const request = { prompt: [30, 31, 32], max_tokens: 4, temperature: 1, seed: 0, logprobs: 1 }
      // An answer's logprobs, and the policy version it names.
      const answer = (args: ReadonlyArray<string>) =>
        serving(["--model-dir", join(dir, "model"), "--port", "0", ...args], (url) =>
          post(`${url}/completions`, request).then((r) => ({
            logprobs: r.json.choices[0].logprobs.token_logprobs as Array<number>,
            version: r.json.choices[0].policy_version as number
          })))
      const initial = yield* answer([])
      const trained = yield* answer(["--checkpoint", checkpoint])
      assert.notDeepEqual(trained.logprobs, initial.logprobs, "the checkpoint's weights, not the folder's")
      assert.deepStrictEqual(yield* answer(["--checkpoint", checkpoint]), trained)
      // A checkpoint's answers name the run's policy version at that step; the folder's weights are version 0.
      assert.strictEqual(initial.version, 0)
      assert.strictEqual(trained.version, 2)

      const broken = join(dir, "broken")
      cpSync(checkpoint, broken, { recursive: true })
      truncateSync(join(broken, "model.safetensors"), 100)
      const flags = ["--model-dir", join(dir, "model"), "--checkpoint", broken]
      const bad = spawnSync(process.execPath, [cli, "serve", ...flags], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.strictEqual(bad.status, 1)
      assert.include(bad.stderr, "model.safetensors")
    }), { timeout: 300_000 })

  it("serve, gateway and trainer refuse a non-loopback host without a token, with the reason", () => {
    const dir = mkdtempSync(join(tmpdir(), "agentfly-bind-"))
    const env = { ...process.env }
    for (const name of Object.keys(env)) if (/^AGENTFLY_.*TOKEN$/.test(name)) delete env[name]
    const commands: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [["serve", "--model-dir", dir, "--host", "0.0.0.0", "--port", "0"], "AGENTFLY_SERVE_TOKEN or --token-file"],
      [["gateway", "--model-dir", dir, "--host", "0.0.0.0", "--port", "0"], "AGENTFLY_GATEWAY_TOKEN or --token-file"],
      [["trainer", "--host", "0.0.0.0", "--port", "0"], "AGENTFLY_TRAINER_TOKEN or --token-file"]
    ]
    for (const [args, how] of commands) {
      const run = spawnSync(process.execPath, [cli, ...args], {
        cwd: repoRoot,
        env,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.strictEqual(run.status, 1, `${args[0]}: ${run.stdout}${run.stderr}`)
      assert.include(run.stderr, "refusing to listen on 0.0.0.0 without a token", args[0])
      assert.include(run.stderr, how)
    }
  }, 360_000)
})
