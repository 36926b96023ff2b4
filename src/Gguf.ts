/**
 * GGUF files (version 3), what llama.cpp, Ollama and LM Studio run: a writer that streams tensors to disk, a small
 * reader (for tests and checks) and {@link fromHf}, which maps a Hugging Face model (config.json, weights by
 * Hugging Face name, tokenizer.json, tokenizer_config.json) to the metadata and tensors llama.cpp's converter
 * (`convert_hf_to_gguf.py`) writes for the `qwen2`, `qwen3` and `llama` architectures.
 *
 * **Layout** (little-endian): magic `GGUF`, version `u32` 3, tensor count `u64`, metadata count `u64`; each metadata
 * entry is a key (`u64` length + UTF-8), a value type `u32` and the value (arrays: item type `u32`, count `u64`,
 * items); each tensor info is a name, `u32` dims count, `u64` dims **innermost first** (a Hugging Face `[out, in]`
 * matrix is `[in, out]`), a `ggml_type` `u32` and an offset `u64` into the data section; the data section starts at
 * the next multiple of the alignment (32) and every tensor's offset is a multiple of it too.
 *
 * **What llama.cpp computes from the file** must be what our graph computes: its `llama` architecture rotates
 * interleaved pairs `(x[2i], x[2i+1])` where Hugging Face rotates halves `(x[i], x[i + hd/2])`, so the converter
 * permutes the rows of `q_proj`/`k_proj` within each head (and so do we); `qwen2` and `qwen3` use NEOX
 * (rotate-half) RoPE and take the rows as they are. Llama 3's `rope_scaling: llama3` becomes a `rope_freqs.weight`
 * tensor of per-frequency divisors.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Schema } from "effect"
import * as DiskFull from "./internal/diskFull.ts"

// ===== Models =====

/**
 * A metadata value with its GGUF type (the converter's choice of type matters: llama.cpp reads
 * `context_length` as `u32` and `rope.freq_base` as `f32`, and refuses other types).
 *
 * @category models
 * @since 0.1.0
 */
export type Value =
  | { readonly type: "u32"; readonly value: number }
  | { readonly type: "i32"; readonly value: number }
  | { readonly type: "f32"; readonly value: number }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "strings"; readonly value: ReadonlyArray<string> }
  | { readonly type: "i32s"; readonly value: ReadonlyArray<number> }
  | { readonly type: "f32s"; readonly value: ReadonlyArray<number> }

/**
 * Tensor element types written: `F32` (ggml type 0), `F16` (1) and `Q8_0` (8: blocks of 32 values along a row, each
 * an F16 scale then 32 int8 quants, 34 bytes; see {@link quantizeQ8_0}).
 *
 * @category models
 * @since 0.1.0
 */
export type TensorType = "F32" | "F16" | "Q8_0"

/**
 * A tensor to write: GGUF name, dims innermost first, and its values row-major (float32), produced only when the
 * writer reaches it (a permuted or converted copy lives for one tensor at a time).
 *
 * @category models
 * @since 0.1.0
 */
export interface TensorSource {
  readonly name: string
  readonly dims: ReadonlyArray<number>
  readonly data: () => Float32Array
}

/**
 * What a GGUF file holds: metadata in writing order and tensors.
 *
 * @category models
 * @since 0.1.0
 */
export interface Contents {
  readonly metadata: ReadonlyArray<readonly [string, Value]>
  readonly tensors: ReadonlyArray<TensorSource>
}

/**
 * The file could not be written or read.
 *
 * @category errors
 * @since 0.1.0
 */
