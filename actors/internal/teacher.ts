/**
 * The teacher of on-policy distillation (`algorithm.distillation`, `src/Distillation.ts`), built once at the start of
 * a run: a model folder (optionally a run's checkpoint over its weights) scored by a forward-only graph here, or an
 * OpenAI-compatible server asked for prompt logprobs (vLLM, or `agentfly serve`). Either is checked before the first
 * step: the tokenizer against the student's (the same ids on every probe text), and a server's prompt logprobs on
 * one probe, so that a server that cannot score given tokens refuses the run at its start with a clear error rather
 * than at its first step.
 */
import { Effect, FileSystem, Path, Redacted, Scope } from "effect"
import { FetchHttpClient } from "effect/http"
import * as OnnxTrainer from "../../src/backends/OnnxTrainer.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import * as Distillation from "../../src/Distillation.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as Packing from "../../src/Packing.ts"
import type { SamplerError } from "../../src/Sampler.ts"
import * as Journal from "../Journal.ts"

const failed = (message: string) => (cause: unknown) =>
  Distillation.distillationError("TeacherFailed", `${message}: ${(cause as Error).message ?? String(cause)}`, {
    cause
  })

/**
 * A teacher over a micro-batch scorer (a forward-only graph): the sequences are packed whole (every token after the
 * first a target) and each row's scores go back to its sequence, position `t` scoring token `t + 1`.
 */
export const fromMicroBatches = (
  name: string,
  score: (mb: Packing.MicroBatch) => Effect.Effect<Float32Array, unknown>,
  pack: { readonly tokenBudget: number; readonly maxLength: number }
): Distillation.Teacher => ({
  name,
  score: (sequences) =>
    Effect.gen(function*() {
      const packed = yield* Packing.pack(
        sequences.map((ids) => ({
          tokenIds: Int32Array.from(ids),
          lossMask: Uint8Array.from(ids, (_, i) => (i === 0 ? 0 : 1))
        })),
        { tokenBudget: pack.tokenBudget, maxLength: pack.maxLength, aggregation: "token-mean", lengthMultiple: 16 }
      ).pipe(Effect.mapError(failed(`the teacher ${name} cannot take the sequences`)))
      const out = sequences.map((ids) => new Float64Array(ids.length).fill(Number.NaN))
      for (const mb of packed.microBatches) {
        const scored = yield* score(mb).pipe(Effect.mapError(failed(`the teacher ${name} failed`)))
        mb.sequenceIndex.forEach((index, r) => {
          if (index < 0) return
          for (let t = 0; t < mb.length; t++) {
            const i = r * mb.length + t
            if (mb.mask[i] !== 0) out[index]![(mb.positionIds?.[i] ?? t) + 1] = scored[i]!
          }
        })
      }
      return out
    })
})

/** A model folder (and checkpoint) as a teacher, its tokenizer checked against the student's. */
const local = Effect.fnUntraced(function*(
  config: { readonly path: string; readonly checkpoint?: string },
  student: ModelFolder.ModelFolder,
  options: { readonly tokenBudget: number; readonly intraOpThreads: number }
) {
  const folder = yield* ModelFolder.load(config.path).pipe(
    Effect.mapError(failed(`cannot load the teacher's model folder ${config.path}`))
  )
  yield* Distillation.checkTokenizers(student.tokenizer.encode, (text) => Effect.succeed(folder.tokenizer.encode(text)))
  const weights = config.checkpoint === undefined
    ? folder.weights
    : (yield* Journal.verifiedCheckpoint(config.checkpoint, ModelFolder.parameters(folder)).pipe(
      Effect.mapError(failed(`cannot load the teacher's checkpoint ${config.checkpoint}`))
    )).weights
  const score = yield* OnnxTrainer.makeReference(OnnxTrainer.qwen2(folder.config), weights, {
    intraOpThreads: options.intraOpThreads
  }).pipe(Effect.mapError(failed(`cannot build the teacher ${folder.name}`)))
  return fromMicroBatches(config.checkpoint ?? folder.name, score, {
    tokenBudget: options.tokenBudget,
    maxLength: folder.config.maxPositionEmbeddings
  })
})

/** What a server's failure means for a teacher: cannot (refused, no prompt logprobs, no `/tokenize`) or failed. */
const serverError = (what: string) => (e: SamplerError) =>
  e.reason._tag === "NoPromptLogprobs" || e.reason._tag === "BadRequest"
    ? Distillation.distillationError("Unsupported", `${what}: ${e.message}`)
    : Distillation.distillationError("TeacherFailed", `${what}: ${e.message}`, { cause: e })

/** An OpenAI-compatible server as a teacher, its tokenizer (`/tokenize`) and prompt logprobs checked once. */
const remote = Effect.fnUntraced(function*(
  config: { readonly url: string; readonly model: string; readonly apiKeyEnv?: string },
  student: ModelFolder.ModelFolder
) {
  const key = config.apiKeyEnv === undefined ? undefined : process.env[config.apiKeyEnv]
  const settings = {
    baseUrl: config.url,
    model: config.model,
    ...(key === undefined ? {} : { apiKey: Redacted.make(key) })
  }
  const scorer = yield* OpenAiCompatSampler.makePromptScorer(settings)
  const tokenize = yield* OpenAiCompatSampler.makeTokenize(settings)
  const where = `the teacher ${config.model} at ${config.url}`
  yield* Distillation.checkTokenizers(
    student.tokenizer.encode,
    (text) => tokenize(text).pipe(Effect.mapError(serverError(`${where} cannot tokenize (vLLM's /tokenize)`)))
  )
  const teacher = Distillation.fromPromptLogprobs(
    config.model,
    (ids) => scorer(ids).pipe(Effect.mapError(serverError(`${where} cannot score given tokens`)))
  )
  // One probe now: a server that cannot answer prompt logprobs refuses the run before its first step.
  yield* teacher.score([student.tokenizer.encode(Distillation.probes[0]!)])
  return teacher
}, Effect.provide(FetchHttpClient.layer))

/**
 * The run's teacher from `algorithm.distillation.teacher`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (
  config: Distillation.TeacherConfig,
  student: ModelFolder.ModelFolder,
  options: { readonly tokenBudget: number; readonly intraOpThreads: number }
): Effect.Effect<
  Distillation.Teacher,
  Distillation.DistillationError,
  FileSystem.FileSystem | Path.Path | Scope.Scope
> =>
  "path" in config ? local(config, student, options) : remote(config, student)
