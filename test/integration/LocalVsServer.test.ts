/**
 * Each text environment (search, household, web shop, chess) behaves the same whether its policy runs in the local
 * engine or behind an OpenAI-compatible server (`agentfly serve`'s `OpenAiServer`, started here on a loopback port and
 * reached through `OpenAiCompatSampler`, token mode).
 *
 * Both ways roll out the shipped short config's task (`examples/NAME/short.json`, as `agentfly train` loads it) on
 * freshly generated held-out rows with a tiny random-weight model, through `Rollouts.collectGroups` (what `agentfly
 * train` and `agentfly eval` call), with the same sampling seeds. Locally the chains share one `PolicyEngine`; over
 * HTTP the server has its own engine over the same folder. The assertions:
 *
 * - the same sampled token ids, every segment's tokens and sources (so the same loss masks), messages, terminations,
 *   episode ends, rewards and reward metrics, chain by chain;
 * - logprobs agree to float32 rounding only (1e-5): the two engines batch the chains differently, so the matrix
 *   products are blocked differently (the same tolerance as `test/actors/BatchInvariance.test.ts`); the sampled ids
 *   are equal because each request samples from its own seeded RNG;
 * - the comparison means something: the environment acted (observations of source `env` or `tool` follow policy
 *   turns) and the chains of a group sampled different text.
 *
 * A random-weight policy rarely ends a turn within its token budget, so most chains end at their first turn (`stop`);
 * the others' replies reach the environment: household commands are plain text the world narrates, and in the
 * tool-call environments (search, web shop) malformed calls come back as parse-error feedback. The tiny model's
 * 512-token context is shorter than the web shop config's 1,024: a chain that outgrows it is refused by both
 * engines alike (`SamplerRejected`, the server's message inside its 4xx body). Real time ≈ 5–10 s per environment.
 *
 * This test found that a server added its model's end-of-sequence id to the request's stop ids (vLLM does too)
 * while the local engine stops only on the request's: `OpenAiCompatSampler` now sends `ignore_eos`.
 */
