import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { spawnSync } from "node:child_process"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { report, toJson } from "../../cli/tokens.ts"
import * as ByteTokenizer from "../../src/ByteTokenizer.ts"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"
import * as TrajectoryBuilder from "../../src/TrajectoryBuilder.ts"
import { fourTurns, tools } from "../utils/conversations.ts"
import { Qwen, qwenModelDir, repoRoot } from "../utils/qwen.ts"
import { cli } from "../utils/agentfly.ts"

const dir = mkdtempSync(join(tmpdir(), "agentfly-cli-"))
const conversationFile = join(dir, "conversation.json")
writeFileSync(conversationFile, JSON.stringify({ messages: fourTurns, tools }))

/** Runs the real `agentfly` program (compiled, as an installed package runs it: test/setup/cli.ts). */
const agentfly = (...args: Array<string>) =>
  Effect.sync(() =>
    spawnSync(process.execPath, [cli, ...args], {
      cwd: repoRoot,
      encoding: "utf8",
      env: { ...process.env, NO_COLOR: "1" },
      timeout: 300_000
    })
  )

layer(Qwen.layer)("agentfly tokens", (it) => {
  it.effect("--json prints ids, mask, sources and segments equal to the builder's on the real Qwen folder", () =>
    Effect.gen(function*() {
      const { tokenizer } = yield* Qwen
      const run = yield* agentfly("tokens", "--model-dir", qwenModelDir, "--conversation", conversationFile, "--json")
      assert.strictEqual(run.status, 0, run.stderr)
      const printed = JSON.parse(run.stdout) as ReturnType<typeof toJson>
      // The folder's template is Qwen3's: one segment per rewritten turn.
      const template = yield* ChatTemplate.load(qwenModelDir).pipe(Effect.provide(NodeServices.layer))
      const builder = yield* TrajectoryBuilder.fromConversation({ tokenizer, template, messages: fourTurns, tools })
      assert.deepStrictEqual(printed, toJson(builder))
      assert.strictEqual(printed.segments, 5)
      assert.strictEqual(printed.ids.length, printed.mask.length)
      assert.strictEqual(printed.sources.length, printed.ids.length)
      assert.isTrue(printed.mask.every((bit, i) => (bit === 1) === (printed.sources[i] === "policy")))

      const qwen25 = yield* agentfly(
        "tokens",
        "--model-dir",
        qwenModelDir,
        "--conversation",
        conversationFile,
        "--template",
        "qwen2.5",
        "--json"
      )
      const single = JSON.parse(qwen25.stdout) as ReturnType<typeof toJson>
      assert.strictEqual(single.segments, 1)
      const full = yield* ChatTemplate.builtinTemplate("qwen2.5").render(fourTurns, { tools })
      assert.deepStrictEqual(single.ids, tokenizer.encode(full))
    }), 300_000)

  it.effect(
    "a JSONL file (demonstrations) shows the conversation of --line N, the line its errors name",
    () =>
      Effect.gen(function*() {
        const jsonl = join(dir, "demos.jsonl")
        const conversation = JSON.stringify({ messages: fourTurns, tools })
        writeFileSync(jsonl, `${JSON.stringify({ messages: [{ role: "user", content: "hi" }] })}\n${conversation}\n`)
        const whole = yield* agentfly(
          "tokens",
          "--model-dir",
          qwenModelDir,
          "--conversation",
          conversationFile,
          "--json"
        )
        const second = yield* agentfly(
          "tokens",
          "--model-dir",
          qwenModelDir,
          "--conversation",
          jsonl,
          "--line",
          "2",
          "--json"
        )
        assert.strictEqual(second.status, 0, second.stderr)
        assert.strictEqual(second.stdout, whole.stdout)
        const past = yield* agentfly("tokens", "--model-dir", qwenModelDir, "--conversation", jsonl, "--line", "3")
        assert.strictEqual(past.status, 1)
        assert.include(past.stderr, `${jsonl}:3: no conversation on that line (the file has 2 non-empty lines`)
      }),
    120_000
  )

  it.effect("a malformed conversation and a missing model folder exit 1 with a typed message", () =>
    Effect.gen(function*() {
      const bad = join(dir, "bad.json")
      writeFileSync(bad, JSON.stringify({ messages: [{ role: "robot", content: "beep" }] }))
      const malformed = yield* agentfly("tokens", "--model-dir", qwenModelDir, "--conversation", bad)
      assert.strictEqual(malformed.status, 1)
      assert.include(malformed.stderr, "TemplateError (InvalidMessages)")
      const missing = yield* agentfly("tokens", "--model-dir", dir, "--conversation", conversationFile)
      assert.strictEqual(missing.status, 1)
      assert.include(missing.stderr, "TokenizerError (NotFound)")
    }), 300_000)
})

describe("agentfly tokens report", () => {
  it.effect("lists every token with its source and mask, coloured by source only when asked", () =>
    Effect.gen(function*() {
      const modelDir = join(dir, "tiny")
      yield* ByteTokenizer.writeModelFiles(modelDir).pipe(Effect.provide(NodeServices.layer))
      const { tokenizer, template } = yield* Effect.all({
        tokenizer: Tokenizer.load(modelDir),
        template: ChatTemplate.load(modelDir)
      }).pipe(Effect.provide(NodeServices.layer))
      const messages = fourTurns.slice(1, 5)
      const builder = yield* TrajectoryBuilder.fromConversation({ tokenizer, template, messages })
      const plain = report(tokenizer, builder, false)
      const rows = plain.split("\n").filter((line) => /^\s+\d+\s+\d+\s+\w+\s+[01]\s/.test(line))
      assert.strictEqual(rows.length, toJson(builder).ids.length)
      assert.isTrue(rows.some((row) => /\s258\s+policy\s+1\s+"<\|im_end\|>"$/.test(row)))
      assert.isTrue(rows.some((row) => /\s+tool\s+0\s/.test(row)))
      assert.notInclude(plain, "\x1b[")
      assert.include(report(tokenizer, builder, true), "\x1b[32m")
    }))
})
