/**
 * `agentfly tokens`: renders an OpenAI-style conversation through a model's chat template and shows every token
 * with its source and loss mask, as the trainer will see it. Assistant messages are treated as if the policy had
 * sampled them (`TrajectoryBuilder.fromConversation`), so the mask is exactly what training would use.
 *
 * Output: one line per token (index, id, source, mask, text), coloured by source on a terminal, then the text
 * coloured the same way; or with `--json` one object `{ ids, mask, sources, segments, segmentLengths }` (ids, mask
 * and sources concatenated over segments).
 *
 * @since 0.1.0
 */
import { Console, Effect, FileSystem, Option } from "effect"
import { CliError, Command, Flag } from "effect/cli"
import * as ChatTemplate from "../src/ChatTemplate.ts"
import * as Tokenizer from "../src/Tokenizer.ts"
import * as Trajectory from "../src/Trajectory.ts"
import * as TrajectoryBuilder from "../src/TrajectoryBuilder.ts"

const colours: Record<Trajectory.Source, string> = {
  prompt: "\x1b[34m", // blue
  policy: "\x1b[32m", // green: trainable
  tool: "\x1b[33m", // yellow
  env: "\x1b[35m", // magenta
  template: "\x1b[90m" // grey
}
const reset = "\x1b[0m"

const useColour = (): boolean => process.stdout.isTTY === true && process.env.NO_COLOR === undefined

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
    const sources = Trajectory.sources(segment)
    const trainable = mask.reduce((n, bit) => n + bit, 0)
    lines.push(`segment ${s + 1}/${builder.segments.length}: ${ids.length} tokens, ${trainable} trainable`)
    lines.push(`${"index".padStart(6)} ${"id".padStart(7)}  ${"source".padEnd(8)}  mask  token`)
    ids.forEach((id, i) => {
      const source = sources[i]!
      const row = `${String(i).padStart(6)} ${String(id).padStart(7)}  ${source.padEnd(8)}  ${mask[i]}     ${
        JSON.stringify(tokenizer.decode([id]))
      }`
      lines.push(paint(source, row))
    })
    lines.push("")
    lines.push(segment.spans.map((span) => paint(span.source, tokenizer.decode(span.tokenIds))).join(""))
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
      Flag.withDescription("A model folder with tokenizer.json and tokenizer_config.json (chat_template)")
    ),
    conversation: Flag.File("conversation", { mustExist: true }).pipe(
      Flag.withDescription("An OpenAI-style conversation: { messages, tools? } or a list of messages")
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
  Effect.fn("agentfly.tokens")(function*({ conversation, json, line, modelDir, template }) {
    // The conversation first: a malformed file fails before the (slow) tokenizer load. A JSONL file (the
    // demonstrations a run trains on) gives one line's: the line an error named (`demos.jsonl:7: …`).
    const file = conversation.endsWith(".jsonl") || Option.isSome(line)
      ? yield* readJsonlLine(conversation, Option.getOrElse(line, () => 1))
      : yield* Tokenizer.readJsonFile(conversation)
    const { messages, tools } = yield* ChatTemplate.decodeConversation(file)
    const tokenizer = yield* Tokenizer.load(modelDir)
    const chatTemplate = Option.isSome(template)
      ? ChatTemplate.builtinTemplate(template.value)
      : yield* ChatTemplate.load(modelDir)
    const builder = yield* TrajectoryBuilder.fromConversation({ tokenizer, template: chatTemplate, messages, tools })
    yield* Console.log(json ? JSON.stringify(toJson(builder)) : report(tokenizer, builder, useColour()))
  }, Effect.mapError(toUserError))
).pipe(Command.withDescription("Show the tokens of a conversation with their source and loss mask"))
