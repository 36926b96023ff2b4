/**
 * Images as values: the bytes a message carries (PNG or JPEG, usually in a `data:` URL) decoded once into width,
 * height and RGB pixels, named by the SHA-256 of the bytes. Everything downstream keeps the small {@link ImageRef}
 * (hash, size, media type); the pixels live in the {@link Image} value and, on disk, in a sidecar file named by the
 * hash (`images/<sha256>.png` beside samples.jsonl), so a trajectory stays plain JSON.
 *
 * Remote URLs are refused with a typed {@link ImageError} unless the run provides {@link ImageFetch} (a run that
 * allows fetching says so; the default refuses, so a prompt cannot make a worker reach the network).
 *
 * The vision side follows Qwen2-VL: {@link visionGrid} is its `smart_resize` (both sides rounded to a multiple of
 * `patchSize × mergeSize`, scaled into `[minPixels, maxPixels]`), and an image costs one token per merged patch:
 * `(h / patch / merge) × (w / patch / merge)` ({@link visionTokenCount}). {@link resizeForVision} produces the
 * tensor the tower consumes: float32, CHW, normalised with the config's mean and std.
 *
 * @since 0.1.0
 */
import { Context, Effect, Result, Schema } from "effect"
import { createHash } from "node:crypto"

// ===== Models =====

/**
 * The media types an image part may have.
 *
 * @category models
 * @since 0.1.0
 */
export const MediaType = Schema.Literals(["image/png", "image/jpeg"])
export type MediaType = typeof MediaType.Type

/**
 * What a trajectory, a journal line or a report keeps of an image: its content hash (SHA-256 of the encoded bytes,
 * hex), its size and its media type. The bytes are in the sidecar file {@link sidecarPath}.
 *
 * @category models
 * @since 0.1.0
 */
export const ImageRef = Schema.Struct({
  /** 64 lower-case hex digits: it names the sidecar file, so nothing else is accepted. */
  sha256: Schema.String.check(Schema.isPattern(/^[0-9a-f]{64}$/)),
  width: Schema.Number,
  height: Schema.Number,
  mediaType: MediaType
})
export type ImageRef = typeof ImageRef.Type

/**
 * A decoded image: its reference, the encoded bytes (kept for the sidecar and the wire) and the pixels as RGB,
 * row-major, 3 bytes a pixel (alpha dropped, as PIL's `convert("RGB")` does).
 *
 * @category models
 * @since 0.1.0
 */
export interface Image {
  readonly ref: ImageRef
  readonly bytes: Uint8Array
  readonly rgb: Uint8Array
}

/**
 * The vision geometry of a model family: the tower's patch size, the merger's side (2 for Qwen2-VL's 2×2 merger)
 * and the pixel bounds of the resize. Defaults: `minPixels = 4 × factor²`, `maxPixels = 1280 × factor²` with
 * `factor = patchSize × mergeSize` (Qwen2-VL's processor: 56², 28² × 1280 at patch 14, merge 2).
 *
 * @category models
 * @since 0.1.0
 */
export interface VisionGeometry {
  readonly patchSize: number
  readonly mergeSize: number
  readonly minPixels?: number | undefined
  readonly maxPixels?: number | undefined
}

/**
 * The normalisation of the tower's input (per channel, after scaling bytes to [0, 1]).
 *
 * @category models
 * @since 0.1.0
 */
export interface VisionNormalisation {
  readonly mean: readonly [number, number, number]
  readonly std: readonly [number, number, number]
}

/**
 * OpenAI CLIP's mean and std, which Qwen2-VL and Qwen2.5-VL use.
 *
 * @category constants
 * @since 0.1.0
 */
export const clipNormalisation: VisionNormalisation = {
  mean: [0.48145466, 0.4578275, 0.40821073],
  std: [0.26862954, 0.26130258, 0.27577711]
}

/**
 * The resized size and the patch grid of an image (`gridHeight × gridWidth` patches before the merger).
 *
 * @category models
 * @since 0.1.0
 */
