/**
 * A full disk is a typed error, `RunError (DiskFull)`, whatever write meets it (journal, metrics, samples,
 * checkpoint), and a run stopped by one resumes exactly once space is freed. The disk is a real tmpfs of a few
 * hundred KiB mounted for the test (the tests run as root); where mounting is not permitted, a file system that
 * fails writes past the same budget with Node's ENOSPC error stands in for it.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem, Layer, PlatformError } from "effect"
import { spawnSync } from "node:child_process"
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Journal from "../../actors/Journal.ts"
import * as LocalPolicy from "../../actors/LocalPolicy.ts"
import * as Rollouts from "../../actors/Rollouts.ts"
import * as ResourceManager from "../../actors/ResourceManager.ts"
import * as ChainFormat from "../../actors/ChainFormat.ts"
import * as CalculatorTask from "../../environments/calculator/CalculatorTask.ts"
import * as Generate from "../../examples/calculator/generate.ts"
import * as Dataset from "../../src/Dataset.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as TrainConfig from "../../src/TrainConfig.ts"
import { charFormat } from "../actors/fixtures/charFormat.ts"
import * as Toy from "../actors/fixtures/toyPolicy.ts"
import * as TrainLoop from "../../actors/TrainLoop.ts"

/**
 * A directory of `bytes` bytes: a tmpfs mounted there (unmounted with the scope), or, when mounting is refused, a
 * plain directory whose writes through the returned file system fail with ENOSPC past `bytes`.
 */
const smallDisk = (bytes: number) =>
  Effect.gen(function*() {
    const dir = mkdtempSync(join(tmpdir(), "disk-full-"))
    const mounted = spawnSync("mount", ["-t", "tmpfs", "-o", `size=${bytes}`, "tmpfs", dir]).status === 0
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        if (mounted) spawnSync("umount", [dir])
        rmSync(dir, { recursive: true, force: true })
      })
    )
    const fs = yield* FileSystem.FileSystem
    return { dir, mounted, fs: mounted ? fs : budgeted(fs, dir, bytes) }
  })

/** `fs`, but a write under `dir` that would take its files past `bytes` fails as Node fails on a full disk. */
const budgeted = (fs: FileSystem.FileSystem, dir: string, bytes: number): FileSystem.FileSystem => {
  const used = () => {
    const walk = (p: string): number =>
      statSync(p).isDirectory()
        ? (spawnSync("ls", ["-A", p]).stdout.toString().split("\n").filter((n) => n !== "")
          .reduce((n, name) => n + walk(join(p, name)), 0))
        : statSync(p).size
    return walk(dir)
  }
  const enospc = (method: string, path: string | number) =>
    PlatformError.systemError({
      _tag: "Unknown",
      module: "FileSystem",
      method,
      syscall: "write",
      pathOrDescriptor: path,
      cause: Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", errno: -28 })
    })
  const guard = <A>(
    path: string | number,
    method: string,
    size: number,
    write: Effect.Effect<A, PlatformError.PlatformError>
  ) =>
    Effect.suspend(() =>
      typeof path === "string" && !path.startsWith(dir) ? write
        : used() + size > bytes ? Effect.fail(enospc(method, path)) : write
    )
  return Object.assign(Object.create(fs) as FileSystem.FileSystem, {
    writeFile: (...[path, data, options]: Parameters<FileSystem.FileSystem["writeFile"]>) =>
      guard(path, "writeFile", data.length, fs.writeFile(path, data, options)),
    writeFileString: (...[path, data, options]: Parameters<FileSystem.FileSystem["writeFileString"]>) =>
      guard(path, "writeFileString", Buffer.byteLength(data), fs.writeFileString(path, data, options)),
    open: (...[path, options]: Parameters<FileSystem.FileSystem["open"]>) =>
      Effect.map(fs.open(path, options), (file) =>
        path.startsWith(dir)
          ? Object.create(file, {
            writeAll: { value: (buffer: Uint8Array) => guard(path, "writeAll", buffer.length, file.writeAll(buffer)) }
          }) as FileSystem.File
          : file)
  })
}

const rows = (n: number, prefix: string) =>
  Dataset.parse(prefix, Array.from({ length: n }, (_, i) => JSON.stringify({ question: `${prefix} ${i}` })).join("\n"))

const stepsIn = (output: string) =>
  Effect.map(
    Journal.read(join(output, "journal.jsonl")),
    (r) => r.entries.flatMap((e) => (e.entry.kind === "step" ? [e.entry.step] : []))
  )

