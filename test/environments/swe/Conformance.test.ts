/**
 * Harbor's semantics, point by point, on the conformance fixtures written for this project
 * (`examples/swe/conformance/`), each checked against what Harbor's documentation says the result must be
 * (https://harborframework.com/docs/task-format; `docs/harbor.md` cites each point):
 *
 * - `tests/` is copied to `/tests` and `test.sh` run: a binary fixture arrives byte for byte;
 * - the oracle agent uploads `solution/` and executes `solve.sh`; scripts run as files, so `#!/bin/bash` with
 *   `set -euo pipefail` works (under `sh -c` dash refuses `-o pipefail`), and files beside `solve.sh` are there;
 * - `reward.json` may hold any numeric keys: each is a figure; the training reward is the key the task names;
 * - `[environment.env]`, `[verifier.env]` (with `${VAR:-default}`) and `[solution.env]` reach their phase only;
 * - the image's `WORKDIR` and `USER` are the agent's and the verifier's;
 * - Harbor's defaults (verifier 600 s, 2,048 MB, 1 CPU); every field honoured or refused by name; an image that
 *   cannot be had named with the reason before any chain starts;
 * - a multi-step task (`[[steps]]`): each step's instruction, tests (over the task's shared ones) and solution in
 *   one container, a reward per step, `min_reward` stopping the trial, `multi_step_reward_strategy = "mean"`;
 * - `allow_internet` through the run's allow-list (the test's own veth and server).
 *
 * On the real Docker engine (started by the suite's global setup); every container is removed when its chain ends.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { createServer } from "node:net"
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import * as OracleCli from "../../../cli/oracle.ts"
import * as Oracle from "../../../actors/Oracle.ts"
import * as Docker from "../../../actors/resources/Docker.ts"
import * as HarborFields from "../../../environments/swe/HarborFields.ts"
import * as HarborImage from "../../../environments/swe/HarborImage.ts"
import * as HarborOracle from "../../../environments/swe/HarborOracle.ts"
import * as HarborTask from "../../../environments/swe/HarborTask.ts"
import * as SweTask from "../../../environments/swe/SweTask.ts"
import * as Workspace from "../../../environments/swe/Workspace.ts"
import type { Conversation } from "../../../src/Message.ts"

const root = resolve(import.meta.dirname, "../../../examples/swe/conformance")
const playable = [
  "binary-fixture",
  "pipefail",
  "multi-reward",
  "multi-reward-mean",
  "env-tables",
  "workdir",
  "user",
  "users"
]

const load = (name: string) => HarborTask.loadRow(root, name).pipe(Effect.provide(NodeServices.layer))

/** The containers this test process created that are still on the engine. */
const containers = () =>
  execFileSync("docker", ["ps", "-aq", "--filter", `label=agentfly.pid=${process.pid}`], { encoding: "utf8" }).trim()