export interface VisionGrid {
  readonly height: number
  readonly width: number
  readonly gridHeight: number
  readonly gridWidth: number
  readonly tokens: number
}

// ===== Errors =====

/**
 * The URL is remote (http, https, …) and the run does not allow fetching images.
 *
 * @category errors
 * @since 0.1.0
 */
export class RemoteUrlRefused extends Schema.TaggedError<RemoteUrlRefused>()("RemoteUrlRefused", {
  url: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `remote image URL ${short(this.url)} refused: only data: URLs are read unless the run allows fetching`
  }
}

/**
 * The URL is neither a base64 `data:` URL nor a remote URL.
 *
 * @category errors
 * @since 0.1.0
 */
export class BadDataUrl extends Schema.TaggedError<BadDataUrl>()("BadDataUrl", {
  url: Schema.String,
  detail: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `image URL ${short(this.url)}: ${this.detail}`
  }
}

/**
 * The bytes are not PNG or JPEG (by their signature, or by the declared media type).
 *
 * @category errors
 * @since 0.1.0
 */
export class UnsupportedMediaType extends Schema.TaggedError<UnsupportedMediaType>()("UnsupportedMediaType", {
  mediaType: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `image media type ${this.mediaType} is not supported (PNG or JPEG)`
  }
}

/**
 * The bytes carry a PNG or JPEG signature but do not decode (truncated or corrupt).
 *
 * @category errors
 * @since 0.1.0
 */
export class CorruptImage extends Schema.TaggedError<CorruptImage>()("CorruptImage", {
  mediaType: Schema.String,
  bytes: Schema.Number,
  detail: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `${this.mediaType} image of ${this.bytes} bytes does not decode: ${this.detail}`
  }
}

/**
 * The image's sides are out of range: empty, or longer than 200 times the other side (Qwen2-VL's limit).
 *
 * @category errors
 * @since 0.1.0
 */
export class BadImageSize extends Schema.TaggedError<BadImageSize>()("BadImageSize", {
  width: Schema.Number,
  height: Schema.Number
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `image of ${this.width}×${this.height} refused: sides must be ≥ 1 and within 200:1`
  }
}

/**
 * The model has no vision tower, so an image part cannot be rendered for it.
 *
 * @category errors
 * @since 0.1.0
 */
export class ModelWithoutVision extends Schema.TaggedError<ModelWithoutVision>()("ModelWithoutVision", {
  model: Schema.String
}) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `model ${this.model} has no vision tower: it cannot read image parts (send text only, or serve a vision ` +
      `model)`
  }
}

/**
 * A message's text holds one of the vision tokens (`<|image_pad|>`, …), which would be read as an image's.
 *
 * @category errors
 * @since 0.1.0
 */
export class ReservedToken extends Schema.TaggedError<ReservedToken>()("ReservedToken", { token: Schema.String }) {
  get isRetryable(): boolean {
    return false
  }
  override get message(): string {
    return `a message's text holds ${this.token}, a token reserved for images: send the image as an image_url part`
  }
}

/**
 * Fetching a remote image (where the run allows it) failed.
 *
 * @category errors
 * @since 0.1.0
 */
export class FetchFailed extends Schema.TaggedError<FetchFailed>()("FetchFailed", {
  url: Schema.String,
  detail: Schema.String
}) {
  get isRetryable(): boolean {
    return true
  }
  override get message(): string {
    return `fetching image ${short(this.url)} failed: ${this.detail}`
  }
}

/**
 * @category errors
 * @since 0.1.0
 */
export const ImageErrorReason = Schema.Union([
  RemoteUrlRefused,
  BadDataUrl,
  UnsupportedMediaType,
  CorruptImage,
  BadImageSize,
  ModelWithoutVision,
  ReservedToken,
  FetchFailed
])
export type ImageErrorReason = typeof ImageErrorReason.Type

/**
 * An image could not be read or used. Handle reasons with `Effect.catchReason`.
 *
 * @category errors
 * @since 0.1.0
 */
export class ImageError extends Schema.TaggedError<ImageError>()("ImageError", { reason: ImageErrorReason }) {
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
  override get message(): string {
    return this.reason.message
  }
}

