/**
 * The seeded knowledge base of the search task: people, companies, cities and countries with a few facts each,
 * rendered to one short passage per fact, and the one- and two-hop questions asked about them.
 *
 * **The world.** Every person is born in a city and has a job; every company was founded by one person (each person
 * founds exactly one) and is based in a city; every city lies in a country. Names are made-up
 * words of two or three syllables ("Kavo Meli", "Dilumo", "Tobar", "Sanoria"), unique across the whole world and
 * never an English word of the passages, so that a name is a search query that finds exactly its passages. With
 * `p` people there are `p` companies and `p / 4` cities: `4.25 p` passages.
 *
 * **The passages** (one fact each, titled with their subject): `Kavo Meli was born in Tobar.`, `Kavo Meli works
 * as a baker.`, `Dilumo was founded by Kavo Meli.`, `Dilumo is based in Tobar.`, `Tobar is a city in Sanoria.`
 * They are short on purpose: an observation of two of them is about 60 bytes, and a two-hop episode (two
 * searches and an answer) fits the 512 positions of the tiny byte-level policy.
 *
 * **The questions.** One hop: `Where was P born?` (a city), `Who founded C?` (a person), `Which country is T in?`
 * (a country). Two hops, whose second search needs the first answer: `Where was the founder of C born?` (founder,
 * then birthplace) and `Which country was P born in?` (birthplace, then its country). Each is answered by
 * searching the name it contains and reading the fact off the top passages; the subjects of different questions
 * are distinct, so two splits never ask about the same thing.
 *
 * Everything is drawn from `Sampling.mulberry32` streams of the seed: the same options always build the same world
 * and the same questions, which is how a run rebuilds the corpus its data was generated from.
 *
 * @since 0.1.0
 */
import { Effect, Schema } from "effect"
import * as Sampling from "../../src/Sampling.ts"
import type * as Corpus from "./Corpus.ts"

// ===== Models =====

/**
 * @category models
 * @since 0.1.0
 */
export interface Person {
  readonly name: string
  readonly city: string
  readonly job: string
}

/**
 * @category models
 * @since 0.1.0
 */
export interface Company {
  readonly name: string
  readonly founder: string
  readonly city: string
}

/**
 * @category models
 * @since 0.1.0
 */
export interface City {
  readonly name: string
  readonly country: string
}

/**
 * A generated world.
 *
 * @category models
 * @since 0.1.0
 */
export interface World {
  readonly seed: number
  readonly people: ReadonlyArray<Person>
  readonly companies: ReadonlyArray<Company>
  readonly cities: ReadonlyArray<City>
  readonly countries: ReadonlyArray<string>
}

/**
 * What builds a world: its seed and the least number of passages it renders to.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly seed: number
  readonly passages: number
}

/**
 * The default world: seed 2026, at least 10,000 passages.
 *
 * @category constants
 * @since 0.1.0
 */
export const defaults: Options = { seed: 2026, passages: 10_000 }

/**
 * The five kinds of question: three of one hop, two of two.
 *
 * @category models
 * @since 0.1.0
 */
export type Kind = "born" | "founder" | "country" | "founderBorn" | "bornCountry"

/**
 * The number of searches each kind needs.
 *
 * @category constants
 * @since 0.1.0
 */
export const hops: { readonly [K in Kind]: 1 | 2 } = {
  born: 1,
  founder: 1,
  country: 1,
  founderBorn: 2,
  bornCountry: 2
}

/**
 * A question row: AgentFly's format (`question`, and the `answer` the QA rewards read), with its kind, hops and
 * the names to search (`queries`, in order: what the oracle searches; the reward never reads them).
 *
 * @category models
 * @since 0.1.0
 */
export interface Question {
  readonly question: string
  readonly answer: string
  readonly kind: Kind
  readonly hops: 1 | 2
  readonly queries: ReadonlyArray<string>
}

/**
 * The world cannot hold the questions asked of it: a kind's subjects ran out (ask fewer, or build more passages).
 *
 * @category errors
 * @since 0.1.0
 */
export class WorldError extends Schema.TaggedError<WorldError>()("WorldError", { message: Schema.String }) {}

// ===== Names =====

const consonants = "bdfgklmnprstvz"
const vowels = "aeiou"
const finals = ["", "n", "r", "s", "l"]

/** The words of the passages and the questions: no name may equal one of them. */
const jobs = [
  "baker", "painter", "farmer", "doctor", "pilot", "writer", "singer", "tailor", "sailor", "judge",
  "nurse", "chef", "miner", "poet", "actor", "coach", "clerk", "guard", "smith", "diver"
]
const reserved = [
  ...jobs, "was", "born", "works", "founded", "based", "city", "country", "where", "who", "which", "founder", "the",
  "of", "in", "is", "as", "an", "by"
]