describe("Harbor conformance (fixtures, Docker)", () => {
  it.effect("the oracle solves each fixture as Harbor's documentation says; submitting at once does not", () =>
    Effect.gen(function*() {
      const tasks = yield* Effect.forEach(playable, load)
      const rows = tasks.map((t, i) => ({ question: t.instruction, task: playable[i]! }))
      const task = SweTask.make({ root, pool: 4 })
      const played = yield* Oracle.rollout({ task, rows, policy: HarborOracle.oracle(tasks) })
      const by = Object.fromEntries(played.map((t, i) => [playable[i]!, t]))
      const errors = played.flatMap((t, i) => (t.error === undefined ? [] : [`${playable[i]}: ${t.error}`]))
      assert.deepStrictEqual(errors, [])
      for (const name of ["binary-fixture", "pipefail", "env-tables", "workdir", "user", "users"]) {
        assert.strictEqual(by[name]!.reward, 1, `${name}: ${JSON.stringify(by[name]!.metrics)}`)
      }
      // reward.json's keys are all figures; the task's reward_key is the training reward; without one, the mean.
      assert.strictEqual(by["multi-reward"]!.reward, 1)
      assert.strictEqual(by["multi-reward"]!.metrics["reward/harbor/rewards/correctness"], 1)
      assert.strictEqual(by["multi-reward"]!.metrics["reward/harbor/rewards/performance"], 0.5)
      assert.strictEqual(by["multi-reward-mean"]!.reward, 0.75)
      assert.strictEqual(by["binary-fixture"]!.metrics["reward/harbor/rewards/reward"], 1, "reward.txt is `reward`")

      // The verifiers are not trivially 1: an agent that submits at once scores 0 where the work matters.
      const idleRows = ["pipefail", "env-tables", "workdir", "user", "multi-reward"]
      const idle = yield* Oracle.rollout({
        task,
        rows: idleRows.map((name) => rows[playable.indexOf(name)]!),
        policy: HarborOracle.idle
      })
      assert.deepStrictEqual(idle.map((t) => t.reward), [0, 0, 0, 0, 0])
      assert.strictEqual(idle.at(-1)!.metrics["reward/harbor/rewards/performance"], 0.5)
      assert.strictEqual(containers(), "", "no container outlives its chain")
    }), { timeout: 600_000 })

  it.effect("a fixture's fields, Harbor's defaults, and the image's USER and WORKDIR", () =>
    Effect.gen(function*() {
      const env = yield* load("env-tables")
      assert.deepStrictEqual(env.env, {
        environment: { GREETING: "hello" },
        verifier: { EXPECTED: "hello-solution" },
        solution: { PART: "solution" }
      })
      // Harbor's defaults where task.toml says nothing.
      assert.strictEqual(env.verifierTimeoutMillis, 600_000)
      assert.strictEqual(env.agentTimeoutMillis, 600_000)
      assert.strictEqual(env.buildTimeoutMillis, 600_000)
      assert.strictEqual(env.memoryBytes, 2048 * (1 << 20))
      assert.strictEqual(env.cpus, 1)
      assert.isTrue(env.allowInternet)
      const binary = yield* load("binary-fixture")
      const bytes = binary.tests.get("fixture.bin")!
      assert.strictEqual(bytes.length, 4102)
      assert.deepStrictEqual([...bytes.slice(-6)], [0x00, 0xff, 0xfe, 0xc3, 0x28, 0x80])
      const pipefail = yield* load("pipefail")
      assert.deepStrictEqual([...pipefail.solutionFiles.keys()], ["helper.sh", "solve.sh"])
      const [user, workdir] = [yield* load("user"), yield* load("workdir")]
      const who = yield* Effect.all([
        Effect.flatMap(HarborImage.image(user), (tag) => HarborImage.identity(user, tag)),
        Effect.flatMap(HarborImage.image(workdir), (tag) => HarborImage.identity(workdir, tag))
      ]).pipe(Effect.provide(Docker.DockerEngine.layer))
      assert.deepStrictEqual(who, [
        { user: "1234:1234", workdir: "/home/runner" },
        { user: "0:0", workdir: "/srv/project" }
      ])
    }), { timeout: 300_000 })

  it.effect("a refused field, a field Harbor lacks, a refused step field and artifacts are named", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(HarborFields.refusals({ steps: [{ name: "a", healthcheck: { command: "true" } }] }), [
        "[[steps]] healthcheck is refused: a healthcheck before the step is not run here"
      ])
      assert.deepStrictEqual(HarborFields.refusals({ steps: [{ name: "a", agent: { user: "x" } }] }), [
        "[[steps]] agent user is not a field of Harbor's task.toml"
      ])
      assert.deepStrictEqual(HarborFields.refusals({ artifacts: ["/app/out"] }), [
        "artifacts is refused: files copied out after a trial are not collected here (the trajectory is the record)"
      ])
      assert.deepStrictEqual(HarborFields.refusals({ environment: { gpus: 1, cpus: 2 } }), [
        "[environment] gpus is refused: no GPU is given to containers here"
      ])
      assert.deepStrictEqual(HarborFields.refusals({ environment: { gpus: 0, storage_mb: 10240 } }), [])
      assert.deepStrictEqual(HarborFields.refusals({ agent: { timeout: 5 }, extra: 1 }), [
        "extra is not a field of Harbor's task.toml",
        "[agent] timeout is not a field of Harbor's task.toml"
      ])
      assert.match(
        HarborFields.refusals({ environment: { healthcheck: { command: "true" } } })[0]!,
        /^\[environment\] healthcheck is refused/
      )
      assert.deepStrictEqual(HarborFields.refusals({ environment: { network_mode: "no-network" } }), [])
      const offline = HarborFields.read({ environment: { network_mode: "no-network" } })
      assert.isFalse("length" in offline ? true : offline.allowInternet)
      assert.deepStrictEqual(
        HarborFields.resolveEnv({ A: "${NOPE_X}", B: "x" }, {}),
        "A needs the host variable NOPE_X, which is not set"
      )
      // Every field of the table is documented in docs/harbor.md's table.
      const doc = yield* Effect.promise(() => import("node:fs").then((fs) => fs.readFileSync(
        resolve(import.meta.dirname, "../../../docs/harbor.md"),
        "utf8"
      )))
      for (const [section, fields] of Object.entries(HarborFields.fields)) {
        for (const field of Object.keys(fields)) {
          assert.include(doc, `| \`${HarborFields.fieldName(section, field)}\``, `${section} ${field}`)
        }
      }
    }))

  it.effect("a multi-step task: each step's instruction and verifier in one container, a reward per step", () =>
    Effect.gen(function*() {
      const multi = yield* load("multi-step")
      assert.deepStrictEqual(multi.steps.map((s) => s.name), ["create", "append"])
      assert.strictEqual(multi.instruction, "Create /app/log.txt holding the line: one", "the first step's")
      assert.deepStrictEqual([...multi.steps[0]!.tests.keys()].sort(), ["expect.sh", "test.sh"], "shared + own")
      assert.strictEqual(multi.steps[1]!.verifierTimeoutMillis, 60_000)
      assert.strictEqual(multi.steps[0]!.verifierTimeoutMillis, 600_000, "the task's (Harbor's default)")
      assert.strictEqual(multi.steps[0]!.minReward, 1)
      const task = SweTask.make({ root, pool: 3 })
      const row = { question: multi.instruction, task: "multi-step" }
      const firstOnly = (messages: Conversation) => {
        const turn = messages.filter((m) => m.role === "assistant").length
        const cmd = HarborOracle.solutionCommand(multi, multi.steps[0])!
        return { toolCalls: [Oracle.call(messages, turn === 0 ? "shell" : "submit", turn === 0 ? { cmd } : {})] }
      }
      const [oracle, half, idle] = yield* Effect.forEach(
        [HarborOracle.oracle([multi]), firstOnly, HarborOracle.idle],
        (policy) => Effect.map(Oracle.rollout({ task, rows: [row], policy }), (played) => played[0]!)
      )
      assert.strictEqual(oracle.reward, 1, JSON.stringify(oracle.metrics))
      assert.strictEqual(oracle.metrics["reward/harbor/rewards/steps/create"], 1)
      assert.strictEqual(oracle.metrics["reward/harbor/rewards/steps/append/lines"], 2)
      const answers = oracle.messages.filter((m) => m.role === "tool").map(Oracle.text)
      assert.include(answers, "Step create is done. Next step, append:\nAppend the line two to /app/log.txt.")
      assert.strictEqual(answers.at(-1), "submitted: step append was the last")
      // Step one right, step two not: the mean of 1 and 0.
      assert.strictEqual(half.reward, 0.5)
      assert.strictEqual(half.metrics["reward/harbor/rewards/steps/append"], 0)
      // Below step one's min_reward the trial stops there: step two is never reached (0 in the mean).
      assert.strictEqual(idle.reward, 0)
      assert.strictEqual(idle.metrics["reward/harbor/rewards/steps/append"], undefined)
      const lastAnswer = Oracle.text(idle.messages.filter((m) => m.role === "tool").at(-1))
      assert.strictEqual(lastAnswer, "submitted: the task stops after step create")
      assert.strictEqual(containers(), "", "no container outlives its chain")
    }), { timeout: 300_000 })

  it.effect("what a verifier installs at verify time is baked into the image by the run's option bake", () =>
    Effect.gen(function*() {
      const baked = yield* load("baked")
      const row = { question: baked.instruction, task: "baked" }
      const play = (bake: string | undefined) =>
        Effect.map(
          Oracle.rollout({
            task: SweTask.make({ root, pool: 1, ...(bake === undefined ? {} : { bake }) }),
            rows: [row],
            policy: HarborOracle.idle
          }),
          (played) => played[0]!.reward
        )
      assert.strictEqual(yield* play(undefined), 0, "offline, nothing installs the tool")
      assert.strictEqual(yield* play("mkdir -p /opt && echo ready > /opt/verifier-tool"), 1)
      assert.strictEqual(containers(), "", "no container outlives its chain")
    }), { timeout: 300_000 })

  it.effect("a prebuilt image that cannot be had fails before any chain, naming the image and the reason", () =>
    Effect.gen(function*() {
      const missing = yield* load("missing-image")
      assert.deepStrictEqual(missing.environment, [], "docker_image needs no environment/")
      const error = yield* Effect.flip(Workspace.prepare([missing]).pipe(Effect.provide(Docker.DockerEngine.layer)))
      assert.match(error.message, /the image agentfly\/no-such-image:0 cannot be had: \S/)
      // `agentfly oracle` checks every row's image before any chain starts, and stops naming it.
      const dir = mkdtempSync(join(tmpdir(), "harbor-missing-"))
      mkdirSync(join(dir, "data"))
      writeFileSync(join(dir, "data", "heldout.jsonl"), JSON.stringify({ question: "Submit.", task: "missing-image" }))
      writeFileSync(join(dir, "swe.json"), JSON.stringify({
        task: { name: "swe", options: { root } },
        output: "run",
        model: { path: "model" },
        data: { train: "data/heldout.jsonl", eval: "data/heldout.jsonl" },
        algorithm: { steps: 1 }
      }))
      const played = OracleCli.play(join(dir, "swe.json"), 1).pipe(Effect.provide(NodeServices.layer))
      const refused = yield* Effect.flip(played)
      assert.match(String((refused as Error).message), /the image agentfly\/no-such-image:0 cannot be had: \S/)
    }), { timeout: 120_000 })

  it.live("allow_internet through the run's allow-list: the allowed host is reached, not otherwise", () =>
    Effect.gen(function*() {
      // The test's own network: a veth pair in the host's namespace with a private address and a TCP server on it.
      const pair = `afs${process.pid}`.slice(0, 12)
      const host = `10.251.${(process.pid + 7) % 250}.1`
      const port = 30_000 + (process.pid % 10_000)
      yield* Effect.acquireRelease(
        Effect.sync(() => {
          execFileSync("ip", ["link", "add", `${pair}a`, "type", "veth", "peer", "name", `${pair}b`])
          execFileSync("ip", ["addr", "add", `${host}/32`, "dev", `${pair}a`])
          execFileSync("ip", ["link", "set", `${pair}a`, "up"])
          execFileSync("ip", ["link", "set", `${pair}b`, "up"])
        }),
        () => Effect.sync(() => execFileSync("ip", ["link", "del", `${pair}a`]))
      )
      yield* Effect.acquireRelease(
        Effect.callback<ReturnType<typeof createServer>>((resume) => {
          const s = createServer((socket) => socket.end("hi"))
          s.listen(port, host, () => resume(Effect.succeed(s)))
        }),
        (s) => Effect.sync(() => s.close())
      )
      // `[verifier.env] PROBE = "${AGENTFLY_PROBE:-…}"`: resolved from the host when the folders load (here, and
      // again by the run's provider).
      yield* Effect.acquireRelease(
        Effect.sync(() => (process.env["AGENTFLY_PROBE"] = `${host}:${port}`)),
        () => Effect.sync(() => delete process.env["AGENTFLY_PROBE"])
      )
      const names = ["network", "network-off"]
      const tasks = yield* Effect.forEach(names, load)
      const rows = tasks.map((t, i) => ({ question: t.instruction, task: names[i]! }))
      const play = (allowHosts: ReadonlyArray<string> | undefined) =>
        Effect.map(
          Oracle.rollout({
            task: SweTask.make({ root, pool: 2, ...(allowHosts === undefined ? {} : { allowHosts }) }),
            rows,
            policy: HarborOracle.idle
          }),
          (played) => played.map((t) => t.reward)
        )
      assert.deepStrictEqual(yield* play([host]), [1, 0], "allowed: reached; allow_internet = false: not")
      assert.deepStrictEqual(yield* play(undefined), [0, 0], "no allow-list (the default): offline")
      assert.strictEqual(containers(), "", "no container outlives its chain")
    }).pipe(Effect.scoped), { timeout: 300_000 })
})