export class Io extends Schema.TaggedError<Io>()("Io", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The model has something GGUF (or llama.cpp's architecture for it) cannot express: another `model_type`, learned
 * absolute positions, a rope scaling type, a tokenizer whose pre-tokenizer llama.cpp does not know.
 *
 * @category errors
 * @since 0.1.0
 */
export class Unsupported extends Schema.TaggedError<Unsupported>()("Unsupported", { message: Schema.String }) {}

/**
 * A file read is not a valid GGUF v3 file, or a model's parts disagree (a missing tensor, a wrong shape).
 *
 * @category errors
 * @since 0.1.0
 */
export class Invalid extends Schema.TaggedError<Invalid>()("Invalid", { message: Schema.String }) {}

/**
 * Why a GGUF file could not be written or read.
 *
 * @category errors
 * @since 0.1.0
 */
export const GgufErrorReason = Schema.Union([Io, Unsupported, Invalid])
export type GgufErrorReason = typeof GgufErrorReason.Type

/**
 * A GGUF `file` could not be written or read; `message` is the reason's. Handle reasons with
 * `Effect.catchReason("GgufError", "Unsupported", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class GgufError extends Schema.TaggedError<GgufError>()("GgufError", {
  file: Schema.String,
  reason: GgufErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

const unsupported = (file: string, message: string) => new GgufError({ file, reason: new Unsupported({ message }) })
const invalid = (file: string, message: string) => new GgufError({ file, reason: new Invalid({ message }) })

// ===== Encoding =====

/** The alignment of the data section and of every tensor in it (GGUF's default: no `general.alignment` key). */
export const alignment = 32

const valueTypeCode = { u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9 } as const
const ggmlTypeCode: Readonly<Record<TensorType, number>> = { F32: 0, F16: 1, Q8_0: 8 }

/** Values per Q8_0 block (ggml's `QK8_0`) and bytes per block (an F16 scale, then one int8 per value). */
export const q8Block = 32
const q8BlockBytes = 2 + q8Block

/** Bytes of `n` values of `type` (`n` a multiple of {@link q8Block} for Q8_0, which the writer checks). */
const byteSize = (n: number, type: TensorType): number =>
  type === "F32" ? 4 * n : type === "F16" ? 2 * n : (n / q8Block) * q8BlockBytes

/**
 * `general.file_type` as llama.cpp's converter sets it (gguf-py's `LlamaFileType`: `ALL_F32` 0, `MOSTLY_F16` 1,
 * `MOSTLY_Q8_0` 7).
 *
 * @category encoding
 * @since 0.1.0
 */
export const fileType: Readonly<Record<TensorType, number>> = { F32: 0, F16: 1, Q8_0: 7 }

/** A growable little-endian byte buffer for the header (metadata and tensor infos; the data is streamed). */
class Writer {
  private buf = new Uint8Array(1 << 16)
  private view = new DataView(this.buf.buffer)
  length = 0
  private reserve(n: number) {
    if (this.length + n <= this.buf.length) return
    const next = new Uint8Array(Math.max(this.buf.length * 2, this.length + n))
    next.set(this.buf.subarray(0, this.length))
    this.buf = next
    this.view = new DataView(next.buffer)
  }
  u32(v: number) {
    this.reserve(4)
    this.view.setUint32(this.length, v, true)
    this.length += 4
  }
  i32(v: number) {
    this.reserve(4)
    this.view.setInt32(this.length, v, true)
    this.length += 4
  }
  f32(v: number) {
    this.reserve(4)
    this.view.setFloat32(this.length, v, true)
    this.length += 4
  }
  u64(v: number) {
    this.reserve(8)
    this.view.setBigUint64(this.length, BigInt(v), true)
    this.length += 8
  }
  u8(v: number) {
    this.reserve(1)
    this.buf[this.length++] = v
  }
  string(s: string) {
    const bytes = utf8.encode(s)
    this.u64(bytes.length)
    this.reserve(bytes.length)
    this.buf.set(bytes, this.length)
    this.length += bytes.length
  }
  pad(to: number) {
    const n = (to - (this.length % to)) % to
    this.reserve(n)
    this.buf.fill(0, this.length, this.length + n)
    this.length += n
  }
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length)
  }
}

const utf8 = new TextEncoder()

const writeValue = (w: Writer, v: Value) => {
  switch (v.type) {
    case "u32":
      return (w.u32(valueTypeCode.u32), w.u32(v.value))
    case "i32":
      return (w.u32(valueTypeCode.i32), w.i32(v.value))
    case "f32":
      return (w.u32(valueTypeCode.f32), w.f32(v.value))
    case "bool":
      return (w.u32(valueTypeCode.bool), w.u8(v.value ? 1 : 0))
    case "string":
      return (w.u32(valueTypeCode.string), w.string(v.value))
    case "strings":
      w.u32(valueTypeCode.array), w.u32(valueTypeCode.string), w.u64(v.value.length)
      for (const s of v.value) w.string(s)
      return
    case "i32s":
      w.u32(valueTypeCode.array), w.u32(valueTypeCode.i32), w.u64(v.value.length)
      for (const x of v.value) w.i32(x)
      return
    case "f32s":
      w.u32(valueTypeCode.array), w.u32(valueTypeCode.f32), w.u64(v.value.length)
      for (const x of v.value) w.f32(x)
      return
  }
}

const elements = (dims: ReadonlyArray<number>): number => dims.reduce((a, b) => a * b, 1)
const padded = (n: number): number => Math.ceil(n / alignment) * alignment

/**
 * The header: magic, version, counts, metadata and tensor infos (each tensor's offset in the data section, every one
 * a multiple of {@link alignment}), zero-padded to where the data section starts.
 *
 * @category encoding
 * @since 0.1.0
 */
export const encodeHeader = (contents: Contents, type: TensorType): Uint8Array => {
  const w = new Writer()
  w.u32(0x46554747) // "GGUF" read as a little-endian u32
  w.u32(3)
  w.u64(contents.tensors.length)
  w.u64(contents.metadata.length)
  for (const [key, value] of contents.metadata) (w.string(key), writeValue(w, value))
  let offset = 0
  for (const t of contents.tensors) {
    w.string(t.name)
    w.u32(t.dims.length)
    for (const d of t.dims) w.u64(d)
    w.u32(ggmlTypeCode[tensorType(t, type)])
    w.u64(offset)
    offset += padded(byteSize(elements(t.dims), tensorType(t, type)))
  }
  w.pad(alignment)
  return w.bytes()
}

/** 1-D tensors (norms, biases, `rope_freqs`) stay F32 in an F16 or Q8_0 file, as the converter keeps them. */
const tensorType = (t: TensorSource, type: TensorType): TensorType => (t.dims.length === 1 ? "F32" : type)

/**
 * IEEE half precision of every value of `src` into `dst`, rounded to nearest even (overflow to ±Infinity, tiny
 * values to subnormals or ±0, NaN kept NaN). One pass over the float bits: a 0.5 B model's 0.5 G values take
 * seconds, where a call per value took minutes.
 *
 * @category encoding
 * @since 0.1.0
 */
