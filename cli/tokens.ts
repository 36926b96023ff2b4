/**
 * `agentfly tokens`: renders an OpenAI-style conversation through a model's chat template and shows every token
 * with its source and loss mask, as the trainer will see it. Assistant messages are treated as if the policy had
 * sampled them (`TrajectoryBuilder.fromConversation`), so the mask is exactly what training would use.
 *
 * Output: one line per token (index, id, source, mask, text), coloured by source on a terminal, then the text
 * coloured the same way; or with `--json` one object `{ ids, mask, sources, segments, segmentLengths }` (ids, mask
 * and sources concatenated over segments).
 *
 * **Recorded episodes** (`--recorded FILE`): shows what was recorded, never a re-render: the ids a gateway episode
 * or a run's rollout recorded, segment by segment, with their sources and mask. FILE is a JSONL file of
 * `agentfly gateway --output` (`{ trajectory, threads }` a line), a run's `samples.jsonl` (its lines carry the
 * trajectory id and the ids), or trajectories; `--episode ID` picks the line of that episode (else `--line N`, 1 by
 * default). The text of each token is the model folder's decode (`--model-dir`), else the text `samples.jsonl`
 * stored. `--json` adds `episode`.
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option } from "effect"
import { CliError, Command, Flag } from "effect/cli"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Image from "../src/Image.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"
import * as VisionConfig from "../src/VisionConfig.ts"

const colours: Record<Trajectory.Source, string> = {
  prompt: "\x1b[34m", // blue
  policy: "\x1b[32m", // green: trainable
  tool: "\x1b[33m", // yellow
  env: "\x1b[35m", // magenta
  template: "\x1b[90m" // grey
}
const reset = "\x1b[0m"

const useColour = (): boolean => process.stdout.isTTY === true && process.env.NO_COLOR === undefined

/**
 * The rows of a segment's table: one a token, except an image span, which is one row naming the image
 * (`[image 64×48 sha256:ab12cd34… 12 tokens]`) over its index range.
 */
const tokenRows = (
  segment: Trajectory.Segment,
  textOf: (id: number, i: number) => string | undefined,
  paint: (source: Trajectory.Source, text: string) => string
): Array<string> => {
  const rows: Array<string> = []
  let i = 0
  for (const span of segment.spans) {
    const bit = span.source === "policy" ? 1 : 0
    if (span.image !== undefined) {
      const range = `${i}-${i + span.tokenIds.length - 1}`
      const label = Image.label(span.image, span.tokenIds.length)
      rows.push(paint(span.source, `${range.padStart(6)} ${String(span.tokenIds[0]).padStart(7)}  ${
        span.source.padEnd(8)
      }  ${bit}     ${label}`))
      i += span.tokenIds.length
      continue
    }
    for (const id of span.tokenIds) {
      const text = textOf(id, i)
      const shown = text === undefined ? "" : JSON.stringify(text)
      const row = `${String(i).padStart(6)} ${String(id).padStart(7)}  ${span.source.padEnd(8)}  ${bit}     ${shown}`
      rows.push(paint(span.source, row))
      i++
    }
  }
  return rows
}

/** The printable report of one built trajectory. */
export const report = (
  tokenizer: Tokenizer.Tokenizer,
  builder: TrajectoryBuilder.TrajectoryBuilder,
  colour: boolean
): string => {
  const paint = (source: Trajectory.Source, text: string) => (colour ? `${colours[source]}${text}${reset}` : text)
  const lines: Array<string> = []
  builder.segments.forEach((segment, s) => {
    const ids = Trajectory.tokenIds(segment)
    const mask = Trajectory.lossMask(segment)
    const trainable = mask.reduce((n, bit) => n + bit, 0)
    lines.push(`segment ${s + 1}/${builder.segments.length}: ${ids.length} tokens, ${trainable} trainable`)
    lines.push(`${"index".padStart(6)} ${"id".padStart(7)}  ${"source".padEnd(8)}  mask  token`)
    lines.push(...tokenRows(segment, (id) => tokenizer.decode([id]), paint))
    lines.push("")
    lines.push(segment.spans.map((span) =>
      paint(
        span.source,
        span.image === undefined ? tokenizer.decode(span.tokenIds) : Image.label(span.image, span.tokenIds.length)
      )
    ).join(""))
    lines.push("")
  })
  for (const rewrite of builder.rewrites) {
    lines.push(
      `note: the template rewrote history at message ${rewrite.atMessage} (segment ${rewrite.newSegment + 1} starts ` +
        `there): expected ${JSON.stringify(rewrite.expected)}, rendered ${JSON.stringify(rewrite.actual)}`
    )
  }
  lines.push(
    `legend: ${(["prompt", "policy", "tool", "env", "template"] as const).map((s) => paint(s, s)).join(" ")}` +
      " (mask 1 = policy)"
  )
  return lines.join("\n")
}

