/**
 * On-policy distillation (Agarwal et al., arXiv:2306.13649; Thinking Machines' "On-Policy Distillation", 2025): the
 * student samples, a teacher scores the student's own tokens, and each sampled token's advantage is the negated
 * per-token reverse KL to the teacher, `−β·(log π_student(y_t) − log π_teacher(y_t))`, added to the task's
 * advantages (times `rewardWeight`; 0 distils alone). The student's logprobs are the sampler's (the tokens'
 * own); the teacher's are its prompt logprobs of the same token ids, so teacher and student must share a tokenizer.
 *
 * A {@link Teacher} is anything that returns, for a token sequence, each token's logprob given the tokens before it:
 * a local model folder or checkpoint (`actors/internal/teacher.ts`), or an OpenAI-compatible server that answers
 * prompt logprobs (vLLM's `prompt_logprobs`, `OpenAiCompatSampler.makePromptScorer`).
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"

// ===== Config =====

/**
 * Where the teacher is: a model folder (optionally a run's checkpoint over its weights), or an OpenAI-compatible
 * server answering prompt logprobs (`model`: the served name; `apiKeyEnv`: an environment variable holding the key).
 *
 * @category models
 * @since 0.1.0
 */
export const TeacherConfig = Schema.Union([
  Schema.Struct({ path: Schema.String, checkpoint: Schema.optionalKey(Schema.String) }),
  Schema.Struct({
    url: Schema.String.check(Schema.makeFilter((u) => /^https?:\/\/[^/\s]+/.test(u) || `expected an http(s) address`)),
    model: Schema.String,
    apiKeyEnv: Schema.optionalKey(Schema.String)
  })
])
export type TeacherConfig = typeof TeacherConfig.Type

/**
 * `algorithm.distillation`: the teacher, the weight `coef` (β) of the reverse-KL advantage, and the weight of the
 * task's advantages (`rewardWeight`, default 1; 0 = distillation alone).
 *
 * @category models
 * @since 0.1.0
 */
export const Config = Schema.Struct({
  teacher: TeacherConfig,
  coef: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 100 }))),
  rewardWeight: Schema.optionalKey(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 100 })))
})
export type Config = typeof Config.Type

// ===== Errors =====

/**
 * Teacher and student tokenize a probe text differently: the teacher's logprobs would score other tokens.
 *
 * @category errors
 * @since 0.1.0
 */
export class TokenizerMismatch extends Schema.TaggedError<TokenizerMismatch>()("TokenizerMismatch", {
  message: Schema.String,
  probe: Schema.String,
  student: Schema.Array(Schema.Int),
  teacher: Schema.Array(Schema.Int)
}) {}

/**
 * The teacher's server does not return prompt logprobs (or cannot tokenize for the check).
 *
 * @category errors
 * @since 0.1.0
 */
export class Unsupported extends Schema.TaggedError<Unsupported>()("Unsupported", { message: Schema.String }) {}

/**
 * The teacher answered a number of logprobs other than the sequence's tokens (or a non-finite one on a token).
 *
 * @category errors
 * @since 0.1.0
 */
export class Misaligned extends Schema.TaggedError<Misaligned>()("Misaligned", {
  message: Schema.String,
  expected: Schema.Int,
  got: Schema.Int
}) {}

/**
 * The teacher could not be loaded or asked (an unreachable server, a missing folder); `cause` says why.
 *
 * @category errors
 * @since 0.1.0
 */
