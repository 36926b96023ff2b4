/**
 * Harbor paths cannot escape their root: a row's `task` of `../x` or an absolute path, and a folder whose
 * instruction, `tests/`, an `environment/` file or the folder itself is a symbolic link out of the root, are each a
 * `PathEscape` naming the path, where it leads and the root, before anything is read (a folder outside the root was
 * run and its verifier read host files into the container). Links that stay inside the root are followed. Through
 * the task on the real Docker engine, each escaping row fails its chain (masked) and the run goes on.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import { execFileSync } from "node:child_process"
import { mkdirSync, mkdtempSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Oracle from "../../../actors/Oracle.ts"
import * as BugFix from "../../../environments/swe/BugFix.ts"
import * as HarborOracle from "../../../environments/swe/HarborOracle.ts"
import * as HarborTask from "../../../environments/swe/HarborTask.ts"
import * as SweTask from "../../../environments/swe/SweTask.ts"

const [task] = BugFix.generate(1, 1)

/**
 * A root with a good task `fix-0` and, beside the root, an `outside` folder holding a task, a secret file and a
 * tests folder; then one folder per escape under the root, each a copy of `fix-0` with one link out.
 */
const layout = Effect.gen(function*() {
  const base = realpathSync(mkdtempSync(join(tmpdir(), "harbor-escape-")))
  const root = `${base}/root`, outside = `${base}/outside`
  yield* BugFix.write(root, [task!])
  yield* BugFix.write(outside, [task!])
  writeFileSync(`${outside}/secret.txt`, "host secret\n")
  const copy = (name: string) =>
    Effect.andThen(BugFix.write(root, [{ ...task!, name }]), Effect.succeed(`${root}/${name}`))
  const instruction = yield* copy("link-instruction")
  rmSync(`${instruction}/instruction.md`)
  symlinkSync(`${outside}/secret.txt`, `${instruction}/instruction.md`)
  const tests = yield* copy("link-tests")
  rmSync(`${tests}/tests`, { recursive: true })
  symlinkSync(`${outside}/fix-0/tests`, `${tests}/tests`)
  const environment = yield* copy("link-environment")
  rmSync(`${environment}/environment/textutil.py`)
  // A relative link: `..` through a link is resolved as the kernel resolves it.
  symlinkSync("../../../outside/secret.txt", `${environment}/environment/textutil.py`)
  symlinkSync(`${outside}/fix-0`, `${root}/link-folder`)
  // Links that stay inside the root: a folder, and a shared environment.
  symlinkSync(`${root}/fix-0`, `${root}/alias`)
  const shared = yield* copy("shared-environment")
  rmSync(`${shared}/environment`, { recursive: true })
  symlinkSync("../fix-0/environment", `${shared}/environment`)
  return { root, outside }
}).pipe(Effect.provide(NodeServices.layer))

type Loading = Effect.Effect<unknown, HarborTask.HarborError | HarborTask.PathEscape, FileSystem.FileSystem>

/** The `PathEscape` a load fails with (any other outcome fails the test). */
const escaped = (effect: Loading) =>
  Effect.flip(effect).pipe(
    Effect.map((e) => {
      assert.strictEqual(e._tag, "PathEscape", e.message)
      return e as HarborTask.PathEscape
    }),
    Effect.provide(NodeServices.layer)
  )