/** The `--json` object. */
export const toJson = (builder: TrajectoryBuilder.TrajectoryBuilder) => ({
  ids: builder.segments.flatMap((segment) => [...Trajectory.tokenIds(segment)]),
  mask: builder.segments.flatMap((segment) => [...Trajectory.lossMask(segment)]),
  sources: builder.segments.flatMap((segment) => Trajectory.sources(segment)),
  segments: builder.segments.length,
  segmentLengths: builder.segments.map(Trajectory.segmentLength)
})

// ===== Recorded episodes =====

/**
 * A recorded episode: its id and segments (each span's source, ids and, from `samples.jsonl`, the ids' text).
 *
 * @category models
 * @since 0.1.0
 */
export interface Recorded {
  readonly episode: string
  readonly segments: ReadonlyArray<Trajectory.Segment>
  /** Token texts as `samples.jsonl` stored them, by segment (used when no tokenizer is given). */
  readonly texts: ReadonlyArray<ReadonlyArray<string>> | undefined
}

const isObject = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/**
 * One line of a recorded file as an episode: a gateway record (`{ trajectory, threads }`), a trajectory, or a
 * `samples.jsonl` record with ids; a message naming what is missing otherwise.
 *
 * @category constructors
 * @since 0.1.0
 */
export const recordedOf = (value: unknown): Recorded | string => {
  const trajectory = isObject(value) && isObject(value["trajectory"]) ? value["trajectory"] : value
  if (isObject(trajectory) && Array.isArray(trajectory["segments"])) {
    const t = trajectory as unknown as Trajectory.Trajectory
    return { episode: t.trajectoryId, segments: t.segments, texts: undefined }
  }
  if (isObject(value) && Array.isArray(value["spans"])) {
    const spans = value["spans"] as ReadonlyArray<Record<string, unknown>>
    if (spans.some((s) => !Array.isArray(s["ids"]))) {
      return "this samples.jsonl line has no token ids (written before they were recorded): only its text is known"
    }
    const bySegment = new Map<number, Array<Record<string, unknown>>>()
    for (const span of spans) {
      const k = typeof span["segment"] === "number" ? span["segment"] : 0
      bySegment.set(k, [...(bySegment.get(k) ?? []), span])
    }
    const groups = [...bySegment.entries()].sort((a, b) => a[0] - b[0]).map(([, g]) => g)
    return {
      episode: typeof value["trajectoryId"] === "string" ? value["trajectoryId"] : String(value["groupId"] ?? "?"),
      segments: groups.map((g) => ({
        spans: g.map((s) => ({
          source: s["source"] as Trajectory.Source,
          tokenIds: s["ids"] as Array<number>,
          ...(isObject(s["image"]) ? { image: s["image"] as unknown as Image.ImageRef } : {})
        })),
        messageCount: 0
      })),
      texts: groups.map((g) => g.flatMap((s) => s["tokens"] as Array<string>))
    }
  }
  return "not a recorded episode: expected { trajectory, threads } (agentfly gateway --output), a trajectory, " +
    "or a samples.jsonl line"
}

/**
 * The printable report of a recorded episode: per segment, each recorded id with its source, mask and text.
 *
 * @category constructors
 * @since 0.1.0
 */
