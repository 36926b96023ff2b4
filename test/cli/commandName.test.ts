/**
 * The command a hint repeats (`to resume: … train CONFIG --resume`) is the one the user ran: `agentfly` from PATH, the
 * script's path when run by path from outside the clone, where `agentfly` is no command.
 */
import { assert, describe, it } from "@effect/vitest"
import { commandName } from "../../cli/train.ts"

describe("commandName", () => {
  it("agentfly from PATH (npx, npm link) or the CLI module itself", () => {
    assert.strictEqual(commandName("/work/app/node_modules/.bin/agentfly", "/work/app"), "agentfly")
    assert.strictEqual(commandName("cli/main.ts", "/work/agentfly"), "agentfly")
    assert.strictEqual(commandName(undefined, "/work"), "agentfly")
  })

  it("the script's path when it was run by path: absolute from outside, ./relative from inside", () => {
    assert.strictEqual(commandName("/opt/agentfly/bin/agentfly.mjs", "/tmp/mine"), "/opt/agentfly/bin/agentfly.mjs")
    assert.strictEqual(commandName("/opt/agentfly/bin/agentfly.mjs", "/opt/agentfly"), "./bin/agentfly.mjs")
    assert.strictEqual(commandName("../agentfly/bin/agentfly.mjs", "/opt/mine"), "/opt/agentfly/bin/agentfly.mjs")
  })
})
