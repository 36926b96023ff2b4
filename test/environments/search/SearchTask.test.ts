/**
 * The search task (`environments/search/`) through the rollout machinery: the seeded world and generator, the
 * oracle solving held-out questions through the task's own tools and reward, the noise baselines scoring near 0,
 * bad actions answered with clear error observations, chains' sessions isolated, the index built once per run, and
 * a user's own corpus file.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, Stream } from "effect"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as TaskRuntime from "../../../actors/TaskRuntime.ts"
import * as Tasks from "../../../environments/Tasks.ts"
import type * as Corpus from "../../../environments/search/Corpus.ts"
import * as SearchIndex from "../../../environments/search/SearchIndex.ts"
import * as SearchOracle from "../../../environments/search/SearchOracle.ts"
import * as SearchSession from "../../../environments/search/SearchSession.ts"
import * as SearchTask from "../../../environments/search/SearchTask.ts"
import * as World from "../../../environments/search/World.ts"
import * as Generate from "../../../examples/search/generate.ts"
import * as ByteTokenizer from "../../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../../src/ChatTemplate.ts"
import * as Message from "../../../src/Message.ts"
import * as Tokenizer from "../../../src/Tokenizer.ts"
import * as Task from "../../../src/Task.ts"
import type * as Trajectory from "../../../src/Trajectory.ts"

const tokenizer = Effect.runSync(Tokenizer.make(ByteTokenizer.tokenizerJson(), ByteTokenizer.tokenizerConfig("")))
const format = ChainFormat.fromTemplate({ tokenizer, template: ChatTemplate.builtinTemplate("qwen2.5") })

const rollout = (
  policy: Oracle.Policy,
  rows: ReadonlyArray<Rollout.TaskRow>,
  options: {
    readonly task?: SearchTask.Options
    readonly numChains?: number
    readonly passages?: Effect.Effect<ReadonlyArray<Corpus.Passage>>
  } = {}
) =>
  Rollout.runTaskChat({
    task: options.passages === undefined
      ? SearchTask.make(options.task)
      : SearchTask.make(options.task, SearchIndex.layer(options.passages)),
    rows,
    numChains: options.numChains ?? 1,
    maxTurns: 4,
    sampling: { temperature: 1, maxTokens: 64, seed: 1 },
    format
  }).pipe(
    Stream.runCollect,
    Effect.map((events) => events.flatMap((e) => (e._tag === "Trajectory" ? [e.trajectory] : []))),
    Effect.provide(Oracle.layer(policy))
  )

const accuracy = (ts: ReadonlyArray<Trajectory.Trajectory>) =>
  ts.filter((t) => t.metrics["reward/exactMatch/em"] === 1).length / ts.length

const observations = (t: Trajectory.Trajectory) =>
  t.messages.flatMap((m) => (m.role === "tool" ? [{ text: Message.text(m.content), error: m.is_error === true }] : []))

const questions = (world: World.World, counts: { readonly heldOut: number }, twoHop = 0.3) =>
  Effect.runSync(Effect.map(World.questions(world, { seed: 5, counts, twoHop }), ({ heldOut }) => ({
    heldOut: heldOut.map((q): Rollout.TaskRow & World.Question => ({ ...q }))
  })))

/** Generated files under a fresh temporary directory, parsed. */
const generated = (options: Partial<Generate.Options>) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "search-data-"))
    yield* Generate.write({
      ...Generate.defaults,
      passages: 2000,
      train: 40,
      heldOut: 20,
      validation: 10,
      demos: 20,
      ...options,
      dir
    })
    const read = (name: string) =>
      readFileSync(join(dir, name), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, any>)
    return { dir, read }
  }).pipe(Effect.provide(NodeServices.layer))