export const recordedReport = (
  recorded: Recorded,
  tokenText: ((id: number) => string) | undefined,
  colour: boolean
): string => {
  const paint = (source: Trajectory.Source, text: string) => (colour ? `${colours[source]}${text}${reset}` : text)
  const lines = [`episode ${recorded.episode}: ${recorded.segments.length} segment(s), the ids as recorded`]
  recorded.segments.forEach((segment, s) => {
    const ids = Trajectory.tokenIds(segment)
    const mask = Trajectory.lossMask(segment)
    const trainable = mask.reduce((n, bit) => n + bit, 0)
    lines.push(`segment ${s + 1}/${recorded.segments.length}: ${ids.length} tokens, ${trainable} trainable`)
    lines.push(`${"index".padStart(6)} ${"id".padStart(7)}  ${"source".padEnd(8)}  mask  token`)
    lines.push(...tokenRows(segment, (id, i) => tokenText?.(id) ?? recorded.texts?.[s]?.[i], paint))
    lines.push("")
  })
  lines.push(
    `legend: ${(["prompt", "policy", "tool", "env", "template"] as const).map((x) => paint(x, x)).join(" ")}` +
      " (mask 1 = policy)"
  )
  return lines.join("\n")
}

/** The `--json` object of a recorded episode. */
export const recordedJson = (recorded: Recorded) => ({
  episode: recorded.episode,
  ids: recorded.segments.flatMap((segment) => [...Trajectory.tokenIds(segment)]),
  mask: recorded.segments.flatMap((segment) => [...Trajectory.lossMask(segment)]),
  sources: recorded.segments.flatMap((segment) => Trajectory.sources(segment)),
  segments: recorded.segments.length,
  segmentLengths: recorded.segments.map(Trajectory.segmentLength)
})

/** The line of `file` recording `episode`, else line `line`. */
const pickRecorded = Effect.fn("agentfly.tokens.pickRecorded")(function*(
  file: string,
  episode: string | undefined,
  line: number
) {
  if (episode === undefined) {
    const recorded = recordedOf(yield* readJsonlLine(file, line))
    if (typeof recorded === "string") {
      return yield* Tokenizer.tokenizerError("InvalidJson", `${file}:${line}: ${recorded}`)
    }
    return recorded
  }
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs.readFileString(file).pipe(
    Effect.mapError((e) => Tokenizer.tokenizerError("NotFound", `cannot read ${file}`, { cause: e }))
  )
  const seen: Array<string> = []
  for (const raw of text.split("\n")) {
    if (raw.trim() === "") continue
    const recorded = Option.getOrUndefined(Option.liftThrowable(() => recordedOf(JSON.parse(raw)))())
    if (recorded === undefined || typeof recorded === "string") continue
    if (recorded.episode === episode) return recorded
    seen.push(recorded.episode)
  }
  const some = seen.length === 0 ? "" : `: ${seen.slice(0, 5).join(", ")}${seen.length > 5 ? ", ..." : ""}`
  return yield* Tokenizer.tokenizerError(
    "InvalidJson",
    `${file}: no recorded episode ${JSON.stringify(episode)} (${seen.length} recorded${some})`
  )
})

const toUserError = (
  error: { readonly _tag: string; readonly reason: string | { readonly _tag: string }; readonly message: string }
) => {
  const reason = typeof error.reason === "string" ? error.reason : error.reason._tag
  return new CliError.UserError({ cause: error, userMessage: `${error._tag} (${reason}): ${error.message}` })
}

/**
 * The value on line `line` (1-based, as a dataset's errors number them) of a JSONL file.
 *
 * @category constructors
 * @since 0.1.0
 */
export const readJsonlLine = Effect.fn("agentfly.tokens.readJsonlLine")(function*(file: string, line: number) {
  const fs = yield* FileSystem.FileSystem
  const text = yield* fs.readFileString(file).pipe(
    Effect.mapError((e) => Tokenizer.tokenizerError("NotFound", `cannot read ${file}`, { cause: e }))
  )
  const lines = text.split("\n")
  const picked = lines[line - 1]?.trim() ?? ""
  if (line < 1 || picked === "") {
    const count = lines.filter((l) => l.trim() !== "").length
    return yield* Tokenizer.tokenizerError(
      "InvalidJson",
      `${file}:${line}: no conversation on that line (the file has ${count} non-empty lines; --line N picks one)`
    )
  }
  return yield* Effect.try({
    try: () => JSON.parse(picked) as unknown,
    catch: (cause) => Tokenizer.tokenizerError("InvalidJson", `${file}:${line} is not valid JSON`, { cause })
  })
})