const fail = (reason: ImageErrorReason): Effect.Effect<never, ImageError> => Effect.fail(new ImageError({ reason }))

const short = (url: string): string => (url.length > 64 ? `${url.slice(0, 61)}…` : url)

// ===== Fetching =====

/**
 * How a remote image URL is read. The default refuses every remote URL; {@link allowFetching} reads them with the
 * platform's `fetch` (a run that allows it provides it).
 *
 * @category services
 * @since 0.1.0
 */
export const ImageFetch = Context.Reference<ImageFetchShape>("agentfly/Image/ImageFetch", {
  defaultValue: (): ImageFetchShape => ({ fetch: (url) => fail(new RemoteUrlRefused({ url })) })
})

/**
 * @category services
 * @since 0.1.0
 */
export interface ImageFetchShape {
  readonly fetch: (url: string) => Effect.Effect<Uint8Array, ImageError>
}

/**
 * An {@link ImageFetch} that reads remote URLs with `fetch` (a non-2xx status fails with `FetchFailed`).
 *
 * @category services
 * @since 0.1.0
 */
export const allowFetching: ImageFetchShape = {
  fetch: (url) => {
    const failed = (detail: string) => new ImageError({ reason: new FetchFailed({ url, detail }) })
    return Effect.tryPromise({ try: (signal) => fetch(url, { signal }), catch: (cause) => failed(String(cause)) }).pipe(
      Effect.filterOrFail((response) => response.ok, (response) => failed(`HTTP ${response.status}`)),
      Effect.flatMap((response) =>
        Effect.tryPromise({ try: () => response.arrayBuffer(), catch: (cause) => failed(String(cause)) })
      ),
      Effect.map((buffer) => new Uint8Array(buffer))
    )
  }
}

// ===== URLs =====

/**
 * Whether a URL is a `data:` URL (as against a remote one).
 *
 * @category predicates
 * @since 0.1.0
 */
export const isDataUrl = (url: string): boolean => url.slice(0, 5).toLowerCase() === "data:"

/**
 * The media type and bytes of a base64 `data:` URL (`data:image/png;base64,…`). A remote URL fails with
 * `RemoteUrlRefused`; anything else with `BadDataUrl` or `UnsupportedMediaType`.
 *
 * @category parsing
 * @since 0.1.0
 */
export const parseDataUrl = (url: string): Effect.Effect<{ mediaType: MediaType; bytes: Uint8Array }, ImageError> => {
  if (!isDataUrl(url)) {
    return /^[a-z][a-z0-9+.-]*:\/\//i.test(url)
      ? fail(new RemoteUrlRefused({ url }))
      : fail(new BadDataUrl({ url, detail: "not a data: URL" }))
  }
  const comma = url.indexOf(",")
  if (comma < 0) return fail(new BadDataUrl({ url, detail: "no comma before the data" }))
  const header = url.slice(5, comma).split(";").map((s) => s.trim().toLowerCase())
  if (header[header.length - 1] !== "base64") return fail(new BadDataUrl({ url, detail: "not base64-encoded" }))
  const declared = header[0] === "image/jpg" ? "image/jpeg" : header[0]
  if (declared !== "image/png" && declared !== "image/jpeg") {
    return fail(new UnsupportedMediaType({ mediaType: header[0] === "" ? "(none)" : header[0] }))
  }
  const data = url.slice(comma + 1).replace(/\s+/g, "")
  if (!/^[A-Za-z0-9+/_-]*={0,2}$/.test(data) || data.length === 0) {
    return fail(new BadDataUrl({ url, detail: "the data is not base64" }))
  }
  return Effect.succeed({ mediaType: declared, bytes: new Uint8Array(Buffer.from(data, "base64")) })
}

/**
 * A base64 `data:` URL of an image's bytes.
 *
 * @category formatting
 * @since 0.1.0
 */
export const toDataUrl = (image: { readonly ref: ImageRef; readonly bytes: Uint8Array }): string =>
  `data:${image.ref.mediaType};base64,${Buffer.from(image.bytes).toString("base64")}`

