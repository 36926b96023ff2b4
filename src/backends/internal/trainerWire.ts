/**
 * The remote trainer's wire (`RemoteTrainer` ↔ `actors/TrainerServer.ts`): every request and response body is one
 * frame, a JSON header followed by typed arrays, so that micro-batches, logprobs and weights travel as their bytes.
 *
 * Frame: `AFT1` · header length (u32 LE) · header JSON (UTF-8) · the arrays, each at a 4-byte-aligned offset. The
 * header's `arrays` lists them in order as `[name, dtype, length]`.
 *
 * @since 0.1.0
 */
import type * as Packing from "../../Packing.ts"
import type * as GradientBackend from "../../GradientBackend.ts"
import * as Finite from "../../internal/finite.ts"

/** @internal */
export type TypedArray = Float32Array | Int32Array | Uint8Array

/** @internal */
export interface Frame {
  readonly header: Record<string, unknown>
  readonly arrays: ReadonlyMap<string, TypedArray>
}

const MAGIC = 0x31544641 // "AFT1", little-endian
const dtypes = { f32: Float32Array, i32: Int32Array, u8: Uint8Array } as const
type Dtype = keyof typeof dtypes
const dtypeOf = (a: TypedArray): Dtype => a instanceof Float32Array ? "f32" : a instanceof Int32Array ? "i32" : "u8"
const align4 = (n: number) => (n + 3) & ~3

/** @internal */
export const encode = (
  header: Record<string, unknown>,
  arrays: Iterable<readonly [string, TypedArray]> = []
): Buffer => {
  const list = [...arrays]
  const json = Buffer.from(JSON.stringify({ ...header, arrays: list.map(([n, a]) => [n, dtypeOf(a), a.length]) }))
  let size = align4(8 + json.length)
  const offsets = list.map(([, a]) => {
    const at = size
    size = align4(size + a.byteLength)
    return at
  })
  const out = Buffer.alloc(size)
  out.writeUInt32LE(MAGIC, 0)
  out.writeUInt32LE(json.length, 4)
  json.copy(out, 8)
  list.forEach(([, a], i) => out.set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength), offsets[i]))
  return out
}

/** @internal A frame, or why the bytes are not one. */
export const decode = (bytes: Uint8Array): Frame | string => {
  if (bytes.length < 8) return `a frame of ${bytes.length} bytes`
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (view.getUint32(0, true) !== MAGIC) return "not an agentfly trainer frame (magic AFT1 missing)"
  const jsonLength = view.getUint32(4, true)
  if (8 + jsonLength > bytes.length) return "the frame's header runs past its end"
  let header: Record<string, unknown>
  try {
    header = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + 8, jsonLength).toString("utf8"))
  } catch {
    return "the frame's header is not JSON"
  }
  if (typeof header !== "object" || header === null || !Array.isArray(header["arrays"])) {
    return "the frame's header lists no arrays"
  }
  const arrays = new Map<string, TypedArray>()
  let at = align4(8 + jsonLength)
  for (const entry of header["arrays"] as Array<unknown>) {
    const [name, dtype, length] = Array.isArray(entry) ? entry : []
    const Ctor = dtypes[dtype as Dtype]
    if (typeof name !== "string" || Ctor === undefined || !Number.isInteger(length) || length < 0) {
      return `bad array entry ${JSON.stringify(entry)}`
    }
    const byteLength = length * Ctor.BYTES_PER_ELEMENT
    if (at + byteLength > bytes.length) return `array ${name} runs past the frame's end`
    // A copy: the body's bytes may sit at any offset of a pooled buffer.
    const out = new Ctor(length)
    new Uint8Array(out.buffer).set(bytes.subarray(at, at + byteLength))
    arrays.set(name, out)
    at = align4(at + byteLength)
  }
  return { header, arrays }
}

// ===== Micro-batches =====

const batchArrays = [
  ["inputIds", "i32"],
  ["attentionMask", "u8"],
  ["targets", "i32"],
  ["mask", "u8"],
  ["weights", "f32"],
  ["advantages", "f32"],
  ["samplerLogprobs", "f32"],
  ["refLogprobs", "f32"],
  ["sequenceIndex", "i32"]
] as const
const optionalArrays = [["positionIds", "i32"], ["oldLogprobs", "f32"]] as const
const prefixArrays = [["inputIds", "i32"], ["attentionMask", "u8"], ["index", "i32"]] as const

