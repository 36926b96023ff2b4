/**
 * A LoRA adapter leaves agentfly in the two forms llama.cpp runs, checked by llama.cpp itself (node-llama-cpp's
 * prebuilt binary): the base GGUF with `--format gguf-lora`'s adapter applied scores the same tokens as the merged
 * GGUF (`--adapter`, `W + (alpha/r)·B·A`), and both differ from the base alone.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import type { LlamaModel, Token } from "node-llama-cpp"
import * as Export from "../../cli/export.ts"
import * as Lora from "../../src/Lora.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Sampling from "../../src/Sampling.ts"
import { llama, loadModel } from "../parity/engines.ts"

const settings: Lora.Config = { rank: 4, alpha: 8, targets: [...Lora.moduleNames] }

/** Log-probabilities of each next id of `ids` under `model` (with the GGUF LoRA `lora`, if given). */
const scores = (model: LlamaModel, ids: ReadonlyArray<number>, lora?: string) =>
  Effect.promise(async () => {
    const context = await model.createContext({
      contextSize: 256,
      sequences: 1,
      threads: 2,
      flashAttention: false,
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
      ...(lora === undefined ? {} : { lora: { adapters: [{ filePath: lora }] } })
    })
    try {
      const asked = { probabilities: true }
      const results = await context.getSequence().controlledEvaluate(
        ids.map((id) => [id as Token, { generateNext: asked }])
      )
      return results.slice(0, -1).map((r, i) => Math.log(r!.next.probabilities!.get(ids[i + 1] as Token) ?? 0))
    } finally {
      await context.dispose()
    }
  })

describe("agentfly export with LoRA", () => {
  it.live("llama.cpp runs the GGUF LoRA on the base as it runs the merged model", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const root = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-lora-export-" })
      yield* ModelFolder.init(`${root}/small`, { preset: "small", seed: 2 })
      const folder = yield* ModelFolder.load(`${root}/small`)
      const adapter = Lora.init(folder.config, { ...settings, seed: 3 })
      const r = Sampling.rng(4)
      for (const [name, data] of adapter) {
        if (name.endsWith("lora_B.weight")) for (let i = 0; i < data.length; i++) data[i] = Sampling.normal(r) * 0.3
      }
      yield* Lora.save(`${root}/adapter`, folder.config, settings, adapter, `${root}/small`)

      const base = `${root}/base.gguf`, merged = `${root}/merged.gguf`, lora = `${root}/adapter.gguf`
      yield* Export.exportModel({ modelDir: `${root}/small`, format: "gguf", out: base })
      yield* Export.exportModel({ modelDir: `${root}/small`, format: "gguf", out: merged, adapter: `${root}/adapter` })
      const line = yield* Export.exportModel({
        modelDir: `${root}/small`,
        format: "gguf-lora",
        out: lora,
        adapter: `${root}/adapter`
      })
      assert.include(line, "GGUF LoRA adapter")

      const engine = yield* llama
      const ids = Array.from({ length: 48 }, (_, i) => 32 + ((i * 37) % 90))
      const baseModel = yield* loadModel(engine, base)
      const withLora = yield* scores(baseModel, ids, lora)
      const plain = yield* scores(baseModel, ids)
      const mergedScores = yield* scores(yield* loadModel(engine, merged), ids)
      let diff = 0, moved = 0
      for (let i = 0; i < withLora.length; i++) {
        diff = Math.max(diff, Math.abs(withLora[i]! - mergedScores[i]!))
        moved = Math.max(moved, Math.abs(withLora[i]! - plain[i]!))
      }
      assert.isBelow(diff, 1e-3, `max |Δ logprob| between base + LoRA and merged: ${diff}`)
      assert.isAbove(moved, 0.05, `the adapter moves the log-probabilities: ${moved}`)

      const refused = yield* Effect.flip(
        Export.exportModel({ modelDir: `${root}/small`, format: "gguf-lora", out: `${root}/x.gguf` })
      )
      assert.include(refused.message, "--format gguf-lora writes a LoRA adapter")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
