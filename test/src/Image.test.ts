import { assert, describe, it } from "@effect/vitest"
import { createCanvas } from "@napi-rs/canvas"
import { Effect, Exit, Result } from "effect"
import { createHash } from "node:crypto"
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import * as Image from "../../src/Image.ts"

/** A small PNG: left 2 columns red, the rest blue. */
const redBlue = (width = 5, height = 3, type: "image/png" | "image/jpeg" = "image/png"): Uint8Array => {
  const canvas = createCanvas(width, height)
  const context = canvas.getContext("2d")
  context.fillStyle = "#0000ff"
  context.fillRect(0, 0, width, height)
  context.fillStyle = "#ff0000"
  context.fillRect(0, 0, 2, height)
  return new Uint8Array(type === "image/png" ? canvas.toBuffer("image/png") : canvas.toBuffer("image/jpeg", 95))
}

const dataUrl = (bytes: Uint8Array, type = "image/png") =>
  `data:${type};base64,${Buffer.from(bytes).toString("base64")}`

const reasonOf = <A>(effect: Effect.Effect<A, Image.ImageError>) =>
  Effect.gen(function*() {
    const exit = yield* Effect.exit(effect)
    assert.isTrue(Exit.isFailure(exit), "expected a failure")
    const error = yield* Effect.flip(effect)
    return error.reason
  })