describe("a full disk", () => {
  it.effect("stops a run with RunError (DiskFull) at whichever write meets it; freed, the run resumes exactly", () =>
    Effect.gen(function*() {
      const disk = yield* smallDisk(256 * 1024)
      const configFor = (output: string) =>
        TrainConfig.decode({
          output,
          seed: 3,
          model: { path: "unused" },
          data: { train: "unused" },
          agent: { numChains: 4, maxTurns: 2, maxNewTokens: 16 },
          algorithm: { steps: 40, groupsPerStep: 3 },
          eval: { every: 10 },
          checkpoint: { every: 5, keep: 2 }
        })
      const options = (config: TrainConfig.TrainConfig) =>
        Effect.gen(function*() {
          return {
            config,
            train: yield* rows(10, "train"),
            eval: yield* rows(8, "eval"),
            format: charFormat,
            task: Toy.task()
          }
        })
      const run = (o: TrainLoop.Options, resume = false) =>
        Effect.scoped(TrainLoop.run({ ...o, resume })).pipe(
          Effect.provide(Toy.layer()),
          Effect.provideService(FileSystem.FileSystem, disk.fs)
        )
      const reference = yield* run(yield* options(yield* configFor(mkdtempSync(join(tmpdir(), "disk-ref-")))))

      // All but a few KiB taken by another file: the run fills the rest within its first steps.
      mkdirSync(join(disk.dir, "run"))
      writeFileSync(join(disk.dir, "filler"), new Uint8Array(256 * 1024 - 24 * 1024))
      const o = yield* options(yield* configFor(join(disk.dir, "run")))
      const error = yield* Effect.flip(run(o))
      assert.strictEqual(error._tag, "RunError")
      assert.strictEqual(error.reason._tag, "DiskFull", error.message)
      assert.match(error.message, /^disk full \(ENOSPC\)/)
      const done = yield* stepsIn(o.config.output)
      assert.isTrue(done.length < 40, `stopped early: ${done.length} steps`)

      rmSync(join(disk.dir, "filler"))
      const resumed = yield* run(o, true)
      assert.strictEqual(resumed.fingerprint, reference.fingerprint, "the weights of a run that never met a full disk")
      assert.deepStrictEqual(yield* stepsIn(o.config.output), Array.from({ length: 40 }, (_, i) => i + 1))
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it.live("a checkpoint that does not fit stops the real learner's run with RunError (DiskFull)", () =>
    Effect.gen(function*() {
      // The tiny model's weights take 2.5 MB and its optimiser state 5 MB: a 3 MiB disk holds the run's files and
      // the weights, not the moments.
      const disk = yield* smallDisk(3 * 1024 * 1024)
      const data = mkdtempSync(join(tmpdir(), "disk-full-data-"))
      yield* Generate.write({ dir: data, seed: 5, train: 8, heldOut: 2, validation: 1, demos: 1, noise: 0 })
      yield* ModelFolder.init(join(data, "model"), { preset: "tiny", seed: 3 })
      const folder = yield* ModelFolder.load(join(data, "model"))
      const config = TrainConfig.onModel(yield* TrainConfig.decode({
        output: join(disk.dir, "run"),
        model: { path: join(data, "model") },
        data: { train: join(data, "train.jsonl") },
        task: "calculator",
        agent: { renderTools: false, maxTurns: 1, numChains: 2, maxNewTokens: 8, maxContextTokens: 256 },
        algorithm: { steps: 2, groupsPerStep: 2, advantage: "reinforce++", entropyCoef: 0.01 },
        checkpoint: { every: 1 }
      }), folder.config)
      const error = yield* Effect.flip(Effect.scoped(TrainLoop.run({
        task: CalculatorTask.make(),
        config,
        format: ChainFormat.ofConfig(config, folder),
        train: yield* Dataset.load(join(data, "train.jsonl"), { onInvalid: "stop" })
      })).pipe(
        Effect.provide(Layer.provideMerge(
          Rollouts.inProcess,
          Layer.provide(LocalPolicy.layer(folder, config), Layer.succeed(FileSystem.FileSystem, disk.fs))
        )),
        Effect.provide(ResourceManager.ResourceManager.layer),
        Effect.provideService(FileSystem.FileSystem, disk.fs)
      ))
      assert.strictEqual(error.reason._tag, "DiskFull", error.message)
      assert.include(error.message, "disk full (ENOSPC): could not write")
      assert.include(error.message, "optimizer.safetensors")
      const journal = (yield* Journal.read(join(config.output, "journal.jsonl"))).entries.map((e) => e.entry.kind)
      assert.notInclude(journal, "checkpoint", "no checkpoint journaled")
      assert.deepStrictEqual(readdirSync(join(config.output, "checkpoints")), [], "no half-written .step-N.tmp left")
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
