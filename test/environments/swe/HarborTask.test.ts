/**
 * Harbor task folders read and checked before any container starts: a generated folder's instruction, tests,
 * solution, limits and environment digest (the same environment, the same digest and so one image); a malformed
 * folder is a `HarborError` naming what is wrong; the verifier's reward file parses as a number or Harbor's JSON.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as BugFix from "../../../environments/swe/BugFix.ts"
import * as HarborTask from "../../../environments/swe/HarborTask.ts"
import * as Workspace from "../../../environments/swe/Workspace.ts"

const written = (tasks: ReadonlyArray<BugFix.Generated>) =>
  Effect.gen(function*() {
    const root = mkdtempSync(join(tmpdir(), "harbor-"))
    yield* BugFix.write(root, tasks)
    return root
  })

describe("Harbor task folders", () => {
  it.effect("a generated folder reads whole; one environment, one digest", () =>
    Effect.gen(function*() {
      const tasks = BugFix.generate(3, BugFix.bugs.length + 1)
      const root = yield* written(tasks)
      const loaded = yield* Effect.forEach(tasks, (t) => HarborTask.load(`${root}/${t.name}`))
      const first = loaded[0]!
      assert.strictEqual(first.name, "fix-0")
      assert.strictEqual(first.instruction, tasks[0]!.instruction)
      assert.match(first.instruction, /^`\w+` in textutil\.py .+\. Fix it, then submit\.$/)
      assert.deepStrictEqual([...first.tests.keys()], ["test.sh", "test_outputs.py"])
      assert.match(first.solution!, /^#!\/bin\/sh\npython3 - <<'EOF'/)
      assert.deepStrictEqual(first.environment, ["Dockerfile", "textutil.py"])
      assert.strictEqual(first.verifierTimeoutMillis, 60_000)
      assert.strictEqual(first.memoryBytes, 512 * (1 << 20))
      assert.strictEqual(first.workdir, undefined, "no [environment] workdir: the image's WORKDIR (/app) decides")
      // The bugs come in turn: the last task repeats the first's bug, so its environment and digest.
      assert.strictEqual(new Set(loaded.map((t) => t.digest)).size, BugFix.bugs.length)
      assert.strictEqual(loaded.at(-1)!.digest, first.digest)
      assert.notStrictEqual(loaded.at(-1)!.tests.get("test_outputs.py"), undefined)
      assert.deepStrictEqual(BugFix.generate(3, 4), tasks.slice(0, 4), "seeded")
    }).pipe(Effect.provide(NodeServices.layer)))

  it.effect("a malformed folder is a HarborError naming what is wrong", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const [task] = BugFix.generate(1, 1)
      const refused = (edit: (dir: string) => Effect.Effect<void, unknown>) =>
        Effect.gen(function*() {
          const root = yield* written([task!])
          yield* edit(`${root}/fix-0`)
          return (yield* Effect.flip(HarborTask.load(`${root}/fix-0`))) as HarborTask.HarborError
        })
      const messages = [
        yield* refused((d) => fs.remove(`${d}/instruction.md`)),
        yield* refused((d) => fs.writeFileString(`${d}/task.toml`, "[verifier\ntimeout_sec = 1")),
        yield* refused((d) => fs.writeFileString(`${d}/task.toml`, "[verifier]\ntimeout_sec = \"soon\"")),
        yield* refused((d) => fs.remove(`${d}/tests/test.sh`)),
        yield* refused((d) => fs.remove(`${d}/environment/Dockerfile`)),
        yield* refused((d) => fs.writeFileString(`${d}/task.toml`, "[environment]\nmemory = \"lots\"")),
        yield* refused((d) => fs.writeFileString(`${d}/instruction.md`, "  \n"))
      ].map((e) => e.message)
      assert.match(messages[0]!, /^the instruction \(instruction\.md\) is missing$/)
      assert.match(messages[1]!, /^task\.toml is not valid TOML/)
      assert.match(messages[2]!, /^task\.toml: .*timeout_sec/)
      assert.match(messages[3]!, /^the verifier \(tests\/test\.sh\) is missing$/)
      assert.match(messages[4]!, /^the environment's Dockerfile \(environment\/Dockerfile\) is missing$/)
      assert.match(messages[5]!, /^task\.toml: \[environment\] memory "lots" is not a size like "4G" or "512M"$/)
      assert.match(messages[6]!, /^instruction\.md is empty$/)
    }).pipe(Effect.provide(NodeServices.layer)))

  it("the verifier's reward: a number, or JSON with a numeric reward", () => {
    assert.strictEqual(Workspace.parseReward("1\n"), 1)
    assert.strictEqual(Workspace.parseReward(" 0.25 "), 0.25)
    assert.strictEqual(Workspace.parseReward("{\"reward\": 0.5, \"passed\": 3}"), 0.5)
    assert.isUndefined(Workspace.parseReward(""))
    assert.isUndefined(Workspace.parseReward("passed"))
    // Harbor accepts any numeric keys: one key alone is the reward (`Workspace.trainingReward`).
    assert.strictEqual(Workspace.parseReward("{\"score\": 1}"), 1)
    assert.isUndefined(Workspace.parseReward("{\"score\": \"high\"}"))
  })
})
