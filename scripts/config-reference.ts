/**
 * Writes `docs/configuration.md`, the reference of every key of a run's config, from the config Schema itself
 * (`src/TrainConfig.ts`): each key's type, values and bounds from the Schema's JSON Schema, its default by decoding a
 * config that leaves it out, and its description from the comment above it in the source. `test/docs/Docs.test.ts`
 * checks that the committed page is what this writes, so the reference cannot drift from the code.
 *
 *   npx tsx scripts/config-reference.ts            # rewrite docs/configuration.md
 *   npx tsx scripts/config-reference.ts --check    # exit 1 when it is stale
 *
 * @since 0.1.0
 */
import { readFileSync, writeFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { Schema } from "effect"
import * as TrainConfig from "../src/TrainConfig.ts"

type Json = { readonly [k: string]: unknown }

const source = fileURLToPath(new URL("../src/TrainConfig.ts", import.meta.url))
export const page = fileURLToPath(new URL("../docs/configuration.md", import.meta.url))

/** The text of a `/** … *\/` comment, its lines joined, `@` tags dropped. */
const commentText = (raw: string) =>
  raw.replace(/^\/\*\*|\*\/$/g, "").split("\n").map((l) => l.replace(/^\s*\* ?/, "").trim())
    .filter((l) => !l.startsWith("@")).join(" ").replace(/\s+/g, " ").trim()

/**
 * Comments in the source, by `Struct.key` (a property's comment) and by `Struct` (the struct's own), read from the
 * `export const NAME = Schema.Struct({ … })` blocks of `src/TrainConfig.ts`.
 */
const comments = (text: string): Map<string, string> => {
  const out = new Map<string, string>()
  const struct = /(\/\*\*(?:(?!\*\/)[\s\S])*\*\/)\s*export const (\w+) = Schema\.Struct\(\{\n([\s\S]*?)\n\}\)/g
  for (const m of text.matchAll(struct)) {
    out.set(m[2]!, commentText(m[1]!))
    const prop = /(\/\*\*(?:(?!\*\/)[\s\S])*\*\/)\s*\n\s*(\w+):/g
    for (const p of m[3]!.matchAll(prop)) out.set(`${m[2]}.${p[2]}`, commentText(p[1]!))
  }
  return out
}

/** The struct each section of `TrainConfig` is (`algorithm` → `AlgorithmConfig`), from the source. */
const sectionStructs = (text: string): Map<string, string> => {
  const out = new Map<string, string>()
  for (const m of text.matchAll(/^\s+(\w+): (?:withDefault\(|Schema\.optionalKey\()?(\w+Config)\b/gm)) {
    out.set(m[1]!, m[2]!)
  }
  return out
}

/** A value the Schema takes, for a key the reference must fill (a required one) to decode the rest. */
const sample = (s: Json): unknown => {
  if (Array.isArray(s.enum)) return s.enum[0]
  if (Array.isArray(s.anyOf)) return sample(s.anyOf[0] as Json)
  switch (s.type) {
    case "string":
      return "x"
    case "integer":
    case "number":
      return typeof s.minimum === "number" ? Math.max(s.minimum, s.exclusiveMinimum === true ? 1 : 0) || 1 : 1
    case "boolean":
      return false
    case "array":
      return Array.from({ length: typeof s.minItems === "number" ? s.minItems : 0 }, () => sample((s.items ?? {}) as Json))
    case "object":
      return filled(s)
    default:
      return "x"
  }
}

/** An object with its required keys and every section (optional ones too) filled, so that defaults show. */
const filled = (s: Json): Record<string, unknown> => {
  const props = (s.properties ?? {}) as Record<string, Json>
  const required = new Set((s.required ?? []) as Array<string>)
  const out: Record<string, unknown> = {}
  for (const [k, p] of Object.entries(props)) {
    // An address key takes an http(s) address (`learner.tinker.baseUrl`).
    if (required.has(k)) out[k] = /url$/i.test(k) && p.type === "string" ? "http://127.0.0.1" : sample(p)
    else if (p.type === "object" && p.properties !== undefined) out[k] = filled(p)
  }
  return out
}

/** The `expected` texts of a Schema AST node's checks: `a value between 0 (excluded) and 1`. */
const checksOf = (ast: unknown): Array<string> =>
  (((ast as { checks?: Array<{ annotations?: { expected?: unknown } }> }).checks) ?? [])
    .map((c) => c.annotations?.expected).filter((e): e is string => typeof e === "string" && e !== "an integer")

/** A struct's property ASTs by name (the decoded side). */
const propertiesOf = (ast: unknown): Map<string, unknown> =>
  new Map(
    ((ast as { propertySignatures?: Array<{ name: string; type: unknown }> }).propertySignatures ?? [])
      .map((p) => [p.name, p.type])
  )

const typeOf = (s: Json): string => {
  // Effect's JSON Schema lets a number be "Infinity", "-Infinity" or "NaN" as strings; the checks refuse them.
  if (Array.isArray(s.anyOf) && (s.anyOf as Array<Json>).some((a) => a.type === "number")) return "number"
  if (Array.isArray(s.enum)) return s.enum.map((v) => `\`${JSON.stringify(v)}\``).join(", ")
  if (Array.isArray(s.anyOf)) return (s.anyOf as Array<Json>).map(typeOf).join(" or ")
  const bounds = (min: unknown, max: unknown, exMin: unknown) =>
    typeof min === "number" && typeof max === "number"
      ? ` ${exMin === true ? "(" : "["}${min.toLocaleString("en")}, ${max.toLocaleString("en")}]`
      : ""
  switch (s.type) {
    case "integer":
      return `integer${bounds(s.minimum ?? s.exclusiveMinimum, s.maximum, s.exclusiveMinimum !== undefined)}`
    case "number":
      return `number${bounds(s.minimum ?? s.exclusiveMinimum, s.maximum, s.exclusiveMinimum !== undefined)}`
    case "array":
      return `array of ${typeOf((s.items ?? {}) as Json)}`
    case "object":
      return "object"
    default:
      return String(s.type ?? "any")
  }
}

const cell = (text: string) => text.replace(/\|/g, "\\|")

/** The page. */
export const render = (): string => {
  const text = readFileSync(source, "utf8")
  const notes = comments(text)
  const structs = sectionStructs(text)
  const root = Schema.toJsonSchemaDocument(TrainConfig.TrainConfig).schema as Json
  const decoded = Schema.decodeUnknownSync(TrainConfig.TrainConfig)(filled(root)) as unknown as Record<string, unknown>
  const lines = [
    "# Configuration reference",
    "",
    "Every key of a run's config (`agentfly train CONFIG`; JSON, YAML or a TypeScript module), generated from the",
    "config Schema in `src/TrainConfig.ts` by `scripts/config-reference.ts`: the type, values and bounds the Schema",
    "checks when the config is decoded, the default a config that leaves the key out gets, and the comment the code",
    "gives it. An unknown key, a value of the wrong type or out of its bounds stops a run before anything starts,",
    "naming the key. How the keys work together: [training.md](training.md).",
    ""
  ]
  const table = (
    path: string,
    schema: Json,
    ast: unknown,
    values: Record<string, unknown> | undefined,
    struct: string
  ) => {
    const asts = propertiesOf(ast)
    const props = (schema.properties ?? {}) as Record<string, Json>
    const required = new Set((schema.required ?? []) as Array<string>)
    const rows: Array<string> = []
    const nested: Array<() => void> = []
    for (const [key, p] of Object.entries(props)) {
      const full = path === "" ? key : `${path}.${key}`
      const isSection = p.type === "object" && p.properties !== undefined
      const sub = structs.get(key)
      // A section defined inline or in another module gets its table too, without the source's comments.
      if (isSection) {
        nested.push(() => table(full, p, asts.get(key), values?.[key] as Record<string, unknown> | undefined, sub ?? ""))
      }
      const def = required.has(key)
        ? "required"
        : isSection
        ? (values?.[key] === undefined ? "section unset" : "see below")
        : values?.[key] === undefined
        ? "unset"
        : `\`${JSON.stringify(values[key])}\``
      // A section's own comment heads its table below; its row keeps the comment on the key, if any.
      const note = notes.get(`${struct}.${key}`) ?? ""
      const checks = checksOf(asts.get(key))
      const type = isSection ? "section" : [typeOf(p).replace(/ [[(].*\]$/, ""), ...checks].join(", ")
      rows.push(`| \`${full}\` | ${cell(type)} | ${def} | ${cell(note)} |`)
    }
    lines.push(`## ${path === "" ? "Top level" : `\`${path}\``}`, "")
    const about = path === "" ? "" : notes.get(struct)
    if (about !== undefined && about !== "") lines.push(about, "")
    lines.push("| Key | Type | Default | About |", "| --- | --- | --- | --- |", ...rows, "")
    for (const n of nested) n()
  }
  table("", root, TrainConfig.TrainConfig.ast, decoded, "TrainConfig")
  return lines.join("\n")
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const now = render()
  if (process.argv.includes("--check")) {
    const stale = readFileSync(page, "utf8") !== now
    if (stale) console.error("docs/configuration.md is stale: run npx tsx scripts/config-reference.ts")
    process.exit(stale ? 1 : 0)
  }
  writeFileSync(page, now)
  console.log(`wrote ${page}`)
}