describe("Harbor paths cannot escape their root", () => {
  it.effect("a row's task of ../x or an absolute path is refused before anything is read", () =>
    Effect.gen(function*() {
      const { root, outside } = yield* layout
      const parent = yield* escaped(HarborTask.loadRow(root, "../outside/fix-0"))
      assert.deepInclude(parent, { folder: "../outside/fix-0", target: `${outside}/fix-0`, root })
      assert.strictEqual(
        parent.message,
        `the row's task leads to ${outside}/fix-0, outside the task folders' root ${root}`
      )
      // Climbing out and back in is still out: `..` is resolved before the comparison, by segments.
      const sibling = yield* escaped(HarborTask.loadRow(root, "fix-0/../../root-other"))
      assert.strictEqual(sibling.target, `${root}-other`)
      const absolute = yield* escaped(HarborTask.loadRow(root, `${outside}/fix-0`))
      assert.match(absolute.message, /^the row's task is an absolute path: a row names its folder relative to /)
      // Even an absolute path inside the root: rows name folders relative to it.
      yield* escaped(HarborTask.loadRow(root, `${root}/fix-0`))
      // The same folders, named inside the root, load.
      for (const inside of ["fix-0", "./fix-0/../fix-0"]) {
        const loaded = yield* HarborTask.loadRow(root, inside).pipe(Effect.provide(NodeServices.layer))
        assert.strictEqual(loaded.name, "fix-0")
      }
    }))

  it.effect("an instruction, tests/, an environment/ file or the folder itself linked out of the root is refused", () =>
    Effect.gen(function*() {
      const { root, outside } = yield* layout
      const instruction = yield* escaped(HarborTask.loadRow(root, "link-instruction"))
      assert.deepInclude(instruction, {
        folder: `${root}/link-instruction`,
        path: "instruction.md",
        target: `${outside}/secret.txt`,
        root
      })
      assert.strictEqual(
        instruction.message,
        `instruction.md is a symbolic link (or lies under one) to ${outside}/secret.txt, outside the root ${root}`
      )
      const tests = yield* escaped(HarborTask.loadRow(root, "link-tests"))
      assert.deepInclude(tests, { path: "tests", target: `${outside}/fix-0/tests` })
      const environment = yield* escaped(HarborTask.loadRow(root, "link-environment"))
      assert.deepInclude(environment, { path: "environment/textutil.py", target: `${outside}/secret.txt` })
      const folder = yield* escaped(HarborTask.loadRow(root, "link-folder"))
      assert.deepInclude(folder, { path: `${root}/link-folder`, target: `${outside}/fix-0` })
      assert.match(folder.message, /^the folder is a symbolic link \(or lies under one\) to /)
    }))

  it.effect("links inside the root are followed; a folder loaded alone must keep its files inside itself", () =>
    Effect.gen(function*() {
      const { root } = yield* layout
      const load = (effect: Effect.Effect<HarborTask.HarborTask, unknown, FileSystem.FileSystem>) =>
        effect.pipe(Effect.provide(NodeServices.layer))
      const original = yield* load(HarborTask.loadRow(root, "fix-0"))
      const alias = yield* load(HarborTask.loadRow(root, "alias"))
      assert.strictEqual(alias.instruction, original.instruction)
      const shared = yield* load(HarborTask.loadRow(root, "shared-environment"))
      assert.deepStrictEqual(shared.environment, original.environment)
      assert.strictEqual(shared.digest, original.digest, "one environment, one image")
      // Without a root, the folder is its own root: a link to a sibling leaves it.
      const alone = yield* escaped(HarborTask.load(`${root}/shared-environment`))
      assert.deepInclude(alone, { path: "environment/Dockerfile", target: `${root}/fix-0/environment/Dockerfile` })
      assert.strictEqual((yield* load(HarborTask.load(`${root}/fix-0`))).name, "fix-0")
    }))

  it.effect("a solution, a file deep in tests/ or a directory link in tests/ leading out is refused too", () =>
    Effect.gen(function*() {
      const { root, outside } = yield* layout
      const fs = yield* FileSystem.FileSystem
      const solution = `${root}/link-solution`
      yield* BugFix.write(root, [{ ...task!, name: "link-solution" }])
      yield* fs.remove(`${solution}/solution/solve.sh`)
      symlinkSync(`${outside}/secret.txt`, `${solution}/solution/solve.sh`)
      assert.strictEqual((yield* escaped(HarborTask.loadRow(root, "link-solution"))).path, "solution/solve.sh")
      const deep = `${root}/link-deep`
      yield* BugFix.write(root, [{ ...task!, name: "link-deep" }])
      mkdirSync(`${deep}/tests/data`)
      symlinkSync(`${outside}/secret.txt`, `${deep}/tests/data/fixture.txt`)
      assert.strictEqual((yield* escaped(HarborTask.loadRow(root, "link-deep"))).path, "tests/data/fixture.txt")
      const dir = `${root}/link-dir`
      yield* BugFix.write(root, [{ ...task!, name: "link-dir" }])
      symlinkSync(outside, `${dir}/tests/host`)
      assert.strictEqual((yield* escaped(HarborTask.loadRow(root, "link-dir"))).path, "tests/host")
    }).pipe(Effect.provide(NodeServices.layer)))
})

/** The containers this test process created that are still on the engine (other test files run beside it). */
const containers = () =>
  execFileSync("docker", ["ps", "-aq", "--filter", `label=agentfly.pid=${process.pid}`], { encoding: "utf8" }).trim()

describe("Harbor paths cannot escape their root (the swe task, Docker)", () => {
  it.effect("each escaping row fails its chain, masked, naming the escape; the good row is solved beside them", () =>
    Effect.gen(function*() {
      const { root, outside } = yield* layout
      const escapes = [
        "../outside/fix-0",
        `${outside}/fix-0`,
        "link-instruction",
        "link-tests",
        "link-environment",
        "link-folder"
      ]
      const tasks = [yield* HarborTask.load(`${root}/fix-0`).pipe(Effect.provide(NodeServices.layer))]
      const rows = [...escapes, "fix-0"].map((t) => ({ question: task!.instruction, task: t }))
      const done = yield* Oracle.rollout({ task: SweTask.make({ root }), rows, policy: HarborOracle.oracle(tasks) })
      const expected = [
        /outside the task folders' root/,
        /is an absolute path/,
        /instruction\.md is a symbolic link .*secret\.txt/,
        /tests is a symbolic link .*outside\/fix-0\/tests/,
        /environment\/textutil\.py is a symbolic link .*secret\.txt/,
        /the folder is a symbolic link .*outside\/fix-0/
      ]
      // Every escaping row, not only the first: the ones that ran or failed otherwise, with what happened.
      const notRefused = escapes.flatMap((t, i) => {
        const chain = done[i]!
        const refused = chain.masked && chain.reward === 0 && /^EnvFailed: /.test(chain.error ?? "") &&
          expected[i]!.test(chain.error ?? "") && !JSON.stringify(chain.messages).includes("host secret")
        return refused ? [] : [`${t}: reward ${chain.reward}, ${chain.error ?? "no error"}`]
      })
      assert.deepStrictEqual(notRefused, [])
      assert.strictEqual(done.at(-1)!.reward, 1, done.at(-1)!.error)
      assert.strictEqual(containers(), "", "no container outlived its chain")
    }), { timeout: 300_000 })
})