describe("search world", () => {
  it("is seeded, renders at least the passages asked for, and names are unique", () => {
    const a = World.make({ seed: 3, passages: 3000 })
    assert.deepStrictEqual(World.make({ seed: 3, passages: 3000 }), a)
    assert.notDeepEqual(World.make({ seed: 4, passages: 3000 }).people, a.people)
    const passages = World.passages(a)
    assert.isAtLeast(passages.length, 3000)
    assert.isBelow(passages.length, 3010)
    const names = [...a.people.map((p) => p.name), ...a.companies.map((c) => c.name), ...a.cities.map((t) => t.name)]
    assert.strictEqual(new Set(names).size, names.length)
    // Words of names never collide across kinds (a city is never also someone's first name).
    const words = new Map<string, string>()
    for (const [kind, list] of [["person", a.people], ["company", a.companies], ["city", a.cities]] as const) {
      for (const w of list.flatMap((e) => e.name.split(" "))) {
        if (words.has(w) && words.get(w) !== kind) assert.fail(`${w} is a ${words.get(w)} and a ${kind}`)
        words.set(w, kind)
      }
    }
  })

  it("asks one- and two-hop questions whose answers the passages state, never twice the same", () => {
    const world = World.make({ seed: 3, passages: 3000 })
    const texts = new Set(World.passages(world).map((p) => p.text))
    const { heldOut } = questions(world, { heldOut: 400 }, 0.5)
    assert.strictEqual(new Set(heldOut.map((q) => q.question)).size, heldOut.length)
    const twoHop = heldOut.filter((q) => q.hops === 2).length
    assert.isTrue(twoHop > 150 && twoHop < 250, `${twoHop} two-hop questions of 400`)
    for (const q of heldOut) {
      assert.deepStrictEqual(World.parse(q.question), { kind: q.kind, name: q.queries[0]! })
      const last = q.queries.at(-1)!
      const fact = {
        born: `${last} was born in ${q.answer}.`,
        founder: `${last} was founded by ${q.answer}.`,
        country: `${last} is a city in ${q.answer}.`,
        founderBorn: `${last} was born in ${q.answer}.`,
        bornCountry: `${last} is a city in ${q.answer}.`
      }[q.kind]
      assert.isTrue(texts.has(fact), `${q.question} → ${q.answer}: "${fact}" is a passage`)
    }
  })

  it("asks only the kinds asked for: one template for a fixed-shape variant, whatever twoHop", () => {
    const world = World.make({ seed: 3, passages: 3000 })
    const ask = (kinds: ReadonlyArray<World.Kind>, twoHop: number) =>
      Effect.runSync(World.questions(world, { seed: 5, counts: { heldOut: 200 }, twoHop, kinds })).heldOut
    assert.isTrue(ask(["born"], 0.3).every((q) => q.kind === "born" && q.hops === 1))
    assert.isTrue(ask(["bornCountry"], 0).every((q) => q.kind === "bornCountry"))
    // Without `kinds` the draw is the one from before the option (the hop draw comes first either way).
    assert.deepStrictEqual(
      Effect.runSync(World.questions(world, { seed: 5, counts: { heldOut: 50 }, twoHop: 0.3, kinds: undefined })),
      Effect.runSync(World.questions(world, { seed: 5, counts: { heldOut: 50 }, twoHop: 0.3 }))
    )
    const none = Effect.runSyncExit(World.questions(world, { seed: 5, counts: { heldOut: 1 }, twoHop: 0.3, kinds: [] }))
    assert.isTrue(Exit.isFailure(none) && Cause.squash(none.cause) instanceof World.WorldError)
  })

  it("fails with a WorldError when a small world runs out of subjects", () => {
    const world = World.make({ seed: 3, passages: 100 })
    const exit = Effect.runSyncExit(World.questions(world, { seed: 1, counts: { heldOut: 500 }, twoHop: 0 }))
    assert.isTrue(Exit.isFailure(exit) && Cause.squash(exit.cause) instanceof World.WorldError)
  })
})