// ===== Decoding =====

/**
 * The SHA-256 of some bytes, hex.
 *
 * @category hashing
 * @since 0.1.0
 */
export const sha256 = (bytes: Uint8Array): string => createHash("sha256").update(bytes).digest("hex")

/**
 * The media type of some bytes by their signature, if PNG or JPEG.
 *
 * @category parsing
 * @since 0.1.0
 */
export const sniff = (bytes: Uint8Array): MediaType | undefined =>
  bytes.length >= 8 && bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47
    ? "image/png"
    : bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff
    ? "image/jpeg"
    : undefined

type CanvasModule = typeof import("@napi-rs/canvas")

// The canvas module once loaded: a dynamic `import()` per image cost 0.1–0.4 ms (a module-loader round trip, through
// tsx's hooks thread under the CLI), more than decoding a small screen.
let canvasLoaded: CanvasModule | undefined

const loadCanvas = Effect.map(Effect.promise(() => import("@napi-rs/canvas")), (module) => (canvasLoaded = module))

// ===== Images this process has checked =====

/**
 * Refs of images this process decoded, or encoded itself ({@link encoded}), by content hash: a ref is a function of
 * the bytes, so bytes seen once are never decoded again to be checked. Bounded: the oldest entries go first.
 */
const known = new Map<string, ImageRef>()
const knownCapacity = 4096

/** Sides that no template takes: empty, or beyond 200:1 (Qwen2-VL's processor refuses those). */
const badSize = (width: number, height: number): boolean =>
  width < 1 || height < 1 || Math.max(width, height) / Math.min(width, height) > 200

const remember = (ref: ImageRef): ImageRef => {
  if (known.size >= knownCapacity) known.delete(known.keys().next().value!)
  known.set(ref.sha256, ref)
  return ref
}

/**
 * The bytes decoded by Skia (`Image.decode()`: the decoder reports corrupt data there, never on `src`), with their
 * ref; the pixels are not read yet.
 */
const decodeChecked = Effect.fnUntraced(function*(bytes: Uint8Array, hash: string = sha256(bytes)) {
  const mediaType = sniff(bytes)
  if (mediaType === undefined) {
    return yield* fail(new UnsupportedMediaType({ mediaType: describeBytes(bytes) }))
  }
  const canvasModule = canvasLoaded ?? (yield* loadCanvas)
  const decoded = yield* Effect.tryPromise({
    try: () => {
      const image = new canvasModule.Image()
      image.src = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
      return image.decode().then(() => image)
    },
    catch: (cause) =>
      new ImageError({
        reason: new CorruptImage({ mediaType, bytes: bytes.length, detail: errorText(cause) })
      })
  })
  const width = decoded.width
  const height = decoded.height
  if (badSize(width, height)) return yield* fail(new BadImageSize({ width, height }))
  const ref = remember({ sha256: hash, width, height, mediaType })
  return { canvasModule, decoded, ref }
})

/**
 * Decodes PNG or JPEG bytes (with `@napi-rs/canvas`, Skia's decoders, loaded on first use so that text-only runs
 * never load the native module) into an {@link Image}. The media type is
 * read from the bytes' signature; bytes that are neither fail with `UnsupportedMediaType`, bytes that do not decode
 * with `CorruptImage`, sides beyond 200:1 with `BadImageSize`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const decode = Effect.fn("Image.decode")(function*(bytes: Uint8Array) {
  const { canvasModule, decoded, ref } = yield* decodeChecked(bytes)
  const { width, height } = ref
  const canvas = canvasModule.createCanvas(width, height)
  const context = canvas.getContext("2d")
  context.drawImage(decoded, 0, 0)
  const rgba = context.getImageData(0, 0, width, height).data
  const rgb = new Uint8Array(width * height * 3)
  for (let i = 0, j = 0; i < rgb.length; i += 3, j += 4) {
    rgb[i] = rgba[j]
    rgb[i + 1] = rgba[j + 1]
    rgb[i + 2] = rgba[j + 2]
  }
  const image: Image = { ref, bytes, rgb }
  return image
})

/**
 * {@link decode} without reading the pixels out: the same checks and failures, the {@link ImageRef} only. What a
 * template needs to count an image's tokens, at a fraction of the cost (no canvas, no RGBA copy); bytes this
 * process already decoded or encoded ({@link encoded}) are known by their hash and not decoded again.
 *
 * @category decoding
 * @since 0.1.0
 */