export const narrowHalf = (src: Float32Array, dst: Uint16Array): Uint16Array => {
  const bits = new Uint32Array(src.buffer, src.byteOffset, src.length)
  for (let i = 0; i < bits.length; i++) {
    const b = bits[i]!
    const sign = (b >>> 16) & 0x8000, e = (b >>> 23) & 0xff, m = b & 0x7fffff
    if (e >= 143) {
      dst[i] = sign | 0x7c00 | (e === 255 && m !== 0 ? 0x200 : 0) // too large for a half: ±Infinity (or NaN)
    } else if (e >= 113) {
      const h = ((e - 112) << 10) | (m >>> 13), rem = m & 0x1fff
      // A carry out of the mantissa bumps the exponent (up to Infinity), as rounding should.
      dst[i] = sign | (rem > 0x1000 || (rem === 0x1000 && (h & 1) === 1) ? h + 1 : h)
    } else if (e >= 102) {
      const shift = 126 - e, mm = m | 0x800000
      const h = mm >>> shift, rem = mm & ((1 << shift) - 1), half = 1 << (shift - 1)
      dst[i] = sign | (rem > half || (rem === half && (h & 1) === 1) ? h + 1 : h)
    } else {
      dst[i] = sign
    }
  }
  return dst
}

/**
 * IEEE half precision of `x` (see {@link narrowHalf}).
 *
 * @category encoding
 * @since 0.1.0
 */
export const toHalf = (x: number): number => narrowHalf(Float32Array.of(x), new Uint16Array(1))[0]!

/**
 * The float value of an IEEE half `h`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const fromHalf = (h: number): number => {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff
  if (e === 0) return s * m * 2 ** -24
  if (e === 31) return m !== 0 ? NaN : s * Infinity
  return s * (1 + m / 1024) * 2 ** (e - 15)
}

/**
 * ggml's Q8_0 of `data` (length a multiple of {@link q8Block}), as `quantize_row_q8_0_ref` computes it in float32:
 * per block of 32, `d = max|x| / 127`, `id = 1 / d` (0 when `d` is 0), `q = roundf(x · id)` (half away from
 * zero); stored as `d` in F16 (rounded to nearest even) then the 32 `q` as int8. The quants use the float32 `d`,
 * not its F16 rounding, as ggml does.
 *
 * @category encoding
 * @since 0.1.0
 */
export const quantizeQ8_0 = (data: Float32Array): Uint8Array => {
  const blocks = data.length / q8Block
  const out = new Uint8Array(blocks * q8BlockBytes)
  const view = new DataView(out.buffer)
  const q = new Int8Array(out.buffer)
  const scale = new Float32Array(1), half = new Uint16Array(1)
  for (let b = 0; b < blocks; b++) {
    const from = b * q8Block
    let amax = 0
    for (let j = 0; j < q8Block; j++) amax = Math.max(amax, Math.abs(data[from + j]!))
    const d = Math.fround(amax / 127), id = d === 0 ? 0 : Math.fround(1 / d)
    scale[0] = d
    view.setUint16(b * q8BlockBytes, narrowHalf(scale, half)[0]!, true)
    for (let j = 0; j < q8Block; j++) {
      const x = Math.fround(data[from + j]! * id)
      // C's roundf: halves away from zero (Math.round rounds them up).
      q[b * q8BlockBytes + 2 + j] = x < 0 ? -Math.round(-x) : Math.round(x)
    }
  }
  return out
}

const tensorBytes = (data: Float32Array, type: TensorType): Uint8Array => {
  if (type === "F32") return new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
  if (type === "Q8_0") return quantizeQ8_0(data)
  return new Uint8Array(narrowHalf(data, new Uint16Array(data.length)).buffer)
}

/**
 * Writes `contents` to `file` as GGUF v3, matrices as `type` (1-D tensors stay F32). The header is written first,
 * then each tensor as it is produced: the file is never held in memory. It is written under `file.partial` and
 * renamed when complete, so a failure leaves no half-written `file`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fn("Gguf.write")(function*(file: string, contents: Contents, type: TensorType = "F32") {
  const fs = yield* FileSystem.FileSystem
  const partial = `${file}.partial`
  // The cause's own words (a full disk, a missing directory, no permission) are what a user can act on.
  const io = (cause: unknown) =>
    new GgufError({
      file,
      reason: new Io({
        message: DiskFull.isDiskFull(cause)
          ? `cannot write ${file}: ${DiskFull.marker}; free space on its filesystem`
          : `cannot write ${file}: ${cause instanceof Error ? cause.message : String(cause)}`,
        cause
      })
    })
  for (const t of contents.tensors) {
    if (t.dims.some((d) => !Number.isInteger(d) || d <= 0)) {
      return yield* invalid(file, `tensor ${t.name} has dims [${t.dims.join(", ")}]`)
    }
    // Q8_0 blocks run along a row: a row length off the block leaves a partial block ggml cannot hold.
    if (tensorType(t, type) === "Q8_0" && t.dims[0]! % q8Block !== 0) {
      const message = `tensor ${t.name} has rows of ${t.dims[0]} values, not a multiple of ${q8Block} (Q8_0's block)`
      return yield* unsupported(file, message)
    }
  }
  const zeros = new Uint8Array(alignment)
  const stream = Effect.scoped(Effect.gen(function*() {
    const handle = yield* fs.open(partial, { flag: "w" })
    yield* handle.writeAll(encodeHeader(contents, type))
    for (const t of contents.tensors) {
      const data = t.data()
      if (data.length !== elements(t.dims)) {
        return yield* invalid(file, `tensor ${t.name} has ${data.length} values, dims [${t.dims.join(", ")}]`)
      }
      const bytes = tensorBytes(data, tensorType(t, type))
      yield* handle.writeAll(bytes)
      const pad = padded(bytes.length) - bytes.length
      if (pad > 0) yield* handle.writeAll(zeros.subarray(0, pad))
    }
  }).pipe(Effect.mapError((e) => (e instanceof GgufError ? e : io(e)))))
  yield* stream.pipe(
    Effect.andThen(fs.rename(partial, file).pipe(Effect.mapError(io))),
    Effect.tapError(() => fs.remove(partial).pipe(Effect.ignore))
  )
})

// ===== Reading =====

/**
 * A tensor as read: name, dims innermost first, type, its values widened to float32 (Q8_0 dequantised:
 * `d · q`) and its bytes as stored.
 *
 * @category models
 * @since 0.1.0
 */