/**
 * @category commands
 * @since 0.1.0
 */
export const tokens = Command.make(
  "tokens",
  {
    modelDir: Flag.Directory("model-dir", { mustExist: true }).pipe(
      Flag.withDescription("A model folder with tokenizer.json and tokenizer_config.json (chat_template)"),
      Flag.optional
    ),
    conversation: Flag.File("conversation", { mustExist: true }).pipe(
      Flag.withDescription("An OpenAI-style conversation: { messages, tools? } or a list of messages"),
      Flag.optional
    ),
    recorded: Flag.File("recorded", { mustExist: true }).pipe(
      Flag.withDescription(
        "Recorded episodes: agentfly gateway --output's JSONL, or a run's samples.jsonl: shows the recorded ids"
      ),
      Flag.optional
    ),
    episode: Flag.String("episode").pipe(
      Flag.withDescription("With --recorded: the episode (trajectory id) to show"),
      Flag.optional
    ),
    template: Flag.Literals("template", ["qwen2.5", "qwen3", "llama3", "chatml"]).pipe(
      Flag.withDescription("Use a built-in template instead of the folder's chat_template"),
      Flag.optional
    ),
    line: Flag.Int("line").pipe(
      Flag.withDescription(
        "For a JSONL file (a dataset, demonstrations): the line whose conversation to show (default 1)"
      ),
      Flag.optional
    ),
    json: Flag.Boolean("json").pipe(
      Flag.withDescription("Print { ids, mask, sources, segments, segmentLengths } as JSON"),
      Flag.withDefault(false)
    )
  },
  Effect.fn("agentfly.tokens")(function*({ conversation: conversationFlag, episode, json, line, modelDir: dirFlag,
    recorded, template }) {
    if (Option.isSome(recorded)) {
      const at = Option.getOrElse(line, () => 1)
      const picked = yield* pickRecorded(recorded.value, Option.getOrUndefined(episode), at)
      const tokenizer = Option.isSome(dirFlag) ? yield* Tokenizer.load(dirFlag.value) : undefined
      if (tokenizer === undefined && picked.texts === undefined) {
        yield* Console.error("no --model-dir: the ids are shown without their text")
      }
      const text = tokenizer === undefined ? undefined : (id: number) => tokenizer.decode([id])
      return yield* Console.log(json ? JSON.stringify(recordedJson(picked)) : recordedReport(picked, text, useColour()))
    }
    if (Option.isNone(conversationFlag) || Option.isNone(dirFlag)) {
      return yield* Tokenizer.tokenizerError(
        "NotFound",
        "give --model-dir and --conversation (a conversation to render), or --recorded (recorded episodes)"
      )
    }
    const conversation = conversationFlag.value
    const modelDir = dirFlag.value
    // The conversation first: a malformed file fails before the (slow) tokenizer load. A JSONL file (the
    // demonstrations a run trains on) gives one line's: the line an error named (`demos.jsonl:7: …`).
    const file = conversation.endsWith(".jsonl") || Option.isSome(line)
      ? yield* readJsonlLine(conversation, Option.getOrElse(line, () => 1))
      : yield* Tokenizer.readJsonFile(conversation)
    const { messages, tools } = yield* ChatTemplate.decodeConversation(file)
    const tokenizer = yield* Tokenizer.load(modelDir)
    const chatTemplate = VisionConfig.applyTo(
      Option.isSome(template) ? ChatTemplate.builtinTemplate(template.value) : yield* ChatTemplate.load(modelDir),
      yield* VisionConfig.read(modelDir)
    )
    const builder = yield* TrajectoryBuilder.fromConversation({ tokenizer, template: chatTemplate, messages, tools })
    yield* Console.log(json ? JSON.stringify(toJson(builder)) : report(tokenizer, builder, useColour()))
  }, Effect.mapError(toUserError))
).pipe(Command.withDescription(
  "Show the tokens of a conversation, or of a recorded episode, with their source and loss mask"
))