/** Draws unique capitalised words of `syllables` consonant–vowel syllables and an optional final consonant. */
const words = (next: () => number, used: Set<string>) => (syllables: number, final: boolean): string => {
  const pick = (s: string) => s[Math.floor(next() * s.length)]!
  for (;;) {
    let w = ""
    for (let i = 0; i < syllables; i++) w += pick(consonants) + pick(vowels)
    if (final) w += finals[Math.floor(next() * finals.length)]!
    if (used.has(w)) continue
    used.add(w)
    return w[0]!.toUpperCase() + w.slice(1)
  }
}

const shuffle = <A>(xs: Array<A>, next: () => number): Array<A> => {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1))
    ;[xs[i], xs[j]] = [xs[j]!, xs[i]!]
  }
  return xs
}

// ===== Constructors =====

/** Passages per person (two of its own, two of its company's) and per city (one), with `p / 4` cities. */
const passagesPerPerson = 4.25

/**
 * Builds the world of a seed: enough people for `passages` passages, their companies, cities and countries.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = (options: Options): World => {
  const next = Sampling.mulberry32(options.seed)
  const word = words(next, new Set(reserved))
  const people = Math.max(8, Math.ceil(options.passages / passagesPerPerson))
  const cityCount = Math.max(2, Math.ceil(people / 4))
  // First and last names combine: about 1.5 √p of each leaves room for p distinct pairs.
  const side = Math.max(4, Math.ceil(1.5 * Math.sqrt(people)))
  const firsts = Array.from({ length: side }, () => word(2, false))
  const lasts = Array.from({ length: side }, () => word(2, false))
  const countries = Array.from({ length: 24 }, () => word(2, false) + "ria")
  const cities = Array.from({ length: cityCount }, () => ({
    name: word(2, true),
    country: countries[Math.floor(next() * countries.length)]!
  }))
  const pairs = new Set<string>()
  const persons: Array<Person> = []
  while (persons.length < people) {
    const name = `${firsts[Math.floor(next() * side)]} ${lasts[Math.floor(next() * side)]}`
    if (pairs.has(name)) continue
    pairs.add(name)
    persons.push({
      name,
      city: cities[Math.floor(next() * cityCount)]!.name,
      job: jobs[Math.floor(next() * jobs.length)]!
    })
  }
  const founders = shuffle(persons.map((p) => p.name), next)
  const companies = founders.map((founder) => ({
    name: word(3, false),
    founder,
    city: cities[Math.floor(next() * cityCount)]!.name
  }))
  return { seed: options.seed, people: persons, companies, cities, countries }
}

/**
 * The world's passages, one fact each, titled with their subject; ids are their positions (`"0"`, `"1"`, …).
 *
 * @category constructors
 * @since 0.1.0
 */
export const passages = (world: World): Array<Corpus.Passage> => {
  const out: Array<Corpus.Passage> = []
  const add = (title: string, text: string) => out.push({ id: String(out.length), title, text })
  for (const p of world.people) {
    add(p.name, `${p.name} was born in ${p.city}.`)
    add(p.name, `${p.name} works as ${/^[aeiou]/.test(p.job) ? "an" : "a"} ${p.job}.`)
  }
  for (const c of world.companies) {
    add(c.name, `${c.name} was founded by ${c.founder}.`)
    add(c.name, `${c.name} is based in ${c.city}.`)
  }
  for (const t of world.cities) add(t.name, `${t.name} is a city in ${t.country}.`)
  return out
}

// ===== Questions =====

/**
 * The question templates, by kind; each holds its one name (what the first search looks for).
 *
 * @category constants
 * @since 0.1.0
 */
export const templates: { readonly [K in Kind]: (name: string) => string } = {
  born: (p) => `Where was ${p} born?`,
  founder: (c) => `Who founded ${c}?`,
  country: (t) => `Which country is ${t} in?`,
  founderBorn: (c) => `Where was the founder of ${c} born?`,
  bornCountry: (p) => `Which country was ${p} born in?`
}

/**
 * The kind and the name of a question written by {@link templates}, or undefined for any other text.
 *
 * @category getters
 * @since 0.1.0
 */
export const parse = (question: string): { readonly kind: Kind; readonly name: string } | undefined => {
  const patterns: ReadonlyArray<readonly [Kind, RegExp]> = [
    ["founderBorn", /^Where was the founder of (.+) born\?$/],
    ["bornCountry", /^Which country was (.+) born in\?$/],
    ["born", /^Where was (.+) born\?$/],
    ["founder", /^Who founded (.+)\?$/],
    ["country", /^Which country is (.+) in\?$/]
  ]
  for (const [kind, re] of patterns) {
    const m = re.exec(question.trim())
    if (m !== null) return { kind, name: m[1]! }
  }
  return undefined
}