export const check = (bytes: Uint8Array): Effect.Effect<ImageRef, ImageError> =>
  Effect.suspend(() => {
    const hash = sha256(bytes)
    const ref = known.get(hash)
    return ref !== undefined ? Effect.succeed(ref) : Effect.map(decodeChecked(bytes, hash), (checked) => checked.ref)
  })

/**
 * The ref of a PNG that this process's own encoder has just written (an environment drawing a screen): its size is
 * read from the PNG header and checked against the canvas's, the data is not decoded. Later {@link check}s of the
 * same bytes (a chain's template counting the image's tokens) then skip the decoder, which would only decode what
 * was just encoded. Anything but a PNG of that size fails with a typed `ImageError` (`BadImageSize` as
 * {@link decode} for sides no template takes).
 *
 * **Gotchas**
 *
 * Only for bytes an encoder in this process produced: bytes from a request or a file go through {@link check} or
 * {@link decode}, which find corrupt data.
 *
 * @category decoding
 * @since 0.1.0
 */
export const encoded = (
  bytes: Uint8Array,
  size: { readonly width: number; readonly height: number }
): Result.Result<ImageRef, ImageError> => {
  const header = pngSize(bytes)
  if (header === undefined) {
    return Result.fail(new ImageError({ reason: new UnsupportedMediaType({ mediaType: describeBytes(bytes) }) }))
  }
  if (header.width !== size.width || header.height !== size.height) {
    const detail = `the header says ${header.width} × ${header.height}, the encoder ${size.width} × ${size.height}`
    return Result.fail(
      new ImageError({ reason: new CorruptImage({ mediaType: "image/png", bytes: bytes.length, detail }) })
    )
  }
  if (badSize(header.width, header.height)) return Result.fail(new ImageError({ reason: new BadImageSize(header) }))
  return Result.succeed(remember({ sha256: sha256(bytes), ...header, mediaType: "image/png" }))
}

/**
 * {@link encoded} and the image's `data:` URL ({@link toDataUrl}), remembered by its text: a chain's template that
 * checks that URL ({@link checkUrl}) then reads its ref without parsing the URL, decoding the base64 or hashing the
 * bytes again, work that cost ≈ 25 µs an image in a 64 × 64 GUI screen's turn. The same failures as `encoded`.
 *
 * **Gotchas**
 *
 * As {@link encoded}: only for bytes an encoder in this process produced.
 *
 * @category decoding
 * @since 0.1.0
 */
export const encodedDataUrl = (
  bytes: Uint8Array,
  size: { readonly width: number; readonly height: number }
): Result.Result<string, ImageError> =>
  Result.map(encoded(bytes, size), (ref) => {
    const url = toDataUrl({ ref, bytes })
    if (knownUrls.size >= knownUrlCapacity) knownUrls.delete(knownUrls.keys().next().value!)
    knownUrls.set(url, ref)
    return url
  })

/**
 * Refs of the `data:` URLs {@link encodedDataUrl} wrote, by the URL's text (a function of it, as the ref is of the
 * bytes). Bounded, oldest first: a URL is checked within the turn that drew it, so a few hundred suffice, and the
 * map does not keep a long run's screens alive.
 */
const knownUrls = new Map<string, ImageRef>()
const knownUrlCapacity = 512

/**
 * The ref of a `data:` URL that {@link encodedDataUrl} wrote, or undefined: what {@link checkUrl} would answer for
 * it, without an effect (a template's images resolved in one synchronous pass).
 *
 * @category decoding
 * @since 0.1.0
 */
export const knownUrl = (url: string): ImageRef | undefined => knownUrls.get(url)

