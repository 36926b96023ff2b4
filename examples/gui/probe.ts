/**
 * Does the policy read the screen? Teacher-forced log-probabilities of the demonstrations' actions under a model
 * folder (or a run's checkpoint), once with each demonstration's own screens and once with the screens of the next
 * demonstration in the file (same size, same tokens, other pixels). A policy that reads the screen gives its own
 * screens' actions more mass: `gain` (real − shuffled, nats per demonstration) is then clearly above 0; a policy
 * that learned only the call's format and a spread of coordinates gives the same log-probabilities either way.
 *
 *   npx tsx examples/gui/probe.ts MODEL_DIR DEMOS.jsonl [CHECKPOINT_DIR] [--count 200]
 *
 * Prints one JSON line: per demonstration, the mean log-probability of the assistant tokens and of the coordinates'
 * digits alone, with the real and the shuffled screens, and the gain with its standard error.
 *
 * @since 0.1.0
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { readFileSync } from "node:fs"
import * as SequenceImages from "../../actors/internal/sequenceImages.ts"
import * as OnnxTrainerVision from "../../src/backends/OnnxTrainerVision.ts"
import * as Checkpoint from "../../src/Checkpoint.ts"
import * as Loss from "../../src/Loss.ts"
import * as LrSchedule from "../../src/LrSchedule.ts"
import type * as Message from "../../src/Message.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Optimizer from "../../src/Optimizer.ts"
import * as Packing from "../../src/Packing.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"

// ===== Pure parts =====

/**
 * Each conversation with the image URLs of the next one (the last takes the first's), in order: the same messages
 * and the same number of screens when the conversations are alike, other pixels.
 *
 * @category combinators
 * @since 0.1.0
 */
export const rotateScreens = (
  conversations: ReadonlyArray<ReadonlyArray<Message.Message>>
): Array<Array<Message.Message>> => {
  const urls = conversations.map(imageUrls)
  return conversations.map((messages, i) => {
    const other = urls[(i + 1) % urls.length]!
    let k = 0
    return messages.map((m) =>
      typeof m.content === "string" ? m : {
        ...m,
        content: m.content.map((part) => {
          if (part.type !== "image_url") return part
          const url = other[Math.min(k++, other.length - 1)] ?? part.image_url.url
          return { type: "image_url" as const, image_url: { url } }
        })
      } as Message.Message
    )
  })
}

const imageUrls = (messages: ReadonlyArray<Message.Message>): Array<string> =>
  messages.flatMap((m) =>
    typeof m.content === "string" ? [] : m.content.flatMap((p) => (p.type === "image_url" ? [p.image_url.url] : []))
  )

/**
 * Mean and standard error of a sample (0 for fewer than two values).
 *
 * @category getters
 * @since 0.1.0
 */
export const meanSe = (xs: ReadonlyArray<number>): { readonly mean: number; readonly se: number } => {
  const n = xs.length
  const mean = xs.reduce((a, b) => a + b, 0) / Math.max(1, n)
  if (n < 2) return { mean, se: 0 }
  const variance = xs.reduce((a, b) => a + (b - mean) ** 2, 0) / (n - 1)
  return { mean, se: Math.sqrt(variance / n) }
}

/** Byte-level ids of the digits `0`–`9` (the coordinates' tokens). */
const isDigit = (id: number): boolean => id >= 48 && id <= 57

// ===== The probe =====

const probe = Effect.fn("gui.probe")(function*(modelDir: string, demos: string, checkpoint: string | undefined, count: number) {
  const folder = yield* ModelFolder.load(modelDir)
  const pad = folder.tokenizer.tokenToId("<|image_pad|>")
  if (folder.vision === undefined || pad === undefined) {
    return yield* Effect.die(new Error(`${modelDir} has no vision tower: the probe needs a tiny-vl-like folder`))
  }
  const model = OnnxTrainerVision.qwen2Vl(folder.vision, pad)
  const weights = checkpoint === undefined
    ? folder.weights
    : (yield* Checkpoint.load(checkpoint, model.parameters)).weights
  const { trainer } = yield* OnnxTrainer.make({
    model,
    weights,
    loss: Loss.sft,
    optimizer: Optimizer.defaultConfig,
    schedule: LrSchedule.constant(1e-3, 0)
  })
  const conversations = readFileSync(demos, "utf8").trim().split("\n").slice(0, count)
    .map((line) => (JSON.parse(line) as { messages: Array<Message.Message> }).messages)
  const score = (all: ReadonlyArray<ReadonlyArray<Message.Message>>) =>
    Effect.forEach(all, (messages) =>
      Effect.gen(function*() {
        const built = yield* TrajectoryBuilder.fromConversation({ tokenizer: folder.tokenizer, template: folder.template, messages })
        const images = yield* SequenceImages.ofConversations(folder.vision!.vision, [built])
        const sequences = built.segments.map((s) => SequenceImages.withImages(Packing.fromSegment(s), images.get(s)))
        const { microBatches } = yield* Packing.pack(sequences, { tokenBudget: 4096, aggregation: "token-mean" })
        let all = 0, digits = 0
        for (const mb of microBatches) {
          const logprobs = yield* trainer.logprobs(mb)
          for (let i = 0; i < logprobs.length; i++) {
            if (mb.mask[i] !== 1) continue
            all += logprobs[i]!
            if (isDigit(mb.targets[i]!)) digits += logprobs[i]!
          }
        }
        return { all, digits }
      }))
  const real = yield* score(conversations)
  const shuffled = yield* score(rotateScreens(conversations))
  const gain = meanSe(real.map((r, i) => r.digits - shuffled[i]!.digits))
  return {
    demonstrations: real.length,
    real: { action: meanSe(real.map((r) => r.all)).mean, digits: meanSe(real.map((r) => r.digits)).mean },
    shuffled: { action: meanSe(shuffled.map((r) => r.all)).mean, digits: meanSe(shuffled.map((r) => r.digits)).mean },
    gain
  }
})

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2)
  const at = args.indexOf("--count")
  const count = at === -1 ? 200 : Number(args[at + 1])
  const positional = at === -1 ? args : [...args.slice(0, at), ...args.slice(at + 2)]
  const [modelDir, demos, checkpoint] = positional
  if (modelDir === undefined || demos === undefined || !Number.isInteger(count) || count < 2) {
    console.error("usage: npx tsx examples/gui/probe.ts MODEL_DIR DEMOS.jsonl [CHECKPOINT_DIR] [--count 200]")
    process.exit(2)
  }
  probe(modelDir, demos, checkpoint, count).pipe(
    Effect.tap((result) => Effect.sync(() => console.log(JSON.stringify(result)))),
    Effect.scoped,
    Effect.provide(NodeServices.layer),
    NodeRuntime.runMain
  )
}