/** The question of a kind about its subject (a person for `born`/`bornCountry`, a company or a city otherwise). */
const ask = (world: Lookup, kind: Kind, subject: string): Question => {
  const question = templates[kind](subject)
  const base = { question, kind, hops: hops[kind] }
  switch (kind) {
    case "born":
      return { ...base, answer: world.person.get(subject)!.city, queries: [subject] }
    case "founder":
      return { ...base, answer: world.company.get(subject)!.founder, queries: [subject] }
    case "country":
      return { ...base, answer: world.city.get(subject)!.country, queries: [subject] }
    case "founderBorn": {
      const founder = world.company.get(subject)!.founder
      return { ...base, answer: world.person.get(founder)!.city, queries: [subject, founder] }
    }
    case "bornCountry": {
      const city = world.person.get(subject)!.city
      return { ...base, answer: world.city.get(city)!.country, queries: [subject, city] }
    }
  }
}

interface Lookup {
  readonly person: Map<string, Person>
  readonly company: Map<string, Company>
  readonly city: Map<string, City>
}

/**
 * What {@link questions} draws: how many questions per split, in order (earlier splits are drawn first, so a split
 * does not change when a later one grows), and the share of two-hop questions.
 *
 * @category models
 * @since 0.1.0
 */
export interface QuestionOptions<Split extends string> {
  readonly seed: number
  readonly counts: { readonly [S in Split]: number }
  /** The chance that a question has two hops (its kind is then `founderBorn` or `bornCountry`). */
  readonly twoHop: number
  /**
   * The kinds to ask (default: all five). When they are all of one number of hops, `twoHop` no longer matters:
   * a fixed-shape variant such as `["born"]` asks one template only.
   */
  readonly kinds?: ReadonlyArray<Kind> | undefined
}

/**
 * Draws the splits' questions: each question's hops by `twoHop`, its kind uniformly among those hops' kinds (of
 * `kinds`, when given; the other number of hops when none of `kinds` has the one drawn), and a subject not asked
 * about before in that kind (so splits never share a question). A kind whose subjects run out gives way to another
 * of the same hops; fails with {@link WorldError} when the world is too small for the counts.
 *
 * @category constructors
 * @since 0.1.0
 */
export const questions = <Split extends string>(
  world: World,
  options: QuestionOptions<Split>
): Effect.Effect<{ readonly [S in Split]: Array<Question> }, WorldError> =>
  Effect.suspend(() => {
  const next = Sampling.mulberry32(options.seed)
  const lookup: Lookup = {
    person: new Map(world.people.map((p) => [p.name, p])),
    company: new Map(world.companies.map((c) => [c.name, c])),
    city: new Map(world.cities.map((t) => [t.name, t]))
  }
  const pools: { [K in Kind]: Array<string> } = {
    born: shuffle(world.people.map((p) => p.name), next),
    founder: shuffle(world.companies.map((c) => c.name), next),
    country: shuffle(world.cities.map((t) => t.name), next),
    founderBorn: shuffle(world.companies.map((c) => c.name), next),
    bornCountry: shuffle(world.people.map((p) => p.name), next)
  }
  const allowed = (kinds: ReadonlyArray<Kind>) => kinds.filter((k) => options.kinds?.includes(k) ?? true)
  const byHops: { readonly [H in 1 | 2]: ReadonlyArray<Kind> } = {
    1: allowed(["born", "founder", "country"]),
    2: allowed(["founderBorn", "bornCountry"])
  }
  if (byHops[1].length + byHops[2].length === 0) {
    const known = Object.keys(hops).join(", ")
    return Effect.fail(new WorldError({ message: `no kind of question to ask (known: ${known})` }))
  }
  const draw = (): Question | undefined => {
    // The hop draw comes first whatever `kinds` is, so the default draws the same questions as before the option.
    const drawn = byHops[next() < options.twoHop ? 2 : 1]
    const kinds = drawn.length > 0 ? drawn : byHops[1].length > 0 ? byHops[1] : byHops[2]
    const first = Math.floor(next() * kinds.length)
    for (let i = 0; i < kinds.length; i++) {
      const kind = kinds[(first + i) % kinds.length]!
      const subject = pools[kind].pop()
      if (subject !== undefined) return ask(lookup, kind, subject)
    }
    return undefined
  }
  const out = {} as { [S in Split]: Array<Question> }
  for (const split of Object.keys(options.counts) as Array<Split>) {
    out[split] = []
    for (let i = 0; i < options.counts[split]; i++) {
      const q = draw()
      if (q === undefined) {
        return Effect.fail(
          new WorldError({
            message: `the world of seed ${world.seed} ran out of subjects at ${split} question ${
              i + 1
            }: ask fewer questions or build more passages`
          })
        )
      }
      out[split].push(q)
    }
  }
  return Effect.succeed(out)
})