import { NodeHttpClient, NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as OpenAiServer from "../../actors/OpenAiServer.ts"
import * as PolicyEngine from "../../actors/PolicyEngine.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as Setup from "../../cli/setup.ts"
import * as Data from "../../environments/household/Data.ts"
import * as ChessGenerate from "../../examples/chess/generate.ts"
import * as HouseholdGenerate from "../../examples/household/generate.ts"
import * as SearchGenerate from "../../examples/search/generate.ts"
import * as WebShopGenerate from "../../examples/webshop/generate.ts"
import * as OpenAiCompatSampler from "../../src/backends/OpenAiCompatSampler.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as Message from "../../src/Message.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import { Sampler } from "../../src/Sampler.ts"
import * as Trajectory from "../../src/Trajectory.ts"
import { shortConfig } from "../utils/agentfly.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as RolloutSetup from "../../actors/RolloutSetup.ts"

/** Each environment's generator, writing a few held-out rows (and the few other rows the short config names). */
const generators = {
  search: (dir: string) =>
    SearchGenerate.write({ ...SearchGenerate.defaults, train: 4, heldOut: 6, validation: 2, demos: 1, dir }),
  household: (dir: string) =>
    Data.write({ ...HouseholdGenerate.defaults, train: 4, heldOut: 6, validation: 2, demos: 1, dir }),
  webshop: (dir: string) =>
    WebShopGenerate.write({ ...WebShopGenerate.defaults, train: 4, heldOut: 6, validation: 2, demos: 1, dir }),
  chess: (dir: string) =>
    ChessGenerate.write({ ...ChessGenerate.defaults, train: 4, heldOut: 6, validation: 2, demos: 1, view: "fen", dir })
} as const

const CHAINS = 3

/** Wall-clock figures, the only metrics that may differ. */
const timings = new Set(["rollout_time_ms", "sampler_latency_ms"])

/** What a trajectory must have the same both ways; logprobs are compared apart (to float32 rounding). */
const behaviour = (t: Trajectory.Trajectory) => ({
  termination: t.termination,
  episodeEnd: t.episodeEnd,
  errorReason: t.errorReason,
  reward: t.reward,
  rewardStatus: t.rewardStatus,
  masked: t.masked,
  metrics: Object.fromEntries(Object.entries(t.metrics).filter(([k]) => !timings.has(k))),
  trainable: t.trainable,
  messages: t.messages,
  segments: t.segments.map((s) => ({
    messageCount: s.messageCount,
    spans: s.spans.map((span) => ({ source: span.source, tokenIds: Array.from(span.tokenIds) }))
  })),
  lossMask: t.segments.map((s) => Array.from(Trajectory.lossMask(s)))
})

const logprobsOf = (t: Trajectory.Trajectory) => t.segments.flatMap((s) => Array.from(Trajectory.logprobs(s)))

const rollOut = (name: keyof typeof generators) =>
  Effect.gen(function*() {
    const data = mkdtempSync(join(tmpdir(), `${name}-local-vs-server-data-`))
    yield* generators[name](data)
    const dir = mkdtempSync(join(tmpdir(), `${name}-local-vs-server-`))
    const { task, config } = yield* Setup.load(shortConfig(name, data, dir))
    // The tiny preset whatever the short config trains (random weights either way; the comparison is the subject).
    yield* ModelFolder.init(config.model.path, { preset: "tiny", seed: 5 })
    const folder = yield* ModelFolder.load(config.model.path)
    const rows = (yield* Dataset.load(join(data, "heldout.jsonl"), { onInvalid: "stop", fields: task.row })).rows
    const sampling = { firstSeq: 0, chains: CHAINS, temperature: 1, seed: 300 }
    const collect = Effect.scoped(Effect.flatMap(
      RolloutSetup.make({ task, config, format: ChainFormat.ofConfig(config, folder) }),
      (agent) => Rollouts.collectGroups(agent, rows, sampling)
    )).pipe(Effect.provide(ResourceManager.ResourceManager.layer))

    const localEngine = yield* PolicyEngine.make({ config: folder.config, weights: folder.weights, maxBatchSize: 64 })
    const local = yield* collect.pipe(
      Effect.provideService(
        Sampler,
        Sampler.of({ generate: localEngine.generate, policyVersion: localEngine.policyVersion })
      )
    )
    // `agentfly serve`: its own engine over the same folder, behind the HTTP server on a free loopback port.
    const serverEngine = yield* PolicyEngine.make({ config: folder.config, weights: folder.weights, maxBatchSize: 32 })
    const server = yield* OpenAiServer.make(folder, { maxRunning: 32 }).pipe(
      Effect.provideService(PolicyEngine.PolicyEngine, serverEngine)
    )
    const remoteSampler = yield* OpenAiCompatSampler.make({ baseUrl: server.baseUrl, model: folder.name }).pipe(
      Effect.provide(NodeHttpClient.layerNodeHttp)
    )
    const remote = yield* collect.pipe(Effect.provideService(Sampler, remoteSampler))
    return { rows, local: local.flatMap((g) => g.trajectories), remote: remote.flatMap((g) => g.trajectories) }
  }).pipe(Effect.scoped, Effect.provide(NodeServices.layer))

const sameBothWays = (name: keyof typeof generators) =>
  Effect.gen(function*() {
    const { rows, local, remote } = yield* rollOut(name)
    assert.strictEqual(local.length, rows.length * CHAINS)
    assert.strictEqual(remote.length, local.length)
    for (let i = 0; i < local.length; i++) {
      const [a, b] = [local[i]!, remote[i]!]
      assert.strictEqual(b.trajectoryId, a.trajectoryId)
      assert.deepStrictEqual(behaviour(b), behaviour(a), `${name} chain ${a.trajectoryId}`)
      // An error's text differs only by its transport: the server's 4xx body carries the engine's own message.
      if (a.error !== undefined) assert.include(b.error, a.error.replace(/^.*sampler \w+: /, ""))
      else assert.isUndefined(b.error)
      const [la, lb] = [logprobsOf(a), logprobsOf(b)]
      assert.strictEqual(lb.length, la.length)
      la.forEach((lp, j) => {
        if (Number.isNaN(lp)) assert.isTrue(Number.isNaN(lb[j]!), "a token the policy did not sample has no logprob")
        else assert.approximately(lb[j]!, lp, 1e-5, `${name} chain ${a.trajectoryId} token ${j}`)
      })
    }
    // The comparison means something: the policy wrote different things, and its turns reached the environment.
    const policyTexts = local.map((t) => Message.text(t.messages.find((m) => m.role === "assistant")!.content))
    assert.isAbove(new Set(policyTexts).size, local.length / 2, "distinct samples")
    return { local, remote }
  })

/** Spans of a source after the prompt (`env`: what the environment said after a policy turn). */
const spansOf = (t: Trajectory.Trajectory, source: Trajectory.Source) =>
  t.segments.reduce((n, s) => n + s.spans.filter((span) => span.source === source).length, 0)

/** A chain whose policy wrote a second turn after its first turn's observations (tool results or feedback). */
const answeredAfterTurn = (t: Trajectory.Trajectory) => t.metrics["turns"]! >= 2 && spansOf(t, "tool") > 0

describe("the environments against the local engine and against an OpenAI-compatible server", () => {
  it.live("household: the same tokens, masks, episodes and rewards both ways", () =>
    Effect.gen(function*() {
      const { local } = yield* sameBothWays("household")
      // Every complete reply is a command the world narrates (most random replies never reach an end of turn).
      const narrated = local.filter((t) => t.metrics["reward/solved/steps"]! > 0 && spansOf(t, "env") > 0)
      assert.isAtLeast(narrated.length, 3, "the world answered the policy's commands")
    }), 300_000)

  it.live("search: the same tokens, masks, terminations and rewards both ways", () =>
    Effect.gen(function*() {
      const { local } = yield* sameBothWays("search")
      assert.isTrue(local.every((t) => t.rewardStatus === "scored"), "the reward scored each chain")
      assert.isAtLeast(local.filter(answeredAfterTurn).length, 1, "some turn's observations reached the policy")
    }), 300_000)

  it.live("webshop: the same tokens, masks, terminations and rewards both ways", () =>
    Effect.gen(function*() {
      const { local } = yield* sameBothWays("webshop")
      const scoredUnlessFailed = local.every((t) => t.rewardStatus === "scored" || t.termination === "error")
      assert.isTrue(scoredUnlessFailed, "the reward scored each chain that did not fail")
      assert.isAtLeast(local.filter(answeredAfterTurn).length, 1, "some turn's observations reached the policy")
    }), 300_000)

  it.live("chess: the same tokens, masks, terminations and rewards both ways", () =>
    Effect.gen(function*() {
      const { local } = yield* sameBothWays("chess")
      assert.isTrue(local.every((t) => t.rewardStatus === "scored"), "the reward scored each chain")
      assert.isTrue(local.every((t) => Message.text(t.messages[2]!.content).includes("FEN: ")), "shown its puzzle")
    }), 300_000)
})
