/**
 * Read and write the safetensors format (Hugging Face's weight files): an 8-byte little-endian header length, a
 * JSON header `{ name: { dtype, shape, data_offsets: [begin, end] }, __metadata__?: { string: string } }`, then
 * the raw little-endian tensor bytes. Parsing validates every entry (known dtype, offsets inside the data,
 * byte size matching the shape, no overlaps) and fails with a {@link SafetensorsError} naming the file and the
 * tensor; it never throws.
 *
 * Files on disk are read by streaming ({@link readIndex}, {@link readTensors}): the headers first, then each tensor
 * by positioned reads straight into its `Float32Array` (BF16/F16 widened chunk by chunk), so neither a file's size
 * (no 2 GiB ceiling) nor a second copy of the weights bounds what loads. A checkpoint is one file or Hugging Face's
 * shards behind `<prefix>.safetensors.index.json`; {@link writeSharded} writes both, streamed, in F32 or BF16.
 * {@link parse} and {@link serialize} work on bytes in memory (weights pushed over HTTP).
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, type PlatformError, Schema } from "effect"
import * as FloatCodec from "./internal/floatCodec.ts"
import * as Layout from "./internal/shardLayout.ts"

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
 * A file (a single-file checkpoint, an index or a shard the index names) does not exist.
 *
 * @category errors
 * @since 0.1.0
 */
export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * A file exists but this process may not read (or write) it.
 *
 * @category errors
 * @since 0.1.0
 */
export class PermissionDenied extends Schema.TaggedError<PermissionDenied>()("PermissionDenied", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The path names a directory (or another non-file).
 *
 * @category errors
 * @since 0.1.0
 */
export class NotAFile extends Schema.TaggedError<NotAFile>()("NotAFile", { message: Schema.String }) {}

/**
 * One tensor is stored in two shards of a sharded checkpoint (`files`: both).
 *
 * @category errors
 * @since 0.1.0
 */
export class DuplicateTensor extends Schema.TaggedError<DuplicateTensor>()("DuplicateTensor", {
  message: Schema.String,
  tensor: Schema.String,
  files: Schema.Array(Schema.String)
}) {}

/**
 * Any other read or write failure of the file system (a full disk's `cause` says ENOSPC).
 *
 * @category errors
 * @since 0.1.0
 */
export class Io extends Schema.TaggedError<Io>()("Io", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
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
  DTypeMismatch,
  NotFound,
  PermissionDenied,
  NotAFile,
  DuplicateTensor,
  Io
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
    return "tensor" in this.reason ? this.reason.tensor : undefined
  }
}

/** Each reason's class by its tag, for `safetensorsError`; a reason left out is a compile error. */
const reasons = {
  Corrupt,
  MissingTensor,
  UnexpectedTensor,
  ShapeMismatch,
  DTypeMismatch,
  NotFound,
  PermissionDenied,
  NotAFile,
  DuplicateTensor,
  Io
} satisfies Record<
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

/** A header entry checked against the data: offsets relative to the start of the data. */
interface Span {
  readonly dtype: DType
  readonly shape: ReadonlyArray<number>
  readonly begin: number
  readonly end: number
}

/** Checks a decoded header against `dataLength` data bytes: entries in file order, and the metadata. */
const checkHeader = Effect.fnUntraced(function*(header: unknown, dataLength: number, file: string) {
  const corrupt = (message: string, tensor?: string) =>
    safetensorsError(file, "Corrupt", message, tensor === undefined ? {} : { tensor })
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    return yield* corrupt(`${file}: the header is not a JSON object`)
  }
  const spans = new Map<string, Span>()
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
    spans.set(name, { dtype: entry.dtype, shape: entry.shape, begin, end })
  }
  const overlap = firstOverlap(ranges)
  if (overlap !== undefined) {
    return yield* corrupt(`${file}: tensors "${overlap[0]}" and "${overlap[1]}" overlap`, overlap[1])
  }
  return { spans, metadata }
})