export class TeacherFailed extends Schema.TaggedError<TeacherFailed>()("TeacherFailed", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * @category errors
 * @since 0.1.0
 */
export const DistillationErrorReason = Schema.Union([TokenizerMismatch, Unsupported, Misaligned, TeacherFailed])
export type DistillationErrorReason = typeof DistillationErrorReason.Type

/**
 * A failure of distillation; handle reasons with `Effect.catchReason("DistillationError", "TokenizerMismatch", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class DistillationError extends Schema.TaggedError<DistillationError>()("DistillationError", {
  reason: DistillationErrorReason
}) {
  override get message(): string {
    return this.reason.message
  }
}

// ===== Teacher =====

/**
 * A teacher: for each token sequence, the logprob of each token given the tokens before it (`[0]` is NaN: nothing
 * predicts the first token), at temperature 1.
 *
 * @category models
 * @since 0.1.0
 */
export interface Teacher {
  readonly name: string
  readonly score: (
    sequences: ReadonlyArray<ArrayLike<number>>
  ) => Effect.Effect<ReadonlyArray<Float64Array>, DistillationError>
}

/**
 * A teacher from a per-sequence prompt-logprob call (one request per sequence, `concurrency` at a time): checks
 * that each answer has one entry per token and a finite logprob on every token after the first.
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromPromptLogprobs = (
  name: string,
  promptLogprobs: (tokenIds: ReadonlyArray<number>) => Effect.Effect<ReadonlyArray<number | null>, DistillationError>,
  concurrency = 4
): Teacher => ({
  name,
  score: (sequences) =>
    Effect.forEach(sequences, (sequence) => {
      const tokens = Array.from(sequence)
      return Effect.flatMap(promptLogprobs(tokens), (lps) => {
        const bad = lps.length !== tokens.length
          ? 0
          : lps.findIndex((lp, i) => i > 0 && (lp === null || !Number.isFinite(lp)))
        if (bad === -1) return Effect.succeed(Float64Array.from(lps, (lp, i) => (i === 0 ? Number.NaN : lp!)))
        const message = lps.length !== tokens.length
          ? `the teacher ${name} answered ${lps.length} prompt logprobs for ${tokens.length} tokens`
          : `the teacher ${name} answered no logprob for token ${bad} (id ${tokens[bad]})`
        return Effect.fail(distillationError("Misaligned", message, { expected: tokens.length, got: lps.length }))
      })
    }, { concurrency })
})

// ===== Maths =====

/**
 * The reverse-KL advantage of each sampled token: `−coef·(log π_student − log π_teacher)` where `mask` is 1, else 0.
 *
 * @category combinators
 * @since 0.1.0
 */
export const reverseKlAdvantages = (
  student: ArrayLike<number>,
  teacher: ArrayLike<number>,
  mask: Uint8Array,
  coef: number
): Float64Array => {
  const out = new Float64Array(mask.length)
  for (let i = 0; i < mask.length; i++) if (mask[i] !== 0) out[i] = -coef * (student[i]! - teacher[i]!)
  return out
}

/**
 * The advantages a step trains on: `rewardWeight·task + reverse-KL advantages` (cell by cell).
 *
 * @category combinators
 * @since 0.1.0
 */
export const mix = (task: Float64Array, distill: Float64Array, rewardWeight: number): Float64Array =>
  Float64Array.from(task, (a, i) => rewardWeight * a + distill[i]!)

/**
 * A step's advantages with distillation: each scored sequence's sampled tokens (`mask`) laid out from cell `start`
 * of the task's advantages, `rewardWeight·A + coef·(teacher − student)` there, and the mean of `student − teacher`
 * over them (the reverse KL's estimate).
 *
 * @category combinators
 * @since 0.1.0
 */
export const advantagesOf = (
  task: Float64Array,
  sequences: ReadonlyArray<{
    readonly start: number
    readonly mask: Uint8Array
    readonly student: ArrayLike<number>
    readonly teacher: ArrayLike<number>
  }>,
  coef: number,
  rewardWeight: number
): { readonly advantages: Float64Array; readonly meanKl: number } => {
  const student = new Float64Array(task.length)
  const teacher = new Float64Array(task.length)
  const mask = new Uint8Array(task.length)
  let kl = 0
  let tokens = 0
  for (const s of sequences) {
    for (let j = 0; j < s.mask.length; j++) {
      if (s.mask[j] === 0) continue
      student[s.start + j] = s.student[j]!
      teacher[s.start + j] = s.teacher[j]!
      mask[s.start + j] = 1
      kl += s.student[j]! - s.teacher[j]!
      tokens++
    }
  }
  return {
    advantages: mix(task, reverseKlAdvantages(student, teacher, mask, coef), rewardWeight),
    meanKl: tokens > 0 ? kl / tokens : 0
  }
}

/**
 * Probe texts of the tokenizer check: words, digits, whitespace, punctuation, non-Latin script and a tool call.
 *
 * @category constants
 * @since 0.1.0
 */
export const probes: ReadonlyArray<string> = [
  "The quick brown fox jumps over the lazy dog.",
  "12 + 345 = 357; 3.14159 × 2 ≈ 6.28",
  "  indented\n\tand tabbed\r\n",
  "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"7*6\"}}</tool_call>",
  "naïve café — 東京 🙂"
]

/**
 * Checks that teacher and student tokenize every probe to the same ids; fails with `TokenizerMismatch` on the first
 * that differs.
 *
 * @category combinators
 * @since 0.1.0
 */
export const checkTokenizers = Effect.fnUntraced(function*(
  student: (text: string) => ReadonlyArray<number>,
  teacher: (text: string) => Effect.Effect<ReadonlyArray<number>, DistillationError>,
  texts: ReadonlyArray<string> = probes
) {
  for (const probe of texts) {
    const s = student(probe)
    const t = yield* teacher(probe)
    if (s.length !== t.length || s.some((id, i) => id !== t[i])) {
      return yield* distillationError(
        "TokenizerMismatch",
        `teacher and student tokenize ${JSON.stringify(probe)} differently (student [${s.join(", ")}], teacher ` +
          `[${t.join(", ")}]): on-policy distillation needs one tokenizer`,
        { probe, student: [...s], teacher: [...t] }
      )
    }
  }
})

/** Each reason's class by its tag; a reason left out is a compile error. */
const reasons = { TokenizerMismatch, Unsupported, Misaligned, TeacherFailed } satisfies Record<
  DistillationErrorReason["_tag"],
  unknown
>

/**
 * A `DistillationError` of the reason tagged `tag`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const distillationError = <Tag extends DistillationErrorReason["_tag"]>(
  tag: Tag,
  message: string,
  facts?: Omit<ConstructorParameters<(typeof reasons)[Tag]>[0], "message">
): DistillationError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => DistillationErrorReason
  return new DistillationError({ reason: new Reason({ ...facts, message }) })
}
