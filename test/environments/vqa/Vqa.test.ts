/**
 * The visual QA task: seeded scenes (same seed, same bytes), the oracle that counts shapes from pixels solves every
 * held-out row through `agentfly oracle`'s path (the QA reward `exactMatch` on its `<answer>`), a wrong count scores
 * 0, and the picture reaches the trajectory as an image span of 16 tokens (the `tiny-vl` geometry).
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { copyFileSync, mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as Oracle from "../../../actors/Oracle.ts"
import * as OracleCli from "../../../cli/oracle.ts"
import * as Scene from "../../../environments/vqa/Scene.ts"
import * as VqaTask from "../../../environments/vqa/VqaTask.ts"
import * as Generate from "../../../examples/vqa/generate.ts"
import * as Image from "../../../src/Image.ts"

const example = resolve(import.meta.dirname, "../../../examples/vqa/vqa.json")

describe("visual QA", () => {
  it("a seed gives the same scene and the same PNG bytes; answers 0–3 all occur", () => {
    assert.deepStrictEqual(Scene.render(Scene.generate(7)), Scene.render(Scene.generate(7)))
    assert.notDeepEqual(Scene.render(Scene.generate(7)), Scene.render(Scene.generate(8)))
    const answers = new Set(Array.from({ length: 40 }, (_, s) => Scene.generate(s).answer))
    assert.deepStrictEqual([...answers].sort(), [0, 1, 2, 3])
    const scene = Scene.generate(7)
    const asked = scene.shapes.filter((s) => s.kind === scene.asked.kind && s.colour === scene.asked.colour)
    assert.strictEqual(asked.length, scene.answer)
    assert.strictEqual(VqaTask.imageTokens, 16)
  })

  it.effect("agentfly oracle on the example's config solves every held-out row; a wrong count scores 0", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "vqa-"))
      yield* Generate.write({ ...Generate.defaults, dir: join(dir, "data"), train: 10, heldOut: 60, demos: 2 })
      copyFileSync(example, join(dir, "vqa.json"))
      const { rows, trajectories } = yield* OracleCli.playRows(join(dir, "vqa.json"), 60)
      assert.strictEqual(rows.length, 60)
      assert.strictEqual(Oracle.solveRate(trajectories), 1)
      const t = trajectories[0]!
      const images = t.segments[0]!.spans.filter((s) => s.image !== undefined)
      assert.strictEqual(images.length, 1)
      assert.strictEqual(images[0]!.tokenIds.length, 16)
      const png = Scene.render(Scene.generate(Number((rows[0] as Record<string, unknown>)["seed"])))
      assert.strictEqual(images[0]!.image!.sha256, Image.sha256(png))

      const offByOne: Oracle.Policy = (messages) => {
        const reply = VqaTask.oracle(messages) as Oracle.Reply
        const n = Number(/<answer>(\d+)<\/answer>/.exec(reply.content ?? "")![1])
        return { content: `<answer>${n + 1}</answer>` }
      }
      const wrong = yield* Oracle.rollout({ task: VqaTask.task, rows, policy: offByOne })
      assert.strictEqual(Oracle.solveRate(wrong), 0)
      assert.isTrue(wrong.every((w) => w.reward === 0))
      // A model without vision (the text byte format) aborts the rollout at its first prompt, naming the model.
      const text = yield* Effect.flip(
        Oracle.rollout({
          task: VqaTask.task,
          rows: rows.slice(0, 2),
          policy: VqaTask.oracle,
          format: Oracle.byteFormat()
        })
      )
      assert.include(String((text as { readonly message?: string }).message), "has no vision tower")
      // The demonstrations are the oracle's answers.
      const demos = readFileSync(join(dir, "data", "demos.jsonl"), "utf8").trim().split("\n")
      assert.strictEqual(demos.length, 2)
      assert.include(demos[0]!, "data:image/png;base64,")
    }).pipe(Effect.provide(NodeServices.layer)))
})