/** @internal */
export const encodeBatch = (mb: Packing.MicroBatch, header: Record<string, unknown> = {}): Buffer => {
  const arrays: Array<readonly [string, TypedArray]> = batchArrays.map(([k]) => [k, mb[k]])
  for (const [k] of optionalArrays) if (mb[k] !== undefined) arrays.push([k, mb[k]])
  if (mb.prefix !== undefined) for (const [k] of prefixArrays) arrays.push([`prefix.${k}`, mb.prefix[k]])
  return encode({
    ...header,
    batch: mb.batch,
    length: mb.length,
    lossTokens: mb.lossTokens,
    ...(mb.prefix === undefined ? {} : { prefix: { batch: mb.prefix.batch, length: mb.prefix.length } })
  }, arrays)
}

const isCount = (x: unknown): x is number => Number.isInteger(x) && (x as number) >= 0

/** @internal A micro-batch, or why the frame does not hold one (sizes are the trainer's to check). */
export const decodeBatch = ({ header, arrays }: Frame): Packing.MicroBatch | string => {
  const { batch, length, lossTokens, prefix } = header
  if (!isCount(batch) || !isCount(length) || !isCount(lossTokens)) return "batch, length and lossTokens must be counts"
  const take = (name: string, dtype: Dtype, required: boolean): TypedArray | undefined | string => {
    const a = arrays.get(name)
    if (a === undefined) return required ? `the micro-batch has no ${name}` : undefined
    return a instanceof dtypes[dtype] ? a : `${name} must be ${dtype}`
  }
  const out: Record<string, unknown> = { batch, length, lossTokens }
  for (const [k, dtype] of batchArrays) out[k] = take(k, dtype, true)
  for (const [k, dtype] of optionalArrays) {
    const a = take(k, dtype, false)
    if (a !== undefined) out[k] = a
  }
  if (prefix !== undefined) {
    const p = prefix as Record<string, unknown>
    if (!isCount(p["batch"]) || !isCount(p["length"])) return "prefix.batch and prefix.length must be counts"
    const taken: Record<string, unknown> = { batch: p["batch"], length: p["length"] }
    for (const [k, dtype] of prefixArrays) taken[k] = take(`prefix.${k}`, dtype, true)
    const bad = Object.values(taken).find((v) => typeof v === "string")
    if (bad !== undefined) return bad as string
    out["prefix"] = taken
  }
  const bad = Object.values(out).find((v) => typeof v === "string")
  return bad !== undefined ? bad as string : out as unknown as Packing.MicroBatch
}

// ===== Results and weights =====

/** @internal */
export const encodeResult = (r: GradientBackend.MicroBatchResult): Buffer => {
  const { tokenLogprobs, ...figures } = r
  return encode(figures, [["tokenLogprobs", tokenLogprobs]])
}

/** @internal */
export const decodeResult = ({ header, arrays }: Frame): GradientBackend.MicroBatchResult | string => {
  const tokenLogprobs = arrays.get("tokenLogprobs")
  if (!(tokenLogprobs instanceof Float32Array)) return "the reply holds no tokenLogprobs"
  const keys = ["loss", "tokens", "clipped", "clippedLower", "approxKl", "entropy", "kl"] as const
  const missing = keys.find((k) => typeof header[k] !== "number" && header[k] !== null)
  if (missing !== undefined) return `the reply holds no ${missing}`
  // JSON writes NaN and ±Infinity as null: a non-finite figure comes back as NaN.
  const figure = (k: typeof keys[number]) => header[k] === null ? NaN : header[k] as number
  return {
    tokenLogprobs,
    loss: figure("loss"),
    tokens: figure("tokens"),
    clipped: figure("clipped"),
    clippedLower: figure("clippedLower"),
    approxKl: figure("approxKl"),
    entropy: figure("entropy"),
    kl: figure("kl")
  }
}

/**
 * Named weights, or why the frame does not hold exactly `expected` (names and sizes).
 *
 * @internal
 */
export const decodeWeights = (
  { arrays }: Frame,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
): GradientBackend.Weights | string => {
  const out = new Map<string, Float32Array>()
  for (const { name, shape } of expected) {
    const a = arrays.get(name)
    const size = shape.reduce((x, y) => x * y, 1)
    if (!(a instanceof Float32Array)) return `weight ${name} is missing or not f32`
    if (a.length !== size) return `weight ${name} has ${a.length} values, expected ${size} ([${shape}])`
    out.set(name, a)
  }
  if (arrays.size !== expected.length) {
    const extra = [...arrays.keys()].filter((k) => !out.has(k))
    return `unexpected weights: ${extra.slice(0, 5).join(", ")}${extra.length > 5 ? ", …" : ""}`
  }
  // Weights from the network are checked as a model folder's are: NaN or ±Infinity would only train to more of it.
  const bad = Finite.firstNonFinite(out)
  if (bad !== undefined) {
    return `weight ${bad.tensor} holds ${bad.count} non-finite value(s), the first ${bad.value} at index ${bad.index}`
  }
  return out
}