describe("Image values", () => {
  it.effect("a PNG data: URL decodes to its size, RGB pixels and the SHA-256 of its bytes", () =>
    Effect.gen(function*() {
      const bytes = redBlue()
      const image = yield* Image.fromUrl(dataUrl(bytes))
      assert.deepStrictEqual(image.ref, {
        sha256: createHash("sha256").update(bytes).digest("hex"),
        width: 5,
        height: 3,
        mediaType: "image/png"
      })
      assert.deepStrictEqual(Array.from(image.rgb.slice(0, 3)), [255, 0, 0])
      assert.deepStrictEqual(Array.from(image.rgb.slice(2 * 3, 3 * 3)), [0, 0, 255])
      assert.strictEqual(image.rgb.length, 5 * 3 * 3)
    }))

  it.effect("a JPEG decodes too, and toDataUrl ∘ fromUrl keeps the bytes exactly", () =>
    Effect.gen(function*() {
      const bytes = redBlue(16, 8, "image/jpeg")
      const image = yield* Image.fromUrl(dataUrl(bytes, "image/jpeg"))
      assert.strictEqual(image.ref.mediaType, "image/jpeg")
      assert.strictEqual(image.ref.width, 16)
      const again = yield* Image.fromUrl(Image.toDataUrl(image))
      assert.deepStrictEqual(again.bytes, bytes)
      assert.strictEqual(again.ref.sha256, image.ref.sha256)
      assert.strictEqual(Image.sidecarPath(image.ref), `images/${image.ref.sha256}.jpg`)
    }))

  it.effect("a remote URL is refused unless the run allows fetching, naming the URL", () =>
    Effect.gen(function*() {
      const reason = yield* reasonOf(Image.fromUrl("https://example.com/cat.png"))
      assert.strictEqual(reason._tag, "RemoteUrlRefused")
      assert.match(reason.message, /https:\/\/example\.com\/cat\.png.*refused/)
      const bytes = redBlue()
      const allowed = yield* Image.fromUrl("https://example.com/cat.png").pipe(
        Effect.provideService(Image.ImageFetch, { fetch: () => Effect.succeed(bytes) })
      )
      assert.strictEqual(allowed.ref.width, 5)
    }))

  it.live("allowFetching reads a loopback URL; a 404 is FetchFailed naming the URL", () =>
    Effect.gen(function*() {
      const bytes = redBlue()
      const server = yield* Effect.acquireRelease(
        Effect.promise(() =>
          new Promise<Server>((resolve) => {
            const s = createServer((req, res) => {
              if (req.url === "/a.png") res.writeHead(200, { "content-type": "image/png" }).end(bytes)
              else res.writeHead(404).end()
            })
            s.listen(0, "127.0.0.1", () => resolve(s))
          })
        ),
        (s) => Effect.promise(() => new Promise<void>((resolve) => s.close(() => resolve())))
      )
      const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
      const fetched = yield* Image.fromUrl(`${base}/a.png`).pipe(
        Effect.provideService(Image.ImageFetch, Image.allowFetching)
      )
      assert.strictEqual(fetched.ref.sha256, Image.sha256(bytes))
      const missing = yield* reasonOf(
        Image.fromUrl(`${base}/b.png`).pipe(Effect.provideService(Image.ImageFetch, Image.allowFetching))
      )
      assert.strictEqual(missing._tag, "FetchFailed")
      assert.match(missing.message, /b\.png failed: HTTP 404/)
    }).pipe(Effect.scoped))

  it.effect("corrupt bytes, an unsupported type and a malformed URL each fail with their own reason", () =>
    Effect.gen(function*() {
      const truncated = redBlue().slice(0, 40)
      const corrupt = yield* reasonOf(Image.fromUrl(dataUrl(truncated)))
      assert.strictEqual(corrupt._tag, "CorruptImage")
      assert.match(corrupt.message, /image\/png image of 40 bytes does not decode/)
      const gif = yield* reasonOf(Image.fromUrl("data:image/gif;base64,R0lGODlhAQABAAAAACw="))
      assert.strictEqual(gif._tag, "UnsupportedMediaType")
      assert.match(gif.message, /image\/gif/)
      const garbage = yield* reasonOf(Image.decode(new Uint8Array([1, 2, 3, 4])))
      assert.strictEqual(garbage._tag, "UnsupportedMediaType")
      assert.match(garbage.message, /01 02 03 04/)
      const notBase64 = yield* reasonOf(Image.fromUrl("data:image/png;base64,@@@"))
      assert.strictEqual(notBase64._tag, "BadDataUrl")
      const plain = yield* reasonOf(Image.fromUrl("data:image/png,abc"))
      assert.match(plain.message, /not base64/)
      const lying = yield* reasonOf(Image.fromUrl(dataUrl(redBlue(), "image/jpeg")))
      assert.match(lying.message, /image\/png bytes declared as image\/jpeg/)
      const relative = yield* reasonOf(Image.fromUrl("cat.png"))
      assert.strictEqual(relative._tag, "BadDataUrl")
    }))

  it.effect("check gives decode's ref and decode's failures, without the pixels", () =>
    Effect.gen(function*() {
      const bytes = redBlue(6, 4)
      const ref = yield* Image.checkUrl(dataUrl(bytes))
      assert.deepStrictEqual(ref, (yield* Image.decode(bytes)).ref)
      const truncated = yield* reasonOf(Image.checkUrl(dataUrl(redBlue(7, 3).slice(0, 40))))
      assert.strictEqual(truncated._tag, "CorruptImage")
      const lying = yield* reasonOf(Image.checkUrl(dataUrl(redBlue(), "image/jpeg")))
      assert.strictEqual(lying._tag, "UnsupportedMediaType")
      assert.strictEqual((yield* reasonOf(Image.check(redBlue(402, 2))))._tag, "BadImageSize")
      assert.strictEqual((yield* reasonOf(Image.checkUrl("https://example.com/cat.png")))._tag, "RemoteUrlRefused")
    }))

  it.effect("bytes this process encoded are known by their hash: check does not decode them again", () =>
    Effect.gen(function*() {
      // A PNG whose header is sound and whose pixel data is not: only a decoder can tell.
      const png = redBlue(9, 5)
      const corruptBody = (seed: number) => {
        const bytes = png.slice()
        for (let i = 41; i < bytes.length - 12; i++) bytes[i] = (i * 7 + seed) & 0xff
        return bytes
      }
      assert.strictEqual((yield* reasonOf(Image.check(corruptBody(1))))._tag, "CorruptImage")
      const claimed = corruptBody(2)
      const ref = yield* Effect.fromResult(Image.encoded(claimed, { width: 9, height: 5 }))
      assert.deepStrictEqual(ref, {
        sha256: createHash("sha256").update(claimed).digest("hex"),
        width: 9,
        height: 5,
        mediaType: "image/png"
      })
      assert.deepStrictEqual(yield* Image.check(claimed), ref)
      // `decode` still reads the pixels, so it still finds the corrupt data.
      assert.strictEqual((yield* reasonOf(Image.decode(claimed)))._tag, "CorruptImage")
    }))

  it("encoded refuses bytes that are not a PNG of the encoder's size, with a typed error", () => {
    const wrongSize = Image.encoded(redBlue(9, 5), { width: 5, height: 9 })
    assert.isTrue(Result.isFailure(wrongSize))
    if (Result.isFailure(wrongSize)) {
      assert.strictEqual(wrongSize.failure.reason._tag, "CorruptImage")
      assert.match(wrongSize.failure.message, /header says 9 × 5, the encoder 5 × 9/)
    }
    const jpeg = Image.encoded(redBlue(9, 5, "image/jpeg"), { width: 9, height: 5 })
    assert.isTrue(Result.isFailure(jpeg) && jpeg.failure.reason._tag === "UnsupportedMediaType")
    const thin = Image.encoded(redBlue(402, 2), { width: 402, height: 2 })
    assert.isTrue(Result.isFailure(thin) && thin.failure.reason._tag === "BadImageSize")
  })

  it.effect("encodedDataUrl writes the data: URL toDataUrl would and checkUrl answers it from memory", () =>
    Effect.gen(function*() {
      const bytes = redBlue(7, 4)
      const url = yield* Effect.fromResult(Image.encodedDataUrl(bytes, { width: 7, height: 4 }))
      assert.strictEqual(url, dataUrl(bytes))
      const ref = Image.knownUrl(url)
      assert.deepStrictEqual(ref, {
        sha256: createHash("sha256").update(bytes).digest("hex"),
        width: 7,
        height: 4,
        mediaType: "image/png"
      })
      assert.deepStrictEqual(yield* Image.checkUrl(url), ref)
      // A URL nobody encoded here is not known, and is read (and refused) as before.
      assert.isUndefined(Image.knownUrl(dataUrl(redBlue(7, 5))))
      assert.strictEqual((yield* reasonOf(Image.checkUrl(url.slice(0, 60))))._tag, "CorruptImage")
      const refused = Image.encodedDataUrl(redBlue(9, 5), { width: 5, height: 9 })
      assert.isTrue(Result.isFailure(refused) && refused.failure.reason._tag === "CorruptImage")
    }))

  it.effect("an image beyond 200:1 is refused with its size", () =>
    Effect.gen(function*() {
      const reason = yield* reasonOf(Image.decode(redBlue(402, 2)))
      assert.strictEqual(reason._tag, "BadImageSize")
      assert.match(reason.message, /402×2/)
    }))

  it("label names size, hash prefix and token count", () => {
    const ref: Image.ImageRef = { sha256: "ab12cd34ef", width: 64, height: 48, mediaType: "image/png" }
    assert.strictEqual(Image.label(ref, 12), "[image 64×48 sha256:ab12cd34… 12 tokens]")
    assert.strictEqual(Image.label(ref), "[image 64×48 sha256:ab12cd34…]")
  })
})

