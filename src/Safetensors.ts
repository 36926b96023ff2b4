/**
 * Read and write the safetensors format (Hugging Face's weight files): an 8-byte little-endian header length, a
 * JSON header `{ name: { dtype, shape, data_offsets: [begin, end] }, __metadata__?: { string: string } }`, then
 * the raw little-endian tensor bytes. Parsing validates every entry (known dtype, offsets inside the data,
 * byte size matching the shape, no overlaps) and fails with a {@link SafetensorsError} naming the file and the
 * tensor; it never throws.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"

// ===== Models =====

/**
 * Element types of the format. F16 and BF16 can be read (widened to float32); the writer emits what it is given.
 *
 * @category models
 * @since 0.1.0
 */
export type DType = "F64" | "F32" | "F16" | "BF16" | "I64" | "I32" | "I16" | "I8" | "U8" | "BOOL"

const byteSize: Readonly<Record<DType, number>> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1
}

/**
 * One tensor: dtype, shape and its raw bytes (a view into the file when parsed).
 *
 * @category models
 * @since 0.1.0
 */
export interface Tensor {
  readonly dtype: DType
  readonly shape: ReadonlyArray<number>
  readonly bytes: Uint8Array
}

/**
 * A parsed file: tensors by name, in file order, plus the free-form string metadata.
 *
 * @category models
 * @since 0.1.0
 */
export interface File {
  readonly tensors: ReadonlyMap<string, Tensor>
  readonly metadata: Readonly<Record<string, string>>
}

/**
 * Truncated, a bad header, offsets outside the data or overlapping (`tensor`: the entry at fault, when one is).
 *
 * @category errors
 * @since 0.1.0
 */
export class Corrupt extends Schema.TaggedError<Corrupt>()("Corrupt", {
  message: Schema.String,
  tensor: Schema.optionalKey(Schema.String)
}) {}

/**
 * A tensor the model needs is absent.
 *
 * @category errors
 * @since 0.1.0
 */
export class MissingTensor extends Schema.TaggedError<MissingTensor>()("MissingTensor", {
  message: Schema.String,
  tensor: Schema.String,
  /** The shape the model needs. */
  expected: Schema.Array(Schema.Int)
}) {}

/**
 * A tensor the model does not have.
 *
 * @category errors
 * @since 0.1.0
 */
export class UnexpectedTensor extends Schema.TaggedError<UnexpectedTensor>()("UnexpectedTensor", {
  message: Schema.String,
  tensor: Schema.String
}) {}

/**
 * A tensor present with the wrong shape.
 *
 * @category errors
 * @since 0.1.0
 */
export class ShapeMismatch extends Schema.TaggedError<ShapeMismatch>()("ShapeMismatch", {
  message: Schema.String,
  tensor: Schema.String,
  /** The tensor's shape in the file. */
  shape: Schema.Array(Schema.Int),
  /** The shape the model needs. */
  expected: Schema.Array(Schema.Int)
}) {}

/**
 * A tensor present with a dtype that cannot be used.
 *
 * @category errors
 * @since 0.1.0
 */
export class DTypeMismatch extends Schema.TaggedError<DTypeMismatch>()("DTypeMismatch", {
  message: Schema.String,
  tensor: Schema.String,
  dtype: Schema.String
}) {}

/**
 * Why a safetensors file was rejected.
 *
 * @category errors
 * @since 0.1.0
 */
export const SafetensorsErrorReason = Schema.Union([
  Corrupt,
  MissingTensor,
  UnexpectedTensor,
  ShapeMismatch,
  DTypeMismatch
])
export type SafetensorsErrorReason = typeof SafetensorsErrorReason.Type

/**
 * A safetensors `file` was rejected. Handle reasons with
 * `Effect.catchReason("SafetensorsError", "MissingTensor", …)`; `message` is the reason's.
 *
 * @category errors
 * @since 0.1.0
 */
