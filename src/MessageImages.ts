/**
 * Images inside conversations and trajectories: decoding the image parts of messages once (`resolve`), marking
 * the image tokens of a tokenized render as image spans (`markImageSpans`), and keeping the bytes beside a run's
 * samples (`externalise` writes `images/<sha256>.png` and puts that path in place of the `data:` URL;
 * `internalise` reads it back), so samples.jsonl, the journal, resume and reports keep every image without
 * holding megabytes of base64 on each line.
 *
 * A conversation without image parts passes through every function here unchanged (the same array), so text-only
 * runs are untouched.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem, Path } from "effect"
import type * as ChatTemplate from "./ChatTemplate.ts"
import * as Image from "./Image.ts"
import * as Message from "./Message.ts"
import type * as Tokenizer from "./Tokenizer.ts"
import type * as Trajectory from "./Trajectory.ts"

/**
 * Whether a content holds an image part.
 *
 * @category predicates
 * @since 0.1.0
 */
export const hasImage = (content: Message.Content): boolean =>
  typeof content !== "string" && content.some((part) => part.type === "image_url")

/**
 * Whether any message holds an image part.
 *
 * @category predicates
 * @since 0.1.0
 */
export const anyImage = (messages: ReadonlyArray<Message.Message>): boolean =>
  messages.some((m) => hasImage(m.content))

/**
 * The image parts of the messages, in order, with the source their tokens get (`tool` for a tool message, else
 * `fallback`).
 *
 * @category getters
 * @since 0.1.0
 */
export const imageParts = (
  messages: ReadonlyArray<Message.Message>,
  fallback: Trajectory.Source
): Array<{ readonly part: Message.ImagePart; readonly source: Trajectory.Source }> => {
  const out: Array<{ part: Message.ImagePart; source: Trajectory.Source }> = []
  for (const message of messages) {
    if (typeof message.content === "string") continue
    for (const part of message.content) {
      if (part.type === "image_url") out.push({ part, source: message.role === "tool" ? "tool" : fallback })
    }
  }
  return out
}

/**
 * Checks every image part (decoded by `Image.checkUrl`: the pixels are not read out) and writes its `image` (hash,
 * size, media type) into the part. A model without vision (`template.vision` absent) refuses any image part with
 * `ModelWithoutVision` naming it; a remote URL is refused unless the run provides `Image.ImageFetch`; corrupt bytes
 * fail with `CorruptImage`. Messages without images are returned as they are (the same array).
 *
 * @category decoding
 * @since 0.1.0
 */
export const resolve = (
  messages: ReadonlyArray<Message.Message>,
  template: Pick<ChatTemplate.ChatTemplate, "name" | "vision">
): Effect.Effect<ReadonlyArray<Message.Message>, Image.ImageError> =>
{
  if (!anyImage(messages)) return Effect.succeed(messages)
  const known = resolveKnown(messages, template)
  return known !== undefined
    ? Effect.succeed(known)
    : Effect.map(readAll(messages, template, Image.checkUrl, (ref) => ref), (r) => r.messages)
}

/**
 * {@link resolve} in one synchronous pass when every image's URL is one this process encoded (`Image.knownUrl`: an
 * environment's screen) and nothing would fail; undefined otherwise, for the effectful path to read, or refuse.
 */
const resolveKnown = (
  messages: ReadonlyArray<Message.Message>,
  template: Pick<ChatTemplate.ChatTemplate, "vision">
): ReadonlyArray<Message.Message> | undefined => {
  if (template.vision === undefined || reservedIn(messages, template.vision) !== undefined) return undefined
  const refs: Array<Image.ImageRef> = []
  for (const { part } of imageParts(messages, "prompt")) {
    const ref = Image.knownUrl(part.image_url.url)
    if (ref === undefined) return undefined
    refs.push(ref)
  }
  return withRefs(messages, refs)
}

/** The messages with their image parts' `image` set to `refs`, in order (messages without images kept as they are). */
const withRefs = (
  messages: ReadonlyArray<Message.Message>,
  refs: ReadonlyArray<Image.ImageRef>
): ReadonlyArray<Message.Message> => {
  let next = 0
  return messages.map((message) =>
    typeof message.content === "string" || !hasImage(message.content) ? message : {
      ...message,
      content: message.content.map((part) => part.type === "image_url" ? { ...part, image: refs[next++]! } : part)
    } as Message.Message
  )
}

/**
 * `resolve`, also returning every image decoded, in the order of their parts (the order of their image tokens in
 * a render): what a vision engine needs beside the prompt's ids (`Image.resizeForVision` gives the tower's input).
 *
 * @category decoding
 * @since 0.1.0
 */
