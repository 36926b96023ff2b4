/**
 * `cli/main.ts`: a bad invocation prints what was wrong and where the usage is, not the whole help.
 */
import { assert, describe, it } from "@effect/vitest"
import { spawnSync } from "node:child_process"
import { dirname, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { cli } from "../utils/agentfly.ts"

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")
const agentfly = (...args: Array<string>) =>
  spawnSync(process.execPath, [cli, ...args], {
    cwd: repoRoot,
    encoding: "utf8",
    timeout: 300_000
  })

describe("agentfly", () => {
  it("a bad flag or value is one error naming it and the command's --help, on stderr; exit code 1", () => {
    const unknown = agentfly("train", "--nosuchflag")
    assert.strictEqual(unknown.status, 1)
    assert.strictEqual(unknown.stdout, "")
    assert.strictEqual(
      unknown.stderr,
      "Unrecognized flag: --nosuchflag in command agentfly train\nSee `agentfly train --help`.\n"
    )
    const value = agentfly("eval", "--seed", "abc", "run/config.json")
    assert.strictEqual(value.status, 1)
    assert.strictEqual(value.stdout, "")
    assert.match(value.stderr, /^Invalid value for flag --seed: "abc"\. .*\nSee `agentfly eval --help`\.\n$/)
  }, 300_000)

  it("--help still prints the help", () => {
    const help = agentfly("train", "--help")
    assert.strictEqual(help.status, 0)
    assert.include(help.stdout, "FLAGS")
    assert.include(help.stdout, "--resume")
  }, 300_000)
})