export class SafetensorsError extends Schema.TaggedError<SafetensorsError>()("SafetensorsError", {
  file: Schema.String,
  reason: SafetensorsErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
  /** The tensor at fault, when one is. */
  get tensor(): string | undefined {
    return this.reason.tensor
  }
}

/** Each reason's class by its tag, for `safetensorsError`; a reason left out is a compile error. */
const reasons = { Corrupt, MissingTensor, UnexpectedTensor, ShapeMismatch, DTypeMismatch } satisfies Record<
  SafetensorsErrorReason["_tag"],
  unknown
>

/**
 * The facts a reason carries besides its message (`tensor`, the shapes of `ShapeMismatch`, `dtype`).
 *
 * @category errors
 * @since 0.1.0
 */
export type SafetensorsErrorFacts<Tag extends SafetensorsErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `SafetensorsError` of `file` for the reason tagged `tag`: `safetensorsError(file, "UnexpectedTensor", text,
 * { tensor })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const safetensorsError = <Tag extends SafetensorsErrorReason["_tag"]>(
  file: string,
  tag: Tag,
  message: string,
  ...[facts]: {} extends SafetensorsErrorFacts<Tag> ? [facts?: SafetensorsErrorFacts<Tag>]
    : [facts: SafetensorsErrorFacts<Tag>]
): SafetensorsError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => SafetensorsErrorReason
  return new SafetensorsError({ file, reason: new Reason({ ...facts, message }) })
}

// ===== Parsing =====

const HeaderEntry = Schema.Struct({
  dtype: Schema.Literals(["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"]),
  shape: Schema.Array(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  data_offsets: Schema.Tuple([Schema.Int, Schema.Int])
})

/**
 * Parses a whole file held in memory. Tensor bytes are views into `bytes` (no copy).
 *
 * @category decoding
 * @since 0.1.0
 */
export const parse = Effect.fnUntraced(function*(bytes: Uint8Array, file = "<memory>") {
  const corrupt = (message: string, tensor?: string) =>
    safetensorsError(file, "Corrupt", message, tensor === undefined ? {} : { tensor })
  if (bytes.length < 8) return yield* corrupt(`${file}: ${bytes.length} bytes is too short for a safetensors file`)
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const headerLength = Number(view.getBigUint64(0, true))
  if (headerLength > bytes.length - 8) {
    return yield* corrupt(`${file}: header length ${headerLength} exceeds the file size ${bytes.length} (truncated?)`)
  }
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes.subarray(8, 8 + headerLength))
  const header = yield* Effect.try({
    try: () => JSON.parse(text) as unknown,
    catch: () => corrupt(`${file}: the header is not valid JSON`)
  })
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    return yield* corrupt(`${file}: the header is not a JSON object`)
  }
  const dataStart = 8 + headerLength, dataLength = bytes.length - dataStart
  const tensors = new Map<string, Tensor>()
  const ranges: Array<readonly [number, number, string]> = []
  let metadata: Record<string, string> = {}
  for (const [name, raw] of Object.entries(header)) {
    if (name === "__metadata__") {
      metadata = yield* Schema.decodeUnknownEffect(Schema.Record(Schema.String, Schema.String))(raw).pipe(
        Effect.mapError(() => corrupt(`${file}: __metadata__ must map strings to strings`))
      )
      continue
    }
    const entry = yield* Schema.decodeUnknownEffect(HeaderEntry)(raw).pipe(
      Effect.mapError((e) => corrupt(`${file}: tensor "${name}" has a malformed header entry: ${e.message}`, name))
    )
    const [begin, end] = entry.data_offsets
    const expected = entry.shape.reduce((a, b) => a * b, 1) * byteSize[entry.dtype]
    if (begin < 0 || end < begin || end > dataLength) {
      return yield* corrupt(
        `${file}: tensor "${name}" spans bytes [${begin}, ${end}) outside the ${dataLength} data bytes (truncated?)`,
        name
      )
    }
    if (end - begin !== expected) {
      return yield* corrupt(
        `${file}: tensor "${name}" ${entry.dtype}[${entry.shape.join(", ")}] needs ${expected} bytes, ` +
          `its offsets give ${end - begin}`,
        name
      )
    }
    ranges.push([begin, end, name])
    const data = bytes.subarray(dataStart + begin, dataStart + end)
    tensors.set(name, { dtype: entry.dtype, shape: entry.shape, bytes: data })
  }
  ranges.sort((a, b) => a[0] - b[0])
  for (let i = 1; i < ranges.length; i++) {
    if (ranges[i]![0] < ranges[i - 1]![1]) {
      return yield* corrupt(`${file}: tensors "${ranges[i - 1]![2]}" and "${ranges[i]![2]}" overlap`, ranges[i]![2])
    }
  }
  return { tensors, metadata } satisfies File
})

const f16ToF32 = (h: number): number => {
  const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff
  if (exp === 0) return sign * Math.pow(2, -14) * (frac / 1024)
  if (exp === 31) return frac ? NaN : sign * Infinity
  return sign * Math.pow(2, exp - 15) * (1 + frac / 1024)
}

/**
 * A tensor's values as a fresh, aligned `Float32Array` (F32 copied; F64, F16 and BF16 converted). Fails with
 * `DTypeMismatch` for integer tensors.
 *
 * @category getters
 * @since 0.1.0
 */
export const toFloat32 = (t: Tensor, file: string, name: string): Effect.Effect<Float32Array, SafetensorsError> => {
  const n = t.shape.reduce((a, b) => a * b, 1)
  const view = new DataView(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength)
  const out = new Float32Array(n)
  switch (t.dtype) {
    case "F32":
      // Byte copy: `bytes` may be an unaligned view into a pooled Node Buffer, whose `slice` does not copy.
      new Uint8Array(out.buffer).set(t.bytes)
      return Effect.succeed(out)
    case "F64":
      for (let i = 0; i < n; i++) out[i] = view.getFloat64(i * 8, true)
      return Effect.succeed(out)
    case "F16":
      for (let i = 0; i < n; i++) out[i] = f16ToF32(view.getUint16(i * 2, true))
      return Effect.succeed(out)
    case "BF16": {
      const bits = new Uint32Array(out.buffer)
      for (let i = 0; i < n; i++) bits[i] = view.getUint16(i * 2, true) << 16
      return Effect.succeed(out)
    }
    default:
      return Effect.fail(
        safetensorsError(
          file,
          "DTypeMismatch",
          `${file}: tensor "${name}" has dtype ${t.dtype}; a floating-point tensor is required`,
          { tensor: name, dtype: t.dtype }
        )
      )
  }
}

// ===== Writing =====

/**
 * Serialises float32 tensors (and optional string metadata) to safetensors bytes, in the given order, with the
 * header padded to an 8-byte boundary as the reference implementation does.
 *
 * @category encoding
 * @since 0.1.0
 */
export const serialize = (
  tensors: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number>; readonly data: Float32Array }>,
  metadata?: Readonly<Record<string, string>>
): Uint8Array => {
  const header: Record<string, unknown> = metadata === undefined ? {} : { __metadata__: metadata }
  let offset = 0
  for (const t of tensors) {
    header[t.name] = { dtype: "F32", shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] }
    offset += t.data.byteLength
  }
  let json = new TextEncoder().encode(JSON.stringify(header))
  const padded = Math.ceil(json.length / 8) * 8
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20)
    p.set(json)
    json = p
  }
  const out = new Uint8Array(8 + json.length + offset)
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true)
  out.set(json, 8)
  let at = 8 + json.length
  for (const t of tensors) {
    out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), at)
    at += t.data.byteLength
  }
  return out
}

// ===== Model weights =====

/**
 * Reads exactly the expected float tensors (F32, or F64/F16/BF16 widened) into fresh `Float32Array`s, failing with
 * `MissingTensor`, `ShapeMismatch`, `DTypeMismatch` or `UnexpectedTensor` (naming the file and the tensor) when
 * the file does not match.
 *
 * @category decoding
 * @since 0.1.0
 */
export const readFloat32 = Effect.fnUntraced(function*(
  parsed: File,
  file: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  const out = new Map<string, Float32Array>()
  for (const { name, shape } of expected) {
    const t = parsed.tensors.get(name)
    if (t === undefined) {
      const message = `${file}: tensor "${name}" [${shape.join(", ")}] is missing`
      return yield* safetensorsError(file, "MissingTensor", message, { tensor: name, expected: shape })
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      return yield* safetensorsError(
        file,
        "ShapeMismatch",
        `${file}: tensor "${name}" has shape [${t.shape.join(", ")}], the model needs [${shape.join(", ")}]`,
        { tensor: name, shape: t.shape, expected: shape }
      )
    }
    out.set(name, yield* toFloat32(t, file, name))
  }
  for (const name of parsed.tensors.keys()) {
    if (!out.has(name)) {
      const message = `${file}: tensor "${name}" is not a parameter of this model`
      return yield* safetensorsError(file, "UnexpectedTensor", message, { tensor: name })
    }
  }
  return out
})