export interface ReadTensor {
  readonly name: string
  readonly dims: ReadonlyArray<number>
  readonly type: TensorType
  readonly data: Float32Array
  readonly bytes: Uint8Array
}

/**
 * A GGUF file as read: metadata values (numbers, booleans, strings, arrays of them) and tensors, in file order.
 *
 * @category models
 * @since 0.1.0
 */
export interface Parsed {
  readonly version: number
  readonly metadata: ReadonlyMap<string, unknown>
  readonly tensors: ReadonlyArray<ReadTensor>
}

class Reader {
  at = 0
  readonly bytes: Uint8Array
  readonly view: DataView
  constructor(bytes: Uint8Array) {
    this.bytes = bytes
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  }
  need(n: number) {
    if (this.at + n > this.bytes.length) throw new Error(`truncated at byte ${this.at}`)
  }
  u8() {
    this.need(1)
    return this.bytes[this.at++]!
  }
  u32() {
    this.need(4)
    const v = this.view.getUint32(this.at, true)
    this.at += 4
    return v
  }
  u64() {
    this.need(8)
    const v = Number(this.view.getBigUint64(this.at, true))
    this.at += 8
    return v
  }
  string() {
    const n = this.u64()
    this.need(n)
    const s = new TextDecoder().decode(this.bytes.subarray(this.at, this.at + n))
    this.at += n
    return s
  }
  scalar(type: number): unknown {
    const sizes: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 }
    if (type === 8) return this.string()
    const size = sizes[type]
    if (size === undefined) throw new Error(`unknown value type ${type}`)
    this.need(size)
    const v = this.view, o = this.at
    this.at += size
    switch (type) {
      case 0:
        return v.getUint8(o)
      case 1:
        return v.getInt8(o)
      case 2:
        return v.getUint16(o, true)
      case 3:
        return v.getInt16(o, true)
      case 4:
        return v.getUint32(o, true)
      case 5:
        return v.getInt32(o, true)
      case 6:
        return v.getFloat32(o, true)
      case 7:
        return v.getUint8(o) !== 0
      case 10:
        return v.getBigUint64(o, true)
      case 11:
        return v.getBigInt64(o, true)
      default:
        return v.getFloat64(o, true)
    }
  }
  value(type: number): unknown {
    if (type !== 9) return this.scalar(type)
    const itemType = this.u32(), n = this.u64()
    return Array.from({ length: n }, () => this.scalar(itemType))
  }
}

const parseUnsafe = (bytes: Uint8Array): Parsed => {
  const r = new Reader(bytes)
  if (r.u32() !== 0x46554747) throw new Error("not a GGUF file (bad magic)")
  const version = r.u32()
  if (version !== 3) throw new Error(`GGUF version ${version}, expected 3`)
  const tensorCount = r.u64(), metadataCount = r.u64()
  const metadata = new Map<string, unknown>()
  for (let i = 0; i < metadataCount; i++) {
    const key = r.string()
    metadata.set(key, r.value(r.u32()))
  }
  const align = typeof metadata.get("general.alignment") === "number" ? metadata.get("general.alignment") as number : 32
  const infos = Array.from({ length: tensorCount }, () => {
    const name = r.string()
    const dims = Array.from({ length: r.u32() }, () => r.u64())
    const code = r.u32(), offset = r.u64()
    const type = code === 0 ? "F32" : code === 1 ? "F16" : code === 8 ? "Q8_0" : undefined
    if (type === undefined) throw new Error(`tensor ${name} has ggml type ${code} (only F32, F16 and Q8_0 are read)`)
    if (type === "Q8_0" && dims[0]! % q8Block !== 0) throw new Error(`tensor ${name} has Q8_0 rows of ${dims[0]}`)
    if (offset % align !== 0) throw new Error(`tensor ${name} is not aligned to ${align}`)
    return { name, dims, type, offset } as const
  })
  const dataStart = Math.ceil(r.at / align) * align
  const tensors = infos.map((t): ReadTensor => {
    const n = elements(t.dims), start = dataStart + t.offset
    r.at = start
    const size = byteSize(n, t.type)
    r.need(size)
    const data = new Float32Array(n)
    for (let i = 0; i < n; i++) {
      if (t.type === "Q8_0") {
        const block = start + Math.floor(i / q8Block) * q8BlockBytes
        data[i] = fromHalf(r.view.getUint16(block, true)) * r.view.getInt8(block + 2 + (i % q8Block))
      } else {
        data[i] = t.type === "F32"
          ? r.view.getFloat32(start + 4 * i, true)
          : fromHalf(r.view.getUint16(start + 2 * i, true))
      }
    }
    return { name: t.name, dims: t.dims, type: t.type, data, bytes: bytes.slice(start, start + size) }
  })
  return { version, metadata, tensors }
}