describe("vision geometry (Qwen2-VL smart_resize)", () => {
  const qwen = { patchSize: 14, mergeSize: 2 }

  it("matches values computed with Qwen2-VL's smart_resize at its defaults", () => {
    // smart_resize(height, width, factor=28, min_pixels=56*56, max_pixels=28*28*1280) in transformers.
    assert.deepStrictEqual(Image.visionGrid(640, 480, qwen), {
      height: 476,
      width: 644,
      gridHeight: 34,
      gridWidth: 46,
      tokens: 17 * 23
    })
    // Tiny images grow to min_pixels: 10×10 → ceil(10 × 5.6 / 28) × 28 = 56.
    assert.deepStrictEqual(Image.visionGrid(10, 10, qwen), {
      height: 56,
      width: 56,
      gridHeight: 4,
      gridWidth: 4,
      tokens: 4
    })
    // Huge images shrink under max_pixels: 4000×3000 → beta = sqrt(12e6 / 1003520).
    const big = Image.visionGrid(4000, 3000, qwen)
    assert.deepStrictEqual([big.width, big.height], [1148, 840])
    assert.isAtMost(big.width * big.height, 28 * 28 * 1280)
    // Python rounds half to even: 42 / 28 = 1.5 → 2, 70 / 28 = 2.5 → 2.
    assert.deepStrictEqual([Image.visionGrid(70, 42, qwen).width, Image.visionGrid(70, 42, qwen).height], [56, 56])
  })

  it("count = (h / patch / merge) × (w / patch / merge), every side a multiple of patch × merge", () => {
    for (const [w, h] of [[64, 48], [1, 1], [200, 3], [333, 777]] as const) {
      const geometry = { patchSize: 4, mergeSize: 2, minPixels: 64, maxPixels: 64 * 64 }
      const grid = Image.visionGrid(w, h, geometry)
      assert.strictEqual(grid.width % 8, 0)
      assert.strictEqual(grid.height % 8, 0)
      assert.isAtMost(grid.width * grid.height, 64 * 64)
      assert.isAtLeast(grid.width * grid.height, 64)
      assert.strictEqual(Image.visionTokenCount(w, h, geometry), (grid.height / 8) * (grid.width / 8))
    }
    assert.strictEqual(Image.visionTokenCount(64, 48, { patchSize: 4, mergeSize: 2, minPixels: 64 }), 48)
  })

  it.effect("resizeForVision gives CHW float32 normalised by the config's mean and std", () =>
    Effect.gen(function*() {
      const image = yield* Image.decode(redBlue(8, 8))
      const geometry = { patchSize: 4, mergeSize: 2, minPixels: 64 }
      const { grid, pixels } = Image.resizeForVision(image, geometry, { mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5] })
      assert.deepStrictEqual([grid.width, grid.height], [8, 8])
      assert.strictEqual(pixels.length, 3 * 64)
      // Same size: no interpolation. Pixel (0,0) is red → R = 1, G = B = -1; pixel (7,0) blue → B = 1.
      assert.deepStrictEqual([pixels[0], pixels[64], pixels[128]], [1, -1, -1])
      assert.deepStrictEqual([pixels[7], pixels[64 + 7], pixels[128 + 7]], [-1, -1, 1])
      // Upscaled 2×: the interpolation stays within the source range.
      const up = Image.resizeForVision(image, { patchSize: 4, mergeSize: 2, minPixels: 256 }, Image.clipNormalisation)
      assert.deepStrictEqual([up.grid.width, up.grid.height], [16, 16])
      assert.isTrue(up.pixels.every((v) => v >= -2 && v <= 2.2))
    }))
})
