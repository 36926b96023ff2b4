/**
 * Chess through the real command line: the seeded generator (the same options write the same bytes; the
 * demonstrations are the oracle's solved puzzles and fit the `tiny` preset's 512 positions with `--view fen`; a
 * Lichess CSV becomes the splits, a bad line stops it naming the line), then the shipped short config
 * (`examples/chess/short.json`: the built-in task `chess`, the tiny policy, a short warm-up and two RL steps) through
 * `agentfly train`, and the run's last checkpoint through `agentfly eval`. Every chain's board is closed when its
 * step ends (`env/chess/open` is 0 in every record).
 *
 * Real time: the child processes are the subject. The train case takes ≈ 30 s on 2 idle cores.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Puzzle from "../../../environments/chess/Puzzle.ts"
import * as Generate from "../../../examples/chess/generate.ts"
import { agentfly, evalCheckpoint, metricsOf, shortConfig } from "../../utils/agentfly.ts"

const generated = (options: Partial<Generate.Options>) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "chess-data-"))
    yield* Generate.write({
      ...Generate.defaults,
      train: 12,
      heldOut: 8,
      validation: 2,
      demos: 24,
      view: "fen",
      ...options,
      dir
    })
    const read = (name: string) =>
      readFileSync(join(dir, name), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, any>)
    return { dir, read, text: (name: string) => readFileSync(join(dir, name), "utf8") }
  }).pipe(Effect.provide(NodeServices.layer))

describe("chess from the command line", () => {
  it.live("the generator is seeded; demonstrations are the oracle's solved puzzles and fit 512 tokens", () =>
    Effect.gen(function*() {
      const a = yield* generated({ seed: 5 })
      const b = yield* generated({ seed: 5 })
      for (const f of ["train.jsonl", "heldout.jsonl", "validation.jsonl", "demos.jsonl"]) {
        assert.strictEqual(a.text(f), b.text(f), f)
      }
      const rows = ["train.jsonl", "heldout.jsonl", "validation.jsonl"].flatMap((f) => a.read(f))
      assert.strictEqual(new Set(rows.map((r) => r["fen"])).size, rows.length, "distinct puzzles")
      const demos = a.read("demos.jsonl")
      assert.isAtLeast(demos.length, 20, "the oracle solves nearly every demonstration puzzle within 512 tokens")
      const length = Oracle.contextLength()
      for (const demo of demos) {
        const messages: Array<Record<string, any>> = demo["messages"]
        assert.match(messages.at(-1)!["content"], /#: checkmate, puzzle solved\.$/)
        assert.isAtMost(length(demo["messages"]), 512)
        assert.notInclude(messages[2]!["content"], "a b c d e f g h", "view fen: no diagram")
      }
    }), { timeout: 240_000 })

  it.live("a Lichess CSV becomes the splits; a bad line stops the generator naming it", () =>
    Effect.gen(function*() {
      const source = mkdtempSync(join(tmpdir(), "chess-lichess-"))
      const puzzles = Puzzle.generate({ seed: 3, count: 10, mateIn2Share: 0 })
      const csv = ["PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags"]
        .concat(puzzles.map((p, i) => `p${i},${p.fen},${p.moves.join(" ")},1500,80,90,100,mate mateIn1 short,,`))
      writeFileSync(join(source, "good.csv"), csv.join("\n") + "\n")
      const data = yield* generated({
        lichess: join(source, "good.csv"),
        heldOut: 3,
        validation: 1,
        demos: 4,
        train: 2
      })
      assert.lengthOf(data.read("heldout.jsonl"), 3)
      assert.lengthOf(data.read("train.jsonl"), 2)
      assert.lengthOf(data.read("demos.jsonl"), 4, "the oracle solves the file's mates in one")
      assert.strictEqual(data.read("heldout.jsonl")[0]!["question"], "Mate in 1.")
      writeFileSync(join(source, "bad.csv"), csv.concat(["bad,8/8/8/8/8/8/8/8 w - - 0 1,e2e4 e7e5,1500"]).join("\n"))
      const run = yield* Effect.exit(generated({ lichess: join(source, "bad.csv") }))
      assert.isTrue(run._tag === "Failure")
      assert.match(String(run._tag === "Failure" ? run.cause : ""), /bad\.csv:12: bad: /)
    }), { timeout: 300_000 })

  it.live("the short config trains through `agentfly train` and its checkpoint evaluates with `agentfly eval`", () =>
    Effect.gen(function*() {
      const data = yield* generated({ seed: 1 })
      const dir = mkdtempSync(join(tmpdir(), "chess-short-"))
      const config = shortConfig("chess", data.dir, dir)
      const run = yield* agentfly(["train", config])
      assert.strictEqual(run.code, 0, run.output)
      assert.match(run.output, /on task chess/)
      assert.match(run.output, /held-out accuracy [\d.]+ ± [\d.]+ \(step 0\) → [\d.]+ ± [\d.]+ \(step 2\)/)
      assert.isTrue(existsSync(join(dir, "run", "report.html")))
      const records = metricsOf(join(dir, "run"))
      const train = records.filter((r) => r.phase === "train")
      assert.lengthOf(train, 2)
      assert.isTrue(train.every((r) => r.figures["learner/applied"] === 1), "both RL steps reached the learner")
      assert.isAbove(train.at(-1)!.figures["env/chess/boards"]!, 8, "the chains played on boards")
      assert.isTrue(train.every((r) => r.figures["env/chess/open"] === 0), "no board outlived its step")
      const evaluated = yield* evalCheckpoint(config, dir, "step-000002")
      assert.strictEqual(evaluated.code, 0, evaluated.output)
      const result = evaluated.result!
      assert.strictEqual(result.questions, 8)
      assert.isNumber(result.figures["eval/accuracy"])
    }), { timeout: 300_000 })
})