/** The first two tensors whose byte ranges `[begin, end, name]` overlap, in file order. */
const firstOverlap = (ranges: Array<readonly [number, number, string]>): readonly [string, string] | undefined => {
  ranges.sort((a, b) => a[0] - b[0])
  for (let i = 1; i < ranges.length; i++) {
    if (ranges[i]![0] < ranges[i - 1]![1]) return [ranges[i - 1]![2], ranges[i]![2]]
  }
  return undefined
}

const parseHeaderJson = (bytes: Uint8Array, file: string) =>
  Effect.try({
    try: () => JSON.parse(new TextDecoder("utf-8", { fatal: false }).decode(bytes)) as unknown,
    catch: () => safetensorsError(file, "Corrupt", `${file}: the header is not valid JSON`)
  })

/**
 * Parses a whole file held in memory. Tensor bytes are views into `bytes` (no copy). For files on disk, prefer
 * {@link readHeader} and {@link readTensors}, which never hold a whole file.
 *
 * @category decoding
 * @since 0.1.0
 */
export const parse = Effect.fnUntraced(function*(bytes: Uint8Array, file = "<memory>") {
  const corrupt = (message: string) => safetensorsError(file, "Corrupt", message)
  if (bytes.length < 8) return yield* corrupt(`${file}: ${bytes.length} bytes is too short for a safetensors file`)
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const headerLength = Number(view.getBigUint64(0, true))
  if (headerLength > bytes.length - 8) {
    return yield* corrupt(`${file}: header length ${headerLength} exceeds the file size ${bytes.length} (truncated?)`)
  }
  const header = yield* parseHeaderJson(bytes.subarray(8, 8 + headerLength), file)
  const dataStart = 8 + headerLength
  const { spans, metadata } = yield* checkHeader(header, bytes.length - dataStart, file)
  const tensors = new Map<string, Tensor>()
  for (const [name, { dtype, shape, begin, end }] of spans) {
    tensors.set(name, { dtype, shape, bytes: bytes.subarray(dataStart + begin, dataStart + end) })
  }
  return { tensors, metadata } satisfies File
})

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
    case "BF16": {
      // An aligned copy of the bits (the bytes may sit at an odd offset), widened through typed-array views.
      const raw = new Uint16Array(n)
      new Uint8Array(raw.buffer).set(t.bytes)
      if (t.dtype === "BF16") FloatCodec.widenBf16(raw, out)
      else FloatCodec.widenF16(raw, out)
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
  const f32 = tensors.map((t) => ({ ...t, dtype: "F32" }))
  const { prefix, dataBytes } = Layout.encodeHeader(f32, tensors.map((t) => t.data.byteLength), metadata)
  const out = new Uint8Array(prefix.length + dataBytes)
  out.set(prefix)
  let at = prefix.length
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

// ===== Reading files =====

/**
 * Where a tensor lives on disk: its file and the absolute byte range `[begin, end)` in that file.
 *
 * @category models
 * @since 0.1.0
 */
export interface Location {
  readonly dtype: DType
  readonly shape: ReadonlyArray<number>
  readonly file: string
  readonly begin: number
  readonly end: number
}

/**
 * The headers of a checkpoint (one file, or every shard an index names): where each tensor is, in file order, and
 * the metadata of the first file. No tensor data is read.
 *
 * @category models
 * @since 0.1.0
 */
export interface Index {
  /** The single file, or the `*.safetensors.index.json`. */
  readonly file: string
  readonly tensors: ReadonlyMap<string, Location>
  readonly metadata: Readonly<Record<string, string>>
  /** The tensor files, in order. */
  readonly files: ReadonlyArray<string>
}

/** A `PlatformError` of `file` as the reason that names its cause. */
const fsError = (file: string, verb: "read" | "write") => (e: PlatformError.PlatformError): SafetensorsError => {
  const tag = e.reason._tag
  if (tag === "NotFound") {
    return safetensorsError(file, "NotFound", `cannot ${verb} ${file}: no such file`, { cause: e })
  }
  if (tag === "PermissionDenied") {
    return safetensorsError(file, "PermissionDenied", `cannot ${verb} ${file}: permission denied`, { cause: e })
  }
  if (tag === "BadResource") return safetensorsError(file, "NotAFile", `cannot ${verb} ${file}: not a regular file`)
  return safetensorsError(file, "Io", `cannot ${verb} ${file}: ${e.message}`, { cause: e })
}

/** Bytes one positioned read or write of float32 moves at most: far below Node's 2 GiB limit per call. */
const chunkBytes = 1 << 24

/** Bytes of 16- or 64-bit data converted at a time: a scratch buffer that stays in cache (measured faster). */
const scratchBytes = 1 << 20

/** The largest header accepted (the reference implementation's limit): a bigger length is a corrupt file. */
const maxHeaderBytes = 100_000_000

/** Fills `into` from `position` of an open file; a short file is `Corrupt` (truncated). */
const readFully = Effect.fnUntraced(function*(
  handle: FileSystem.File,
  file: string,
  into: Uint8Array,
  position: number
) {
  let done = 0
  while (done < into.length) {
    const n = yield* handle.read(into.subarray(done), { position: BigInt(position + done) }).pipe(
      Effect.mapError(fsError(file, "read"))
    )
    if (n === 0) {
      const at = position + done
      return yield* safetensorsError(file, "Corrupt", `${file}: ends at byte ${at}, before the data it declares`)
    }
    done += n
  }
})

/** Stats `file` (a regular file, or the reason it is not) and opens it for reading in the current scope. */
const openForRead = Effect.fnUntraced(function*(file: string) {
  const fs = yield* FileSystem.FileSystem
  const info = yield* fs.stat(file).pipe(Effect.mapError(fsError(file, "read")))
  if (info.type !== "File") {
    const what = info.type === "Directory" ? "a directory" : `not a regular file (${info.type})`
    return yield* safetensorsError(file, "NotAFile", `cannot read ${file}: it is ${what}`)
  }
  const handle = yield* fs.open(file, { flag: "r" }).pipe(Effect.mapError(fsError(file, "read")))
  return { handle, size: Number(info.size) }
})

/**
 * Reads the header of one safetensors file (its first 8 + N bytes only) and checks every entry against the file's
 * size: a file cut short is `Corrupt`, naming the first tensor past its end. Files of any size (no 2 GiB limit).
 *
 * @category decoding
 * @since 0.1.0
 */
export const readHeader = Effect.fn("Safetensors.readHeader")(function*(file: string) {
  return yield* Effect.scoped(Effect.gen(function*() {
    const { handle, size } = yield* openForRead(file)
    const corrupt = (message: string) => safetensorsError(file, "Corrupt", message)
    if (size < 8) return yield* corrupt(`${file}: ${size} bytes is too short for a safetensors file`)
    const prefix = new Uint8Array(8)
    yield* readFully(handle, file, prefix, 0)
    const headerLength = Number(new DataView(prefix.buffer).getBigUint64(0, true))
    if (headerLength > size - 8) {
      return yield* corrupt(`${file}: header length ${headerLength} exceeds the file size ${size} (truncated?)`)
    }
    if (headerLength > maxHeaderBytes) {
      return yield* corrupt(`${file}: header length ${headerLength} is over the format's ${maxHeaderBytes} bytes`)
    }
    const headerBytes = new Uint8Array(headerLength)
    yield* readFully(handle, file, headerBytes, 8)
    const dataStart = 8 + headerLength
    const { spans, metadata } = yield* checkHeader(yield* parseHeaderJson(headerBytes, file), size - dataStart, file)
    const tensors = new Map<string, Location>()
    for (const [name, span] of spans) {
      tensors.set(name, { ...span, file, begin: dataStart + span.begin, end: dataStart + span.end })
    }
    return { file, tensors, metadata, files: [file] } satisfies Index
  }))
})

const IndexJson = Schema.fromJsonString(Schema.Struct({
  weight_map: Schema.Record(Schema.String, Schema.String)
}))

/**
 * Reads a sharded checkpoint's `*.safetensors.index.json` and the header of every shard its `weight_map` names
 * (shards resolved beside the index). A shard that is missing is `NotFound` naming it; a tensor stored in two
 * shards is `DuplicateTensor`; a tensor the index places in a shard that does not hold it is `MissingTensor`; a
 * tensor a shard holds but the index does not list is `Corrupt`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const readIndexFile = Effect.fn("Safetensors.readIndexFile")(function*(indexFile: string) {
  const fs = yield* FileSystem.FileSystem
  const corrupt = (message: string) => safetensorsError(indexFile, "Corrupt", message)
  const text = yield* fs.readFileString(indexFile).pipe(Effect.mapError(fsError(indexFile, "read")))
  const { weight_map } = yield* Schema.decodeUnknownEffect(IndexJson)(text).pipe(
    Effect.mapError((e) => corrupt(`${indexFile}: not a safetensors index (${e.message})`))
  )
  const shards = [...new Set(Object.values(weight_map))]
  const bad = shards.find((s) => s === "" || s === "." || s === ".." || /[/\\]/.test(s))
  if (bad !== undefined) return yield* corrupt(`${indexFile}: shard "${bad}" is not a file name beside the index`)
  const dir = Layout.dirname(indexFile)
  const tensors = new Map<string, Location>()
  let metadata: Readonly<Record<string, string>> = {}
  for (const [i, shard] of shards.entries()) {
    const header = yield* readHeader(Layout.join(dir, shard)).pipe(
      Effect.catchReason("SafetensorsError", "NotFound", (reason) => {
        const message = `${indexFile} lists shard ${shard}, which is missing`
        return Effect.fail(safetensorsError(Layout.join(dir, shard), "NotFound", message, { cause: reason }))
      })
    )
    if (i === 0) metadata = header.metadata
    yield* addShard(indexFile, weight_map, tensors, header)
  }
  for (const [name, shard] of Object.entries(weight_map)) {
    const found = tensors.get(name)
    if (found === undefined || Layout.basename(found.file) !== shard) {
      const message = `${indexFile} places tensor "${name}" in ${shard}, which does not hold it`
      return yield* safetensorsError(Layout.join(dir, shard), "MissingTensor", message, { tensor: name, expected: [] })
    }
  }
  return { file: indexFile, tensors, metadata, files: shards.map((s) => Layout.join(dir, s)) } satisfies Index
})

/** Adds a shard's tensors to `tensors`: each must be listed in the index and in no shard read before. */
const addShard = Effect.fnUntraced(function*(
  indexFile: string,
  weightMap: Readonly<Record<string, string>>,
  tensors: Map<string, Location>,
  shard: Index
) {
  for (const [name, location] of shard.tensors) {
    const before = tensors.get(name)
    if (before !== undefined) {
      const message = `tensor "${name}" is stored in two shards: ${before.file} and ${location.file}`
      const files = [before.file, location.file]
      return yield* safetensorsError(indexFile, "DuplicateTensor", message, { tensor: name, files })
    }
    if (weightMap[name] === undefined) {
      const message = `${location.file}: tensor "${name}" is not listed in ${indexFile}`
      return yield* safetensorsError(indexFile, "Corrupt", message, { tensor: name })
    }
    tensors.set(name, location)
  }
})

/**
 * The checkpoint named `prefix` in `dir`, as Hugging Face lays it out: `<prefix>.safetensors.index.json` with its
 * shards when the index exists, else the single `<prefix>.safetensors`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const readIndex = Effect.fn("Safetensors.readIndex")(function*(dir: string, prefix = "model") {
  const fs = yield* FileSystem.FileSystem
  const indexFile = Layout.join(dir, `${prefix}.safetensors.index.json`)
  const indexed = yield* fs.exists(indexFile).pipe(Effect.mapError(fsError(indexFile, "read")))
  return yield* indexed ? readIndexFile(indexFile) : readHeader(Layout.join(dir, `${prefix}.safetensors`))
})

/** Checks `index` holds exactly `expected` with their shapes and float dtypes, before any data is read. */
const checkExpected = Effect.fnUntraced(function*(
  index: Index,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  const file = index.file
  for (const { name, shape } of expected) {
    const t = index.tensors.get(name)
    if (t === undefined) {
      const message = `${file}: tensor "${name}" [${shape.join(", ")}] is missing`
      return yield* safetensorsError(file, "MissingTensor", message, { tensor: name, expected: shape })
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      return yield* safetensorsError(
        t.file,
        "ShapeMismatch",
        `${t.file}: tensor "${name}" has shape [${t.shape.join(", ")}], the model needs [${shape.join(", ")}]`,
        { tensor: name, shape: t.shape, expected: shape }
      )
    }
    if (t.dtype !== "F32" && t.dtype !== "F16" && t.dtype !== "BF16" && t.dtype !== "F64") {
      return yield* safetensorsError(
        t.file,
        "DTypeMismatch",
        `${t.file}: tensor "${name}" has dtype ${t.dtype}; a floating-point tensor is required`,
        { tensor: name, dtype: t.dtype }
      )
    }
  }
  const names = new Set(expected.map((e) => e.name))
  for (const [name, t] of index.tensors) {
    if (!names.has(name)) {
      const message = `${t.file}: tensor "${name}" is not a parameter of this model`
      return yield* safetensorsError(t.file, "UnexpectedTensor", message, { tensor: name })
    }
  }
})

/**
 * Reads one tensor's bytes from an open file straight into `dest`, widening 16- and 64-bit floats chunk by chunk; a
 * `Uint16Array` destination takes a BF16 tensor's bits as they are.
 */
const readInto = Effect.fnUntraced(function*(
  handle: FileSystem.File,
  t: Location,
  dest: Float32Array | Uint16Array,
  scratch: Uint8Array
) {
  const width = byteSize[t.dtype]
  const raw = t.dtype === "F32" || dest instanceof Uint16Array
  const total = t.end - t.begin, step = raw ? chunkBytes : scratch.length
  for (let at = 0; at < total; at += step) {
    const bytes = Math.min(step, total - at)
    if (raw) {
      yield* readFully(handle, t.file, new Uint8Array(dest.buffer, dest.byteOffset + at, bytes), t.begin + at)
      continue
    }
    const chunk = scratch.subarray(0, bytes)
    yield* readFully(handle, t.file, chunk, t.begin + at)
    const count = bytes / width, offset = at / width
    if (dest instanceof Uint16Array) continue // unreachable: read raw above
    if (t.dtype === "BF16") FloatCodec.widenBf16(new Uint16Array(chunk.buffer, 0, count), dest, offset)
    else if (t.dtype === "F16") FloatCodec.widenF16(new Uint16Array(chunk.buffer, 0, count), dest, offset)
    else dest.set(new Float64Array(chunk.buffer, 0, count), offset)
  }
})

/**
 * Reads exactly the `expected` float tensors of `index` into fresh `Float32Array`s: F32 read straight into them,
 * BF16/F16/F64 widened through a bounded scratch buffer; every tensor checked (`MissingTensor`, `ShapeMismatch`,
 * `DTypeMismatch`, `UnexpectedTensor`) before any data is read. Files are read one at a time, tensors in file order,
 * so memory is the result plus one chunk (never a whole file, never two copies).
 *
 * @category decoding
 * @since 0.1.0
 */
export const readTensors = Effect.fn("Safetensors.readTensors")(function*(
  index: Index,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  yield* checkExpected(index, expected)
  return (yield* readChecked(index, expected, false)) as Map<string, Float32Array>
})

/**
 * {@link readTensors}, except that BF16 tensors come back as their bits (`Uint16Array`, half the memory of widened
 * values: a checkpoint's bfloat16 optimizer moments); the other float types are widened as there.
 *
 * @category decoding
 * @since 0.1.0
 */
export const readTensorsKeepingBf16 = Effect.fn("Safetensors.readTensorsKeepingBf16")(function*(
  index: Index,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>
) {
  yield* checkExpected(index, expected)
  return yield* readChecked(index, expected, true)
})

/** The tensors of a checked index, file by file in file order (BF16 as bits when `keepBf16`). */
const readChecked = Effect.fnUntraced(function*(
  index: Index,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  keepBf16: boolean
) {
  const out = new Map<string, Float32Array | Uint16Array>(expected.map((e) => [e.name, new Float32Array(0)]))
  const scratch = new Uint8Array(scratchBytes)
  for (const file of index.files) {
    const here = [...index.tensors].filter(([, t]) => t.file === file).sort((a, b) => a[1].begin - b[1].begin)
    yield* Effect.scoped(Effect.gen(function*() {
      const { handle } = yield* openForRead(file)
      for (const [name, t] of here) {
        const count = t.shape.reduce((a, b) => a * b, 1)
        const dest = keepBf16 && t.dtype === "BF16" ? new Uint16Array(count) : new Float32Array(count)
        yield* readInto(handle, t, dest, scratch)
        out.set(name, dest)
      }
    }))
  }
  return out
})

/**
 * {@link readIndex} then {@link readTensors}: the `expected` tensors of the checkpoint `prefix` in `dir`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const readFloat32Files = Effect.fn("Safetensors.readFloat32Files")(function*(
  dir: string,
  expected: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number> }>,
  prefix = "model"
) {
  return yield* readTensors(yield* readIndex(dir, prefix), expected)
})

// ===== Writing files =====

/**
 * A tensor to write: `data` is float32 in row-major order, or a function producing it when its turn comes (so a
 * checkpoint larger than memory can be generated tensor by tensor).
 *
 * @category models
 * @since 0.1.0
 */
export interface WriteTensor {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  /** Float32 values, a function giving them, or bfloat16 bits (`Uint16Array`: written as they are in a BF16 file). */
  readonly data: Float32Array | Uint16Array | (() => Float32Array)
}

/**
 * @category models
 * @since 0.1.0
 */
export interface WriteOptions {
  /** Element type on disk: F32 (default, bit-exact) or BF16 (round-to-nearest-even, as PyTorch narrows). */
  readonly dtype?: "F32" | "BF16"
  /** A shard closes before a tensor that would take it past this many data bytes (default 2 GB). */
  readonly maxShardBytes?: number
  /** String metadata written in every shard's header (Hugging Face writes `{ format: "pt" }`). */
  readonly metadata?: Readonly<Record<string, string>>
}

/**
 * What {@link writeSharded} wrote: the tensor files in order, and the index (absent for a single file).
 *
 * @category models
 * @since 0.1.0
 */
export interface Written {
  readonly files: ReadonlyArray<string>
  readonly index: string | undefined
  readonly totalBytes: number
}

/** The default shard size limit, 2 GB (decimal, as `max_shard_size="2GB"` in transformers). */
export const defaultMaxShardBytes = 2_000_000_000

/** Removes files of `prefix` that a save before this one left (an old single file, shards of another count). */
const removeStale = Effect.fnUntraced(function*(dir: string, prefix: string, kept: ReadonlySet<string>) {
  const fs = yield* FileSystem.FileSystem
  for (const entry of yield* fs.readDirectory(dir).pipe(Effect.mapError(fsError(dir, "read")))) {
    if (!kept.has(entry) && Layout.isTensorFile(prefix, entry)) {
      yield* fs.remove(Layout.join(dir, entry)).pipe(Effect.mapError(fsError(Layout.join(dir, entry), "write")))
    }
  }
})

/** Writes one tensor's values to an open file, narrowed to BF16 chunk by chunk when asked. */
const writeTensor = Effect.fnUntraced(function*(
  handle: FileSystem.File,
  file: string,
  t: WriteTensor,
  dtype: "F32" | "BF16",
  scratch: Uint16Array
) {
  const data = typeof t.data === "function" ? t.data() : t.data
  const count = t.shape.reduce((a, b) => a * b, 1)
  if (data.length !== count) {
    const message = `${file}: tensor "${t.name}" has ${data.length} values, ` +
      `its shape [${t.shape.join(", ")}] needs ${count}`
    return yield* safetensorsError(file, "ShapeMismatch", message, {
      tensor: t.name,
      shape: [data.length],
      expected: t.shape
    })
  }
  const step = dtype === "F32" ? chunkBytes / 4 : scratch.length
  for (let at = 0; at < count; at += step) {
    const values = data.subarray(at, Math.min(count, at + step))
    yield* handle.writeAll(encodeChunk(values, dtype, scratch)).pipe(Effect.mapError(fsError(file, "write")))
  }
})

/** A chunk of values as the bytes of `dtype`: as they are, narrowed to BF16, or bfloat16 bits widened to F32. */
const encodeChunk = (values: Float32Array | Uint16Array, dtype: "F32" | "BF16", scratch: Uint16Array): Uint8Array => {
  const asIs = (values instanceof Float32Array) === (dtype === "F32")
  if (asIs) return new Uint8Array(values.buffer, values.byteOffset, values.byteLength)
  if (values instanceof Float32Array) {
    FloatCodec.narrowBf16(values, scratch)
    return new Uint8Array(scratch.buffer, 0, values.length * 2)
  }
  const out = new Float32Array(values.length)
  FloatCodec.widenBf16(Uint16Array.from(values), out) // a copy: `widenBf16` reads pairs from a 4-byte boundary
  return new Uint8Array(out.buffer)
}

/** Writes one safetensors file (header, then every tensor streamed), replacing any file at `file`. */
const writeFile = Effect.fnUntraced(function*(
  file: string,
  tensors: ReadonlyArray<WriteTensor>,
  dtype: "F32" | "BF16",
  metadata: Readonly<Record<string, string>> | undefined
) {
  const fs = yield* FileSystem.FileSystem
  const sizes = tensors.map((t) => t.shape.reduce((a, b) => a * b, 1) * byteSize[dtype])
  const { prefix } = Layout.encodeHeader(tensors.map((t) => ({ ...t, dtype })), sizes, metadata)
  const scratch = new Uint16Array(scratchBytes / 2)
  yield* Effect.scoped(Effect.gen(function*() {
    const handle = yield* fs.open(file, { flag: "w" }).pipe(Effect.mapError(fsError(file, "write")))
    yield* handle.writeAll(prefix).pipe(Effect.mapError(fsError(file, "write")))
    for (const t of tensors) yield* writeTensor(handle, file, t, dtype, scratch)
  }))
})

/**
 * Writes tensors as Hugging Face shards them: one `<prefix>.safetensors` when they fit in one shard, else
 * `<prefix>-0000K-of-0000N.safetensors` files and `<prefix>.safetensors.index.json` (`metadata.total_size`,
 * `weight_map` name → shard). Every file is streamed (no whole-file buffer; BF16 narrowed chunk by chunk).
 *
 * **Details** A previous index of the same prefix is removed first and the new one is written last (to a temporary
 * name, then renamed), so a crash mid-write leaves either no index and a truncated file, or an index whose shard is
 * short: both are read back as errors, never as weights. Stale files of the prefix (an old single file, shards of
 * another count) are removed once the new set is complete.
 *
 * @category encoding
 * @since 0.1.0
 */
export const writeSharded = Effect.fn("Safetensors.writeSharded")(function*(
  dir: string,
  prefix: string,
  tensors: ReadonlyArray<WriteTensor>,
  options: WriteOptions = {}
) {
  const fs = yield* FileSystem.FileSystem
  const dtype = options.dtype ?? "F32"
  const sizes = tensors.map((t) => t.shape.reduce((a, b) => a * b, 1) * byteSize[dtype])
  const shards = Layout.planShards(sizes, options.maxShardBytes ?? defaultMaxShardBytes)
  const indexFile = Layout.join(dir, `${prefix}.safetensors.index.json`)
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect.mapError(fsError(dir, "write")))
  yield* fs.remove(indexFile, { force: true }).pipe(Effect.mapError(fsError(indexFile, "write")))
  const names = Layout.shardNames(prefix, shards.length)
  const weightMap: Record<string, string> = {}
  for (const [i, members] of shards.entries()) {
    const file = Layout.join(dir, names[i]!)
    yield* writeFile(file, members.map((k) => tensors[k]!), dtype, options.metadata)
    for (const k of members) weightMap[tensors[k]!.name] = names[i]!
  }
  const totalBytes = sizes.reduce((a, b) => a + b, 0)
  if (shards.length > 1) {
    const json = JSON.stringify({ metadata: { total_size: totalBytes }, weight_map: weightMap }, null, 2) + "\n"
    yield* fs.writeFileString(`${indexFile}.tmp`, json).pipe(Effect.mapError(fsError(indexFile, "write")))
    yield* fs.rename(`${indexFile}.tmp`, indexFile).pipe(Effect.mapError(fsError(indexFile, "write")))
  }
  yield* removeStale(dir, prefix, new Set(names))
  const written: Written = {
    files: names.map((n) => Layout.join(dir, n)),
    index: shards.length > 1 ? indexFile : undefined,
    totalBytes
  }
  return written
})
