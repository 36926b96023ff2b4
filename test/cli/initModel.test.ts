import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn, spawnSync } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { cli } from "../utils/agentfly.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")
const dir = mkdtempSync(join(tmpdir(), "agentfly-init-"))

describe("agentfly init-model and serve", () => {
  it.live("init-model writes a folder that loads; serve answers /v1/models on it; bad flags exit non-zero", () =>
    Effect.gen(function*() {
      const out = join(dir, "small-model")
      const init = spawnSync(process.execPath, [cli, "init-model", "--out", out, "--preset", "small", "--seed", "7"], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.strictEqual(init.status, 0, init.stderr)
      assert.match(init.stdout, /qwen2 small, 4 layers, width 256/)
      const folder = yield* ModelFolder.load(out).pipe(Effect.provide(NodeServices.layer))
      assert.strictEqual(folder.config.numHiddenLayers, 4)

      const bad = spawnSync(process.execPath, [cli, "init-model", "--out", join(dir, "x"), "--preset", "huge"], {
        cwd: repoRoot,
        encoding: "utf8",
        timeout: 300_000
      })
      assert.notStrictEqual(bad.status, 0)
      assert.match(bad.stdout + bad.stderr, /preset/)

      const models = yield* Effect.acquireUseRelease(
        Effect.sync(() =>
          spawn(process.execPath, [cli, "serve", "--model-dir", out, "--port", "0"], { cwd: repoRoot })
        ),
        (child) =>
          Effect.promise(() =>
            new Promise<string>((resolve, reject) => {
              let text = ""
              child.stdout.on("data", (chunk: Buffer) => {
                text += chunk.toString()
                const url = /at (http:\/\/\S+\/v1)/.exec(text)?.[1]
                if (url !== undefined) fetch(`${url}/models`).then((r) => r.text()).then(resolve, reject)
              })
              child.on("exit", (code) => reject(new Error(`serve exited with ${code}: ${text}`)))
            })
          ),
        (child) => Effect.sync(() => child.kill("SIGTERM"))
      )
      assert.deepStrictEqual(JSON.parse(models).data.map((m: { id: string }) => m.id), ["small-model"])
    }), { timeout: 300_000 })
})