/**
 * Reads a whole GGUF v3 file held in memory (F32, F16 and Q8_0 tensors): for tests and small files.
 *
 * @category decoding
 * @since 0.1.0
 */
export const parse = (bytes: Uint8Array, file: string): Effect.Effect<Parsed, GgufError> =>
  Effect.try({
    try: () => parseUnsafe(bytes),
    catch: (e) => invalid(file, `${file}: ${e instanceof Error ? e.message : String(e)}`)
  })

// ===== From a Hugging Face model =====

/**
 * A Hugging Face model as its files hold it: `config.json` parsed, weights by Hugging Face name with `[out, in]`
 * shapes, `tokenizer.json` and `tokenizer_config.json` parsed.
 *
 * @category models
 * @since 0.1.0
 */
export interface HfModel {
  readonly name: string
  readonly config: Readonly<Record<string, unknown>>
  readonly tensors: ReadonlyArray<{
    readonly name: string
    readonly shape: ReadonlyArray<number>
    readonly data: Float32Array
  }>
  readonly tokenizer: unknown
  readonly tokenizerConfig: Readonly<Record<string, unknown>>
}

/**
 * The llama.cpp architectures written.
 *
 * @category models
 * @since 0.1.0
 */
export type Architecture = "qwen2" | "qwen3" | "llama"

const architectures: ReadonlyArray<Architecture> = ["qwen2", "qwen3", "llama"]

/** Token types of `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`). */
const tokenType = { normal: 1, control: 3, userDefined: 4, unused: 5 } as const

/** What the converter's `does_token_look_special` calls special: such added tokens are CONTROL even if not special. */
const looksSpecial = (t: string): boolean =>
  ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(t) || (t.startsWith("<|") && t.endsWith("|>")) ||
  (t.startsWith("<｜") && t.endsWith("｜>")) || (t.startsWith("<unused") && t.endsWith(">"))

/**
 * The name llama.cpp knows the tokenizer's pre-tokenizer by (`tokenizer.ggml.pre`), read from its split regex:
 * Qwen2's splits digits one by one, Llama 3's in runs of up to three; SmolLM2's own tokenizer is byte-level with
 * individual digits; a byte-level vocabulary without merges (`ByteTokenizer`'s) is `default`. The converter
 * recognises a tokenizer by hashing its output on a test text; we read the regex.
 */
