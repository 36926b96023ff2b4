/**
 * `agentfly mcp`: a task it cannot serve is one error naming it, on stderr, with exit code 1 (its working path over
 * stdio is tested with the SDK's client in `test/actors/mcp/McpServer.test.ts`).
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
    input: "",
    timeout: 300_000
  })

describe("agentfly mcp", () => {
  it("an unknown task, or a module that is not there, is one line on stderr and exit code 1; stdout stays empty", () => {
    const unknown = agentfly("mcp", "calculater")
    assert.strictEqual(unknown.status, 1)
    assert.strictEqual(unknown.stdout, "", "over stdio, stdout is the protocol's alone")
    assert.match(unknown.stderr, /unknown task "calculater".*calculator/)
    const missing = agentfly("mcp", "./no-such-task.ts", "--http", "0")
    assert.strictEqual(missing.status, 1)
    assert.match(missing.stderr, /no-such-task\.ts: no such file/)
  }, 300_000)
})