/** A PNG's size from its IHDR chunk (the first chunk, at byte 8), or undefined for anything else. */
const pngSize = (bytes: Uint8Array): { width: number; height: number } | undefined => {
  if (sniff(bytes) !== "image/png" || bytes.length < 24) return undefined
  const ihdr = String.fromCharCode(bytes[12]!, bytes[13]!, bytes[14]!, bytes[15]!)
  if (ihdr !== "IHDR") return undefined
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  return { width: view.getUint32(16), height: view.getUint32(20) }
}

/**
 * The encoded bytes of an image URL: a `data:` URL's, or a remote one's through {@link ImageFetch}; a declared media
 * type that the bytes contradict fails with `UnsupportedMediaType`.
 */
const bytesOfUrl = Effect.fnUntraced(function*(url: string) {
  if (!isDataUrl(url) && /^https?:\/\//i.test(url)) {
    const fetcher = yield* ImageFetch
    return yield* fetcher.fetch(url)
  }
  const parsed = yield* parseDataUrl(url)
  const actual = sniff(parsed.bytes)
  if (actual !== undefined && actual !== parsed.mediaType) {
    return yield* fail(new UnsupportedMediaType({ mediaType: `${actual} bytes declared as ${parsed.mediaType}` }))
  }
  return parsed.bytes
})

/**
 * Reads an image URL: a `data:` URL is parsed and decoded; a remote URL goes through {@link ImageFetch} (refused
 * unless the run allows fetching). A declared media type that the bytes contradict fails with
 * `UnsupportedMediaType`.
 *
 * @category decoding
 * @since 0.1.0
 */
export const fromUrl = Effect.fn("Image.fromUrl")(function*(url: string) {
  return yield* decode(yield* bytesOfUrl(url))
})

/**
 * {@link fromUrl} through {@link check}: the same reading and failures, the {@link ImageRef} only.
 *
 * @category decoding
 * @since 0.1.0
 */
export const checkUrl = (url: string): Effect.Effect<ImageRef, ImageError> =>
  Effect.suspend(() => {
    const ref = knownUrls.get(url)
    return ref !== undefined ? Effect.succeed(ref) : Effect.flatMap(bytesOfUrl(url), check)
  })

const describeBytes = (bytes: Uint8Array): string =>
  bytes.length === 0
    ? "(empty)"
    : `unknown (first bytes ${Array.from(bytes.slice(0, 4), (b) => b.toString(16).padStart(2, "0")).join(" ")})`

const errorText = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/**
 * Where an image's bytes live beside a run's samples: `images/<sha256>.png` (or `.jpg`), relative to the run dir.
 *
 * @category files
 * @since 0.1.0
 */
export const sidecarPath = (ref: ImageRef): string =>
  `images/${ref.sha256}.${ref.mediaType === "image/png" ? "png" : "jpg"}`

/**
 * A short label of an image for token views: `[image 64×48 sha256:ab12cd34… 12 tokens]`.
 *
 * @category formatting
 * @since 0.1.0
 */
export const label = (ref: ImageRef, tokens?: number): string =>
  `[image ${ref.width}×${ref.height} sha256:${ref.sha256.slice(0, 8)}…` +
  (tokens === undefined ? "]" : ` ${tokens} token${tokens === 1 ? "" : "s"}]`)

// ===== Vision geometry =====

/** Python's `round` (half to even), which Qwen2-VL's `smart_resize` uses. */
const roundHalfEven = (x: number): number => {
  const floor = Math.floor(x)
  const diff = x - floor
  return diff > 0.5 ? floor + 1 : diff < 0.5 ? floor : floor % 2 === 0 ? floor : floor + 1
}

/**
 * Qwen2-VL's `smart_resize`: the size an image is resized to (both sides multiples of `patchSize × mergeSize`,
 * the area within `[minPixels, maxPixels]`, the aspect ratio kept as closely as that allows) and its patch grid.
 * Pure and total: sides are at least one factor.
 *
 * @category vision
 * @since 0.1.0
 */
