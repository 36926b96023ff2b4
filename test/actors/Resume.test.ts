import { assert, describe, it } from "@effect/vitest"
import * as Resume from "../../actors/Resume.ts"

describe("Resume", () => {
  it("a recorded config's relative task module path is the current absolute one of the same file, for resume", () => {
    const current = { seed: 1, task: "/work/rooms/task.ts" }
    assert.deepStrictEqual(Resume.withRecordedTask({ seed: 1, task: "./task.ts" }, current), current)
    assert.deepStrictEqual(
      Resume.withRecordedTask({ task: { name: "./task.ts", options: { a: 1 } } }, { task: { name: "/r/task.ts" } }),
      { task: { name: "/r/task.ts", options: { a: 1 } } }
    )
    // None recorded: a module run directly, recorded before it named itself.
    assert.deepStrictEqual(Resume.withRecordedTask({ seed: 1 }, current), current)
    assert.deepStrictEqual(Resume.withRecordedTask({ seed: 1 }, { seed: 1, task: "calculator" }), { seed: 1 })
    // Another module, a built-in name or an absolute recorded path stay what they were: a change.
    for (const task of ["./other.ts", "calculator", "/elsewhere/task.ts"]) {
      assert.deepStrictEqual(Resume.withRecordedTask({ task }, current), { task })
    }
  })

  it("a recorded config's relative task path option is the current absolute one of the same path, for resume", () => {
    const current = { task: { name: "swe", options: { root: "/work/data/folders", pool: 2 } } }
    for (const root of ["data/folders", "../data/folders/", "./folders"]) {
      const recorded = { task: { name: "swe", options: { root, pool: 2 } } }
      assert.deepStrictEqual(Resume.withRecordedPathOptions(recorded, current), current, root)
    }
    // Another folder, an absolute recorded path or another option stay what they were: a change.
    for (const root of ["other", "/elsewhere/folders"]) {
      const recorded = { task: { name: "swe", options: { root, pool: 2 } } }
      assert.deepStrictEqual(Resume.withRecordedPathOptions(recorded, current), recorded, root)
    }
    const recordedPool = { task: { name: "swe", options: { root: "folders", pool: 4 } } }
    const pool = Resume.withRecordedPathOptions(recordedPool, current)
    assert.deepStrictEqual(pool, { task: { name: "swe", options: { root: "/work/data/folders", pool: 4 } } })
    assert.deepStrictEqual(Resume.withRecordedPathOptions({ task: "swe" }, current), { task: "swe" })
  })

})