export const decodeAll = (
  messages: ReadonlyArray<Message.Message>,
  template: Pick<ChatTemplate.ChatTemplate, "name" | "vision">
): Effect.Effect<
  { readonly messages: ReadonlyArray<Message.Message>; readonly images: ReadonlyArray<Image.Image> },
  Image.ImageError
> => readAll(messages, template, Image.fromUrl, (image) => image.ref)

/** Reads every image part with `read` (after the template's checks), writing its ref into the part. */
const readAll = Effect.fnUntraced(function*<A>(
  messages: ReadonlyArray<Message.Message>,
  template: Pick<ChatTemplate.ChatTemplate, "name" | "vision">,
  read: (url: string) => Effect.Effect<A, Image.ImageError>,
  refOf: (a: A) => Image.ImageRef
) {
  const images: Array<A> = []
  if (!anyImage(messages)) return { messages, images: images as ReadonlyArray<A> }
  if (template.vision === undefined) {
    return yield* Effect.fail(new Image.ImageError({ reason: new Image.ModelWithoutVision({ model: template.name }) }))
  }
  const reserved = reservedIn(messages, template.vision)
  if (reserved !== undefined) {
    return yield* Effect.fail(new Image.ImageError({ reason: new Image.ReservedToken({ token: reserved }) }))
  }
  for (const { part } of imageParts(messages, "prompt")) images.push(yield* read(part.image_url.url))
  return { messages: withRefs(messages, images.map(refOf)), images: images as ReadonlyArray<A> }
})

/** The first of the vision tokens that the messages' text holds (it would be read as an image's), if any. */
const reservedIn = (
  messages: ReadonlyArray<Message.Message>,
  vision: ChatTemplate.Vision
): string | undefined => {
  const tokens = [vision.start, vision.pad, vision.end]
  for (const message of messages) {
    if (message.role === "assistant") continue
    const found = tokens.find((t) => Message.text(message.content).includes(t))
    if (found !== undefined) return found
  }
  return undefined
}

/**
 * Splits the spans at each run of the vision `pad` token and marks the run as an image span of the next image
 * (in order), with that image's source where the run sat in template scaffolding. Spans without pads are kept as
 * they are; a run that is not the next image's (not its token count) stays plain tokens.
 *
 * @category spans
 * @since 0.1.0
 */
export const markImageSpans = (
  spans: ReadonlyArray<Trajectory.Span>,
  images: ReadonlyArray<{ readonly part: Message.ImagePart; readonly source: Trajectory.Source }>,
  template: Pick<ChatTemplate.ChatTemplate, "vision">,
  tokenizer: Pick<Tokenizer.Tokenizer, "tokenToId">
): Array<Trajectory.Span> => {
  const vision = template.vision
  const pad = vision === undefined ? undefined : tokenizer.tokenToId(vision.pad)
  if (vision === undefined || pad === undefined || images.length === 0) return spans.slice()
  const out: Array<Trajectory.Span> = []
  let next = 0
  for (const span of spans) {
    if (span.source === "policy" || !span.tokenIds.includes(pad)) {
      out.push(span)
      continue
    }
    let i = 0
    const ids = span.tokenIds
    while (i < ids.length) {
      let j = i
      if (ids[i] === pad) {
        while (j < ids.length && ids[j] === pad) j++
        const image = images[next]
        const ref = image?.part.image
        // Pads that are not the next image's (text holding the pad token, which `resolve` refuses in the messages it
        // decodes) stay plain tokens of their span.
        const fits = ref !== undefined && Image.visionTokenCount(ref.width, ref.height, vision.geometry) === j - i
        if (image !== undefined && ref !== undefined && fits) {
          next++
          const source = span.source === "template" ? image.source : span.source
          out.push({ source, tokenIds: ids.slice(i, j), image: ref })
        } else {
          out.push({ ...span, tokenIds: ids.slice(i, j) })
        }
      } else {
        while (j < ids.length && ids[j] !== pad) j++
        out.push({ ...span, tokenIds: ids.slice(i, j) })
      }
      i = j
    }
  }
  return out
}

/**
 * Writes each `data:` URL image part of the messages to `<dir>/images/<sha256>.png` (or `.jpg`), once (a file
 * already there is kept: its name is its content's hash). Returns the messages with each such URL replaced by that
 * relative path, the part keeping its `image`. Messages without images are returned as they are.
 *
 * @category files
 * @since 0.1.0
 */