const preTokenizer = (json: Record<string, unknown>): string | undefined => {
  const text = JSON.stringify(json["pre_tokenizer"] ?? null)
  const common = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|`
  const tail = String.raw`| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`
  if (text.includes(common + String.raw`\\p{N}` + tail)) return "qwen2"
  if (text.includes(common + String.raw`\\p{N}{1,3}` + tail)) return "llama-bpe"
  if (text.includes(`"individual_digits":true`) && text.includes(`"ByteLevel"`)) return "smollm"
  // Without merges every split gives the same byte ids: llama.cpp's default split is exact (our byte tokenizer).
  const merges = (json["model"] as { merges?: unknown } | undefined)?.merges
  const byteLevel = (json["pre_tokenizer"] as { type?: unknown } | null | undefined)?.type === "ByteLevel"
  if (byteLevel && Array.isArray(merges) && merges.length === 0) return "default"
  return undefined
}

interface Vocabulary {
  readonly pre: string
  readonly tokens: Array<string>
  readonly types: Array<number>
  readonly merges: Array<string>
  readonly added: ReadonlyMap<string, number>
}

/** Tokens by id (padded to the model's `vocab_size` with `[PAD{id}]`, type UNUSED, as the converter pads). */
const vocabulary = (model: HfModel, vocabSize: number, file: string): Effect.Effect<Vocabulary, GgufError> =>
  Effect.gen(function*() {
    const json = model.tokenizer as Record<string, unknown>
    const bpe = json?.["model"] as { type?: unknown; vocab?: Record<string, number>; merges?: Array<unknown> }
    if (bpe?.type !== "BPE" || typeof bpe.vocab !== "object" || !Array.isArray(bpe.merges)) {
      return yield* unsupported(file, "tokenizer.json is not a byte-level BPE tokenizer (llama.cpp's gpt2 model)")
    }
    const pre = preTokenizer(json)
    if (pre === undefined) {
      return yield* unsupported(
        file,
        "tokenizer.json's pre-tokenizer is none llama.cpp knows (supported: Qwen2's, Llama 3's, SmolLM's)"
      )
    }
    const tokens = Array.from({ length: vocabSize }, (_, i) => `[PAD${i}]`)
    const types = Array.from({ length: vocabSize }, (): number => tokenType.unused)
    const place = (token: string, id: number, type: number) => {
      if (id < vocabSize) (tokens[id] = token, types[id] = type)
    }
    for (const [token, id] of Object.entries(bpe.vocab)) place(token, id, tokenType.normal)
    const added = new Map<string, number>()
    for (const t of (json["added_tokens"] ?? []) as Array<{ id: number; content: string; special?: boolean }>) {
      if (t.id >= vocabSize) {
        const token = JSON.stringify(t.content)
        return yield* invalid(file, `added token ${token} has id ${t.id} ≥ vocab_size ${vocabSize}`)
      }
      added.set(t.content, t.id)
      place(t.content, t.id, t.special === true || looksSpecial(t.content) ? tokenType.control : tokenType.userDefined)
    }
    const merges = bpe.merges.map((m) => (Array.isArray(m) ? m.join(" ") : String(m)))
    return { pre, tokens, types, merges, added }
  })

const num = (config: Readonly<Record<string, unknown>>, key: string): number | undefined => {
  const v = config[key]
  return typeof v === "number" ? v : undefined
}

/** The first of `config.json`'s ids (a list for Llama 3's end-of-sequence ids), as the converter takes them. */
const firstId = (v: unknown): number | undefined =>
  typeof v === "number" ? v : Array.isArray(v) && typeof v[0] === "number" ? v[0] : undefined

/** Whether the tokenizer adds a beginning-of-sequence token: tokenizer_config's key, else its post-processor's. */
const addsBos = (model: HfModel, bos: string | undefined): boolean => {
  const key = model.tokenizerConfig["add_bos_token"]
  if (typeof key === "boolean") return key
  const post = JSON.stringify((model.tokenizer as Record<string, unknown>)?.["post_processor"] ?? null)
  return bos !== undefined && post.includes(`"TemplateProcessing"`) && post.includes(JSON.stringify(bos))
}

const tokenName = (v: unknown): string | undefined =>
  typeof v === "string" ? v : typeof (v as { content?: unknown })?.content === "string"
  ? (v as { content: string }).content
  : undefined

/**
 * Llama 3's per-frequency RoPE divisors (`rope_freqs.weight`, `[head_dim / 2]`): 1 for short wavelengths, `factor`
 * for long ones, a smooth blend between (Meta's `apply_scaling`, which the converter writes as this tensor).
 */
const llama3RopeFactors = (scaling: Readonly<Record<string, unknown>>, theta: number, hd: number): Float32Array => {
  const factor = num(scaling, "factor") ?? 8, low = num(scaling, "low_freq_factor") ?? 1
  const high = num(scaling, "high_freq_factor") ?? 4
  const original = num(scaling, "original_max_position_embeddings") ?? 8192
  const lowWavelen = original / low, highWavelen = original / high
  return Float32Array.from({ length: hd / 2 }, (_, i) => {
    const wavelen = 2 * Math.PI * Math.pow(theta, (2 * i) / hd)
    if (wavelen < highWavelen) return 1
    if (wavelen > lowWavelen) return factor
    const smooth = (original / wavelen - low) / (high - low)
    return 1 / ((1 - smooth) / factor + smooth)
  })
}

/**
 * Rows of a `[heads·hd, in]` projection reordered within each head from Hugging Face's halves to llama.cpp's
 * interleaved pairs: new row `2i + j` of a head is old row `j·hd/2 + i` (the converter's `permute`).
 */
export const permuteForInterleavedRope = (data: Float32Array, heads: number, cols: number): Float32Array => {
  const rows = data.length / cols, hd = rows / heads, half = hd / 2
  const out = new Float32Array(data.length)
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const from = h * hd + j * half + i, to = h * hd + 2 * i + j
        out.set(data.subarray(from * cols, (from + 1) * cols), to * cols)
      }
    }
  }
  return out
}

const layerTensorNames: ReadonlyArray<readonly [string, string]> = [
  ["input_layernorm.weight", "attn_norm.weight"],
  ["self_attn.q_proj.weight", "attn_q.weight"],
  ["self_attn.q_proj.bias", "attn_q.bias"],
  ["self_attn.k_proj.weight", "attn_k.weight"],
  ["self_attn.k_proj.bias", "attn_k.bias"],
  ["self_attn.v_proj.weight", "attn_v.weight"],
  ["self_attn.v_proj.bias", "attn_v.bias"],
  ["self_attn.q_norm.weight", "attn_q_norm.weight"],
  ["self_attn.k_norm.weight", "attn_k_norm.weight"],
  ["self_attn.o_proj.weight", "attn_output.weight"],
  ["post_attention_layernorm.weight", "ffn_norm.weight"],
  ["mlp.gate_proj.weight", "ffn_gate.weight"],
  ["mlp.up_proj.weight", "ffn_up.weight"],
  ["mlp.down_proj.weight", "ffn_down.weight"]
]

/** The GGUF name of a Hugging Face tensor, `undefined` for one llama.cpp has no place for. */
const ggufName = (hf: string): string | undefined => {
  if (hf === "model.embed_tokens.weight") return "token_embd.weight"
  if (hf === "model.norm.weight") return "output_norm.weight"
  if (hf === "lm_head.weight") return "output.weight"
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf)
  const suffix = m === null ? undefined : layerTensorNames.find(([from]) => from === m[2])?.[1]
  return suffix === undefined ? undefined : `blk.${m![1]}.${suffix}`
}

const architectureOf = (model: HfModel, file: string): Effect.Effect<Architecture, GgufError> => {
  const type = model.config["model_type"]
  return architectures.includes(type as Architecture)
    ? Effect.succeed(type as Architecture)
    : Effect.fail(unsupported(file, `model_type ${JSON.stringify(type)} (supported: ${architectures.join(", ")})`))
}

/** The rope scaling to write, or a refusal naming the key: `llama3` for Llama, none otherwise. */
const ropeFactors = (model: HfModel, arch: Architecture, hd: number, file: string) => {
  const scaling = model.config["rope_scaling"] as Record<string, unknown> | null | undefined
  if (scaling === undefined || scaling === null) return Effect.succeed(undefined)
  const type = scaling["rope_type"] ?? scaling["type"]
  if (arch === "llama" && type === "llama3") {
    return Effect.succeed(llama3RopeFactors(scaling, num(model.config, "rope_theta") ?? 10000, hd))
  }
  if (type === "default") return Effect.succeed(undefined)
  const message = `rope_scaling.rope_type ${JSON.stringify(type)} for ${arch} (supported: llama3 for llama)`
  return Effect.fail(unsupported(file, message))
}

const shapeError = (file: string, name: string, shape: ReadonlyArray<number>) =>
  invalid(file, `tensor ${name} has shape [${shape.join(", ")}], which llama.cpp cannot place`)

/**
 * The GGUF metadata and tensors of a Hugging Face `qwen2`, `qwen3` or `llama` model, as llama.cpp's converter
 * writes them: `general.*`, the architecture's hyper-parameters, the tokenizer (`gpt2` model, the pre-tokenizer's
 * name, tokens padded to `vocab_size`, token types, merges, special ids, `add_bos_token`) and the chat template;
 * tensors renamed (`token_embd`, `blk.N.attn_q`, …), dims innermost first, Llama's q/k rows permuted for its
 * interleaved RoPE, `rope_freqs.weight` for Llama 3's rope scaling, no `output.weight` when the head is tied.
 * `file` only names the output in errors.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromHf = Effect.fn("Gguf.fromHf")(function*(model: HfModel, file: string, type: TensorType = "F32") {
  const c = model.config
  const arch = yield* architectureOf(model, file)
  if (c["learned_position_embeddings"] === true) {
    return yield* unsupported(file, "learned_position_embeddings: true (llama.cpp's architectures have none)")
  }
  const need = (key: string) => {
    const v = num(c, key)
    return v === undefined ? Effect.fail(invalid(file, `config.json has no numeric ${key}`)) : Effect.succeed(v)
  }
  const D = yield* need("hidden_size"), L = yield* need("num_hidden_layers"), V = yield* need("vocab_size")
  const H = yield* need("num_attention_heads"), KV = num(c, "num_key_value_heads") ?? H
  const hd = num(c, "head_dim") ?? D / H
  const factors = yield* ropeFactors(model, arch, hd, file)
  const vocab = yield* vocabulary(model, V, file)
  const u32 = (value: number): Value => ({ type: "u32", value })
  const f32 = (value: number): Value => ({ type: "f32", value })
  const metadata: Array<readonly [string, Value]> = [
    ["general.architecture", { type: "string", value: arch }],
    ["general.type", { type: "string", value: "model" }],
    ["general.name", { type: "string", value: model.name }],
    ["general.file_type", u32(fileType[type])],
    ["general.quantization_version", u32(2)],
    [`${arch}.vocab_size`, u32(V)],
    [`${arch}.context_length`, u32(yield* need("max_position_embeddings"))],
    [`${arch}.embedding_length`, u32(D)],
    [`${arch}.block_count`, u32(L)],
    [`${arch}.feed_forward_length`, u32(yield* need("intermediate_size"))],
    [`${arch}.attention.head_count`, u32(H)],
    [`${arch}.attention.head_count_kv`, u32(KV)],
    [`${arch}.attention.key_length`, u32(hd)],
    [`${arch}.attention.value_length`, u32(hd)],
    [`${arch}.rope.dimension_count`, u32(hd)],
    [`${arch}.rope.freq_base`, f32(num(c, "rope_theta") ?? 10000)],
    [`${arch}.attention.layer_norm_rms_epsilon`, f32(num(c, "rms_norm_eps") ?? 1e-6)],
    ...tokenizerMetadata(model, vocab)
  ]
  const tensors = yield* tensorsOf(model, { arch, V, H, KV, file, factors })
  return { metadata, tensors } satisfies Contents
})

const tokenizerMetadata = (model: HfModel, vocab: Vocabulary): Array<readonly [string, Value]> => {
  const c = model.config, tc = model.tokenizerConfig
  const idOf = (v: unknown) => {
    const name = tokenName(v)
    return name === undefined ? undefined : vocab.added.get(name)
  }
  // The converter reads tokenizer_config's tokens first and config.json's ids only for the ones still unset.
  const bos = idOf(tc["bos_token"]) ?? firstId(c["bos_token_id"])
  const eos = idOf(tc["eos_token"]) ?? firstId(c["eos_token_id"])
  const pad = idOf(tc["pad_token"]) ?? firstId(c["pad_token_id"])
  const out: Array<readonly [string, Value]> = [
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: vocab.pre }],
    ["tokenizer.ggml.tokens", { type: "strings", value: vocab.tokens }],
    ["tokenizer.ggml.token_type", { type: "i32s", value: vocab.types }],
    ["tokenizer.ggml.merges", { type: "strings", value: vocab.merges }]
  ]
  if (bos !== undefined) out.push(["tokenizer.ggml.bos_token_id", { type: "u32", value: bos }])
  if (eos !== undefined) out.push(["tokenizer.ggml.eos_token_id", { type: "u32", value: eos }])
  if (pad !== undefined) out.push(["tokenizer.ggml.padding_token_id", { type: "u32", value: pad }])
  out.push(["tokenizer.ggml.add_bos_token", { type: "bool", value: addsBos(model, tokenName(tc["bos_token"])) }])
  const template = tc["chat_template"]
  if (typeof template === "string") out.push(["tokenizer.chat_template", { type: "string", value: template }])
  return out
}

const tensorsOf = (
  model: HfModel,
  o: {
    readonly arch: Architecture
    readonly V: number
    readonly H: number
    readonly KV: number
    readonly file: string
    readonly factors: Float32Array | undefined
  }
): Effect.Effect<Array<TensorSource>, GgufError> =>
  Effect.gen(function*() {
    const out: Array<TensorSource> = []
    if (o.factors !== undefined) {
      const factors = o.factors
      out.push({ name: "rope_freqs.weight", dims: [factors.length], data: () => factors })
    }
    for (const t of model.tensors) {
      const name = ggufName(t.name)
      if (name === undefined) {
        return yield* unsupported(o.file, `tensor ${t.name} has no place in llama.cpp's ${o.arch}`)
      }
      if (t.shape.length < 1 || t.shape.length > 2) return yield* shapeError(o.file, t.name, t.shape)
      const dims = [...t.shape].reverse()
      const heads = o.arch !== "llama" ? undefined : name.endsWith("attn_q.weight") ? o.H :
        name.endsWith("attn_k.weight") ? o.KV : undefined
      const cols = t.shape[1] ?? 1
      out.push({
        name,
        dims,
        data: heads === undefined ? () => t.data : () => permuteForInterleavedRope(t.data, heads, cols)
      })
    }
    if (!out.some((t) => t.name === "token_embd.weight")) {
      return yield* invalid(o.file, "no model.embed_tokens.weight")
    }
    return out
  })