export const visionGrid = (width: number, height: number, geometry: VisionGeometry): VisionGrid => {
  const factor = geometry.patchSize * geometry.mergeSize
  const minPixels = geometry.minPixels ?? 4 * factor * factor
  const maxPixels = geometry.maxPixels ?? 1280 * factor * factor
  let h = Math.max(factor, roundHalfEven(height / factor) * factor)
  let w = Math.max(factor, roundHalfEven(width / factor) * factor)
  if (h * w > maxPixels) {
    const beta = Math.sqrt((height * width) / maxPixels)
    h = Math.max(factor, Math.floor(height / beta / factor) * factor)
    w = Math.max(factor, Math.floor(width / beta / factor) * factor)
  } else if (h * w < minPixels) {
    const beta = Math.sqrt(minPixels / (height * width))
    h = Math.ceil((height * beta) / factor) * factor
    w = Math.ceil((width * beta) / factor) * factor
  }
  const gridHeight = h / geometry.patchSize
  const gridWidth = w / geometry.patchSize
  return {
    height: h,
    width: w,
    gridHeight,
    gridWidth,
    tokens: (gridHeight / geometry.mergeSize) * (gridWidth / geometry.mergeSize)
  }
}

/**
 * How many tokens an image of this size costs: one per merged patch of its {@link visionGrid}.
 *
 * @category vision
 * @since 0.1.0
 */
export const visionTokenCount = (width: number, height: number, geometry: VisionGeometry): number =>
  visionGrid(width, height, geometry).tokens

/**
 * The tower's input for an image: resized to its {@link visionGrid} size (bilinear, half-pixel centres), scaled
 * to [0, 1] and normalised per channel, as float32 in CHW order (`[3, height, width]`).
 *
 * @category vision
 * @since 0.1.0
 */
export const resizeForVision = (
  image: Pick<Image, "ref" | "rgb">,
  geometry: VisionGeometry,
  normalisation: VisionNormalisation = clipNormalisation
): { readonly grid: VisionGrid; readonly pixels: Float32Array } => {
  const grid = visionGrid(image.ref.width, image.ref.height, geometry)
  const resized = resizeBilinear(image.rgb, image.ref.width, image.ref.height, grid.width, grid.height)
  const plane = grid.width * grid.height
  const pixels = new Float32Array(3 * plane)
  for (let c = 0; c < 3; c++) {
    const mean = normalisation.mean[c]
    const std = normalisation.std[c]
    for (let p = 0; p < plane; p++) pixels[c * plane + p] = (resized[p * 3 + c] / 255 - mean) / std
  }
  return { grid, pixels }
}

/**
 * Bilinear resize of RGB bytes (half-pixel centres, edges clamped) to float values in [0, 255], HWC.
 *
 * @category vision
 * @since 0.1.0
 */
export const resizeBilinear = (
  rgb: Uint8Array,
  width: number,
  height: number,
  toWidth: number,
  toHeight: number
): Float32Array => {
  const out = new Float32Array(toWidth * toHeight * 3)
  const sx = width / toWidth
  const sy = height / toHeight
  for (let y = 0; y < toHeight; y++) {
    const fy = Math.min(Math.max((y + 0.5) * sy - 0.5, 0), height - 1)
    const y0 = Math.floor(fy)
    const y1 = Math.min(y0 + 1, height - 1)
    const wy = fy - y0
    for (let x = 0; x < toWidth; x++) {
      const fx = Math.min(Math.max((x + 0.5) * sx - 0.5, 0), width - 1)
      const x0 = Math.floor(fx)
      const x1 = Math.min(x0 + 1, width - 1)
      const wx = fx - x0
      for (let c = 0; c < 3; c++) {
        const top = rgb[(y0 * width + x0) * 3 + c] * (1 - wx) + rgb[(y0 * width + x1) * 3 + c] * wx
        const bottom = rgb[(y1 * width + x0) * 3 + c] * (1 - wx) + rgb[(y1 * width + x1) * 3 + c] * wx
        out[(y * toWidth + x) * 3 + c] = top * (1 - wy) + bottom * wy
      }
    }
  }
  return out
}