export const writeSidecars = Effect.fn("MessageImages.writeSidecars")(function*(
  messages: ReadonlyArray<Message.Message>,
  dir: string
) {
  if (!anyImage(messages)) return messages
  const fs = yield* FileSystem.FileSystem
  return yield* Effect.forEach(messages, (message) =>
    mapParts(message, (part) =>
      Effect.gen(function*() {
        if (!Image.isDataUrl(part.image_url.url)) return part
        const { bytes } = yield* Image.parseDataUrl(part.image_url.url)
        // The file is named by the bytes' own hash, never by a hash the part claims.
        const ref = part.image === undefined
          ? (yield* Image.decode(bytes)).ref
          : { ...part.image, sha256: Image.sha256(bytes) }
        const relative = Image.sidecarPath(ref)
        const file = `${dir}/${relative}`
        if (!(yield* fs.exists(file))) {
          yield* fs.makeDirectory(`${dir}/images`, { recursive: true })
          yield* fs.writeFile(file, bytes)
        }
        return { ...part, image_url: { url: relative }, image: ref }
      })))
})

/**
 * A trajectory whose image bytes live in `dir` (`writeSidecars`): its message view holds sidecar paths in place of
 * `data:` URLs. A trajectory without images is returned as it is.
 *
 * @category files
 * @since 0.1.0
 */
export const externalise = Effect.fn("MessageImages.externalise")(function*(
  trajectory: Trajectory.Trajectory,
  dir: string
) {
  if (!anyImage(trajectory.messages)) return trajectory
  return { ...trajectory, messages: yield* writeSidecars(trajectory.messages, dir) }
})

/**
 * The sidecar files of `dir` for these image refs, as `data:` URLs by hash (a missing file is left out).
 *
 * @category files
 * @since 0.1.0
 */
export const readSidecars = Effect.fn("MessageImages.readSidecars")(function*(
  refs: Iterable<Image.ImageRef>,
  dir: string
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const out = new Map<string, string>()
  for (const ref of refs) {
    if (out.has(ref.sha256)) continue
    const bytes = yield* fs.readFile(path.join(dir, Image.sidecarPath(ref))).pipe(Effect.option)
    if (bytes._tag === "Some") out.set(ref.sha256, Image.toDataUrl({ ref, bytes: bytes.value }))
  }
  return out as ReadonlyMap<string, string>
})

/**
 * The reverse of `externalise`: each image part whose URL is a sidecar path (`images/<sha256>.<ext>`) gets its
 * `data:` URL back from the file in `dir`; a missing or changed file fails (`BadDataUrl` naming the path, or
 * `CorruptImage`).
 *
 * @category files
 * @since 0.1.0
 */
export const internalise = Effect.fn("MessageImages.internalise")(function*(
  trajectory: Trajectory.Trajectory,
  dir: string
) {
  if (!anyImage(trajectory.messages)) return trajectory
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const messages = yield* Effect.forEach(trajectory.messages, (message) =>
    mapParts(message, (part) =>
      Effect.gen(function*() {
        const url = part.image_url.url
        if (!isSidecar(url)) return part
        const bytes = yield* fs.readFile(path.join(dir, url)).pipe(
          Effect.mapError(() =>
            new Image.ImageError({ reason: new Image.BadDataUrl({ url, detail: `no file ${url} in ${dir}` }) })
          )
        )
        const image = yield* Image.decode(bytes)
        if (part.image !== undefined && image.ref.sha256 !== part.image.sha256) {
          const detail = `the file's SHA-256 is ${image.ref.sha256}`
          return yield* Effect.fail(new Image.ImageError({ reason: new Image.BadDataUrl({ url, detail }) }))
        }
        return { ...part, image_url: { url: Image.toDataUrl(image) }, image: image.ref }
      })))
  return { ...trajectory, messages }
})

/**
 * Whether a URL is a sidecar path written by `externalise`.
 *
 * @category predicates
 * @since 0.1.0
 */
export const isSidecar = (url: string): boolean => /^images\/[0-9a-f]{64}\.(png|jpg)$/.test(url)

const mapParts = <E, R>(
  message: Message.Message,
  f: (part: Message.ImagePart) => Effect.Effect<Message.ImagePart, E, R>
): Effect.Effect<Message.Message, E, R> =>
  typeof message.content === "string" || !hasImage(message.content)
    ? Effect.succeed(message)
    : Effect.map(
      Effect.forEach(
        message.content,
        (part): Effect.Effect<Message.ContentPart, E, R> => part.type === "image_url" ? f(part) : Effect.succeed(part)
      ),
      (content) => ({ ...message, content }) as Message.Message
    )