describe("search generator", () => {
  it.effect("is seeded: the same options write the same bytes, another seed other questions", () =>
    Effect.gen(function*() {
      const files = ["corpus.jsonl", "train.jsonl", "heldout.jsonl", "validation.jsonl", "demos.jsonl"]
      const a = yield* generated({ seed: 3 })
      const b = yield* generated({ seed: 3 })
      const c = yield* generated({ seed: 4 })
      for (const f of files) {
        assert.strictEqual(readFileSync(join(a.dir, f), "utf8"), readFileSync(join(b.dir, f), "utf8"), f)
        assert.notStrictEqual(readFileSync(join(a.dir, f), "utf8"), readFileSync(join(c.dir, f), "utf8"), f)
      }
      const asked = ["train.jsonl", "heldout.jsonl", "validation.jsonl"].flatMap((f) =>
        a.read(f).map((r) => r["question"])
      )
      assert.strictEqual(new Set(asked).size, asked.length, "the splits never ask the same question")
      const demos = a.read("demos.jsonl")
      assert.strictEqual(demos.length, 20, "the oracle solved every demonstration's question")
      for (const d of demos) {
        const [system, user, call] = d["messages"]
        assert.strictEqual(system.content, SearchTask.systemPrompt)
        assert.strictEqual(call.tool_calls[0].function.arguments.query, World.parse(user.content)!.name)
      }
    }), { timeout: 300_000 })

  it.effect("--kind born: one template, the birthplace on the first line, noisy slips the job on the second", () =>
    Effect.gen(function*() {
      const { read } = yield* generated({ seed: 3, demos: 60, noise: 0.5, kind: "born" })
      // Person names are two words of two consonant–vowel syllables: the name always sits at the same place.
      const fixed = (r: Record<string, any>) =>
        r["kind"] === "born" && /^Where was \w{4} \w{4} born\?$/.test(r["question"])
      for (const f of ["train.jsonl", "heldout.jsonl", "validation.jsonl"]) {
        assert.isTrue(read(f).every(fixed), f)
      }
      const demos = read("demos.jsonl")
      assert.strictEqual(demos.length, 60)
      let slips = 0
      for (const d of demos) {
        const [, user, , observation] = d["messages"]
        const name = World.parse(user.content)!.name
        const [first, second] = observation.content.split("\n")
        const city = new RegExp(`^${name} was born in (\\w+)\\.$`).exec(first)?.[1]
        const job = new RegExp(`^${name} works as an? (\\w+)\\.$`).exec(second)?.[1]
        assert.isDefined(city, first)
        const answer = d["messages"].at(-1).content
        if (answer !== city) {
          assert.strictEqual(answer, job)
          slips++
        }
      }
      assert.isTrue(slips > 15 && slips < 45, `${slips} of 60 noisy demonstrations answer the job`)
      const bad = yield* Effect.exit(generated({ kind: "borm" }))
      assert.isTrue(Exit.isFailure(bad) && String(Cause.squash(bad.cause)).includes("unknown kind borm"))
    }), { timeout: 300_000 })

  it.effect("noisy demonstrations misstate a share of their answers; the rest are the oracle's", () =>
    Effect.gen(function*() {
      const gold = (yield* generated({ seed: 3, demos: 60 })).read("demos.jsonl")
      const noisy = (yield* generated({ seed: 3, demos: 60, noise: 0.5 })).read("demos.jsonl")
      assert.strictEqual(noisy.length, 60)
      const answer = (d: Record<string, any>) => d["messages"].at(-1).content as string
      const slips = noisy.filter((d, i) => answer(d) !== answer(gold[i]!)).length
      assert.isTrue(slips > 15 && slips < 45, `${slips} of 60 noisy demonstrations misstate the answer`)
      for (const [i, d] of noisy.entries()) {
        // Same searches, same observations: only the final answer may differ.
        assert.deepStrictEqual(d["messages"].slice(0, -2), gold[i]!["messages"].slice(0, -2))
      }
    }), { timeout: 300_000 })
})