// ===== LoRA adapters =====

/**
 * A PEFT LoRA adapter to write as llama.cpp's GGUF LoRA (`llama-cli -m base.gguf --lora adapter.gguf`): the base's
 * `config.json`, `lora_alpha` and the adapter's tensors under PEFT's names (`…q_proj.lora_A.weight [r, in]`,
 * `…lora_B.weight [out, r]`).
 *
 * @category models
 * @since 0.1.0
 */
export interface LoraAdapter {
  readonly name: string
  readonly config: Readonly<Record<string, unknown>>
  readonly alpha: number
  readonly tensors: ReadonlyArray<
    { readonly name: string; readonly shape: ReadonlyArray<number>; readonly data: Float32Array }
  >
}

/**
 * The GGUF LoRA of a PEFT adapter, as llama.cpp's `convert_lora_to_gguf.py` writes it: `general.type` `adapter`,
 * `adapter.type` `lora`, `adapter.lora.alpha`; per adapted weight `blk.N.attn_q.weight.lora_a` (dims `[in, r]`,
 * PEFT's `A` as it is) and `.lora_b` (dims `[r, out]`), which llama.cpp's loader checks against the base tensor
 * (`a.ne[0]` = the base's `ne[0]`, `b.ne[1]` = its `ne[1]`, `a.ne[1]` = `b.ne[0]`); Llama's q/k `B` rows permuted
 * for its interleaved RoPE as the base's q/k rows are. llama.cpp scales the update by `alpha / r`, as PEFT does.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromLora = Effect.fn("Gguf.fromLora")(function*(adapter: LoraAdapter, file: string) {
  const arch = yield* architectureOf({ config: adapter.config } as HfModel, file)
  const H = num(adapter.config, "num_attention_heads") ?? 1
  const KV = num(adapter.config, "num_key_value_heads") ?? H
  const tensors: Array<TensorSource> = []
  for (const t of adapter.tensors) {
    const m = /^base_model\.model\.(.+)\.lora_([AB])\.weight$/.exec(t.name)
    const base = m === null ? undefined : ggufName(`${m[1]}.weight`)
    if (m === null || base === undefined || t.shape.length !== 2) {
      return yield* unsupported(file, `adapter tensor ${t.name} has no place in llama.cpp's ${arch}`)
    }
    const heads = arch !== "llama" || m[2] !== "B" ? undefined : base.endsWith("attn_q.weight") ? H :
      base.endsWith("attn_k.weight") ? KV : undefined
    tensors.push({
      name: `${base}.lora_${m[2] === "A" ? "a" : "b"}`,
      dims: [...t.shape].reverse(),
      data: heads === undefined ? () => t.data : () => permuteForInterleavedRope(t.data, heads, t.shape[1]!)
    })
  }
  const metadata: Array<readonly [string, Value]> = [
    ["general.architecture", { type: "string", value: arch }],
    ["general.type", { type: "string", value: "adapter" }],
    ["general.name", { type: "string", value: adapter.name }],
    ["general.file_type", { type: "u32", value: fileType.F32 }],
    ["adapter.type", { type: "string", value: "lora" }],
    ["adapter.lora.alpha", { type: "f32", value: adapter.alpha }]
  ]
  return { metadata, tensors } satisfies Contents
})