describe("search task", () => {
  const world = World.make(World.defaults)
  const heldOut = questions(world, { heldOut: 300 }).heldOut

  it.effect("the oracle answers ≥ 95% of held-out questions through the task's tools and reward", () =>
    Effect.gen(function*() {
      const ts = yield* rollout(SearchOracle.oracle, heldOut)
      assert.strictEqual(ts.length, heldOut.length)
      assert.isAtLeast(accuracy(ts), 0.95)
      for (const t of ts) {
        const hops = t.row?.["hops"] as number
        assert.strictEqual(t.termination, "answer")
        assert.strictEqual(t.metrics["reward/answer/searches"], hops, "one search per hop")
        assert.isTrue(observations(t).every((o) => !o.error && o.text.length <= 400))
      }
      // Both kinds of hop are there, and solved.
      assert.isAtLeast(accuracy(ts.filter((t) => t.row?.["hops"] === 2)), 0.95)
    }), { timeout: 300_000 })

  it.effect("the oracle answers ≥ 95% of the lookup variant's questions (born only, lookup.json's world)", () =>
    Effect.gen(function*() {
      const options = { seed: World.defaults.seed, passages: 40_000 }
      const rows = Effect.runSync(
        World.questions(World.make(options), { seed: 5, counts: { heldOut: 300 }, twoHop: 0.3, kinds: ["born"] })
      ).heldOut.map((q): Rollout.TaskRow => ({ ...q }))
      const ts = yield* rollout(SearchOracle.oracle, rows, { task: options })
      assert.isAtLeast(accuracy(ts), 0.95)
      assert.isTrue(ts.every((t) => t.metrics["reward/answer/searches"] === 1))
    }), { timeout: 300_000 })

  it.effect("noise policies score near 0: answering a random word of what they read, or without searching", () =>
    Effect.gen(function*() {
      assert.isBelow(accuracy(yield* rollout(SearchOracle.random, heldOut)), 0.1)
      const blind = yield* rollout(
        (messages) => ({
          toolCalls: [Oracle.call(messages, "answer", { answer: World.parse(Oracle.text(messages[1]))!.name })]
        }),
        heldOut.slice(0, 50)
      )
      assert.strictEqual(accuracy(blind), 0)
      assert.isTrue(blind.every((t) => t.metrics["reward/answer/answered"] === 1))
    }), { timeout: 300_000 })

  it.effect("an episode that never calls answer scores 0 even when its last observation holds the answer", () =>
    Effect.gen(function*() {
      const q = heldOut.find((x) => x.kind === "born")!
      const [t] = yield* rollout(
        (messages) => ({ toolCalls: [Oracle.call(messages, "search", { query: q.queries[0] })] }),
        [q]
      )
      assert.strictEqual(t!.termination, "max_turns")
      assert.include(observations(t!)[0]!.text, q.answer)
      assert.strictEqual(t!.reward, 0)
      assert.strictEqual(t!.metrics["reward/answer/answered"], 0)
      // With F1 too: no partial credit for the observation.
      const [f] = yield* rollout(
        (messages) => ({ toolCalls: [Oracle.call(messages, "search", { query: q.queries[0] })] }),
        [q],
        { task: { reward: "f1" } }
      )
      assert.strictEqual(f!.reward, 0)
    }))

  it.effect("bad actions come back as clear error observations and the episode goes on", () =>
    Effect.gen(function*() {
      const q = heldOut.find((x) => x.kind === "born")!
      const script: ReadonlyArray<Record<string, unknown>> = [
        { query: "  ?! " }, // no word
        { query: q.queries[0], k: 99 }, // k out of range
        { q: "name" } // no query
      ]
      const [t] = yield* rollout((messages) => {
        const turn = messages.filter((m) => m.role === "assistant").length
        if (turn < script.length) return { toolCalls: [Oracle.call(messages, "search", script[turn]!)] }
        return { toolCalls: [Oracle.call(messages, "lookup", { query: "x" })] }
      }, [q])
      const seen = observations(t!)
      assert.strictEqual(seen.length, 4)
      assert.isTrue(seen.every((o) => o.error))
      assert.match(seen[0]!.text, /empty query/)
      assert.match(seen[1]!.text, /invalid arguments for tool "search"/)
      assert.match(seen[2]!.text, /invalid arguments for tool "search"/)
      assert.match(seen[3]!.text, /unknown tool "lookup"/)
      assert.strictEqual(t!.termination, "max_turns")
    }))

  it.effect("a session's searches are budgeted, and past the budget a search says so", () =>
    Effect.gen(function*() {
      const index = SearchIndex.make(World.passages(world))
      const session = yield* SearchSession.make(index, { ...SearchSession.defaults, maxSearches: 2 })
      const name = world.people[0]!.name
      assert.include(yield* session.search(name), `${name} was born in`)
      assert.strictEqual((yield* session.search(name, 1)).split("\n").length, 1)
      const over = yield* Effect.flip(session.search(name))
      assert.strictEqual(over.reason._tag, "InvalidAction")
      assert.match(over.message, /no searches left \(2 per episode\)/)
      assert.deepStrictEqual((yield* session.state).queries, [name, name])
      assert.strictEqual(yield* (yield* SearchSession.make(index)).search("Zzzzqx"), "No results.")
    }))

  it.effect("chains are isolated: each chain's session counts only its own searches", () =>
    Effect.gen(function*() {
      // 64 chains at once; half search twice before answering, half once: each trajectory reports its own count.
      const rows = heldOut.filter((q) => q.hops === 1).slice(0, 16)
      const ts = yield* rollout((messages) => {
        const step = SearchOracle.plan(messages)
        const searched = messages.filter((m) => m.role === "tool").length
        const odd = Oracle.text(messages[1]).length % 2 === 1
        if ("search" in step || (odd && searched < 2)) {
          return {
            toolCalls: [Oracle.call(messages, "search", { query: World.parse(Oracle.text(messages[1]))!.name })]
          }
        }
        return { toolCalls: [Oracle.call(messages, "answer", { answer: step.answer })] }
      }, rows, { numChains: 4 })
      assert.strictEqual(ts.length, 64)
      for (const t of ts) {
        const odd = Oracle.text(t.messages[1]).length % 2 === 1
        assert.strictEqual(t.metrics["reward/answer/searches"], odd ? 2 : 1)
      }
    }))

  it.effect("the index is built once per run, whatever the number of chains", () =>
    Effect.gen(function*() {
      let builds = 0
      const passages = Effect.sync(() => {
        builds++
        return World.passages(world)
      })
      const ts = yield* rollout(SearchOracle.oracle, heldOut.slice(0, 16), { numChains: 4, passages })
      assert.strictEqual(ts.length, 64)
      assert.strictEqual(accuracy(ts), 1)
      assert.strictEqual(builds, 1)
    }))

  it.effect("a user's own corpus.jsonl (both line formats) and questions", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "search-corpus-"))
      const corpus = join(dir, "corpus.jsonl")
      writeFileSync(
        corpus,
        [
          JSON.stringify({ id: "fr", title: "Paris", text: "Paris is the capital of France." }),
          JSON.stringify({ id: 7, contents: "\"Berlin\"\nThe capital of Germany is Berlin." }),
          "",
          JSON.stringify({ text: "Rome is the capital of Italy." })
        ].join("\n")
      )
      const rows = [
        { question: "What is the capital of Germany?", answer: "Berlin" },
        { question: "What is the capital of Italy?", answer: ["Rome", "Roma"] }
      ]
      const ts = yield* rollout((messages) => {
        const seen = messages.filter((m) => m.role === "tool").map(Oracle.text)
        if (seen.length === 0) {
          const country = /capital of (\w+)\?/.exec(Oracle.text(messages[1]))![1]!
          return { toolCalls: [Oracle.call(messages, "search", { query: `capital ${country}`, k: 1 })] }
        }
        const answer = /(\w+) is the capital|is (\w+)\./.exec(seen[0]!)!
        return { toolCalls: [Oracle.call(messages, "answer", { answer: answer[1] ?? answer[2]! })] }
      }, rows, { task: { corpus } })
      assert.strictEqual(accuracy(ts), 1)
      const byQuestion = new Map(ts.map((t) => [Oracle.text(t.messages[1]), observations(t)[0]!.text]))
      // A Search-R1 line's title is shown before its text when the text does not begin with it.
      assert.strictEqual(byQuestion.get(rows[0]!.question), "Berlin: The capital of Germany is Berlin.")
      assert.strictEqual(byQuestion.get(rows[1]!.question), "Rome is the capital of Italy.")

      writeFileSync(corpus, `${JSON.stringify({ text: "fine" })}\n{"title": "no text"}\n`)
      const bad = yield* Effect.flip(rollout(SearchOracle.oracle, rows, { task: { corpus } }))
      assert.match(bad.message, /line 2/)
      assert.match(bad.message, /needs `text` or `contents`/)

      // Named from a config, the corpus is relative to the config file.
      writeFileSync(corpus, `${JSON.stringify({ text: "Rome is the capital of Italy." })}\n`)
      const fromConfig = yield* Task.resolve({ name: "search", options: { corpus: "corpus.jsonl" } }, {
        builtins: Tasks.builtins,
        resolvePath: (p) => join(dir, p)
      })
      yield* Effect.scoped(TaskRuntime.make(fromConfig))
      const elsewhere = yield* Task.resolve({ name: "search", options: { corpus: "corpus.jsonl" } }, {
        builtins: Tasks.builtins,
        resolvePath: (p) => join(dir, "nested", p)
      })
      const missing = yield* Effect.flip(Effect.scoped(TaskRuntime.make(elsewhere)))
      assert.include(missing.message, join(dir, "nested", "corpus.jsonl"))
    }))
})
