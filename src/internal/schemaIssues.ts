/**
 * Schema issues as one line per problem, `dotted.path: message`, with a suggestion for a mistyped key (a near key of
 * its section, or where a key of that name belongs): what a config file's and a task's options' errors print.
 *
 * A value given where the schema wanted another is shown when the decode kept it (`reportInput: true`, which
 * {@link decodeOptions} sets): `algorithm.steps: Expected number, got "12"`, cut to {@link maxInputChars}.
 */
import type { Schema } from "effect"
import { Formatter, SchemaAST, SchemaIssue } from "effect"

type PathKey = PropertyKey

const objectsIn = (ast: SchemaAST.AST): Array<SchemaAST.Objects> => {
  const encoded = SchemaAST.toEncoded(ast)
  if (encoded._tag === "Objects") return [encoded]
  if (encoded._tag === "Union") return encoded.types.flatMap(objectsIn)
  if (encoded._tag === "Suspend") return objectsIn(encoded.thunk())
  return []
}

/** The keys a struct at `path` accepts (the union of all struct members at that path). */
const knownKeysAt = (ast: SchemaAST.AST, path: ReadonlyArray<PathKey>): Array<string> => {
  let nodes = [ast]
  for (const key of path) {
    nodes = nodes.flatMap((node) => {
      const encoded = SchemaAST.toEncoded(node)
      if (encoded._tag === "Arrays" && typeof key === "number") return [...encoded.elements, ...encoded.rest]
      return objectsIn(node).flatMap((o) => o.propertySignatures.filter((p) => p.name === key).map((p) => p.type))
    })
  }
  return [...new Set(nodes.flatMap(objectsIn).flatMap((o) => o.propertySignatures.map((p) => String(p.name))))]
}

const editDistance = (a: string, b: string): number => {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    let diagonal = row[0]!
    row[0] = i
    for (let j = 1; j <= b.length; j++) {
      const above = row[j]!
      const same = a[i - 1]!.toLowerCase() === b[j - 1]!.toLowerCase()
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, diagonal + (same ? 0 : 1))
      diagonal = above
    }
  }
  return row[b.length]!
}

/** The closest known key: within a small edit distance, or one of the two a prefix of the other. */
export const suggestion = (key: string, known: ReadonlyArray<string>): string => {
  const lower = key.toLowerCase()
  const prefix = (k: string) => lower.startsWith(k.toLowerCase()) || k.toLowerCase().startsWith(lower)
  const best = known
    .map((k) => ({ k, d: prefix(k) ? 0.5 : editDistance(key, k) }))
    .sort((x, y) => x.d - y.d)[0]
  return best !== undefined && best.d <= Math.max(2, Math.floor(key.length / 3)) ? ` (did you mean "${best.k}"?)` : ""
}

/** The dotted paths where the schema has a key named `key` (any depth): a key put in the wrong section. */
const pathsOfKey = (ast: SchemaAST.AST, key: string): Array<string> => {
  const found: Array<string> = []
  const visit = (node: SchemaAST.AST, at: ReadonlyArray<string>, depth: number): void => {
    if (depth > 4) return
    for (const o of objectsIn(node)) {
      for (const p of o.propertySignatures) {
        const name = String(p.name)
        if (name.toLowerCase() === key.toLowerCase()) found.push([...at, name].join("."))
        visit(p.type, [...at, name], depth + 1)
      }
    }
  }
  visit(ast, [], 0)
  return [...new Set(found)]
}

/** A same-section suggestion, else where a key of that name lives in the config. */
const unknownKeyHint = (schema: Schema.Top, path: ReadonlyArray<PathKey>): string => {
  const key = String(path.at(-1))
  const near = suggestion(key, knownKeysAt(schema.ast, path.slice(0, -1)))
  if (near !== "") return near
  const elsewhere = pathsOfKey(schema.ast, key)
  return elsewhere.length === 0 ? "" : ` (it belongs at ${elsewhere.map((p) => `"${p}"`).join(" or ")})`
}

const dotted = (path: ReadonlyArray<PathKey>): string =>
  path.length === 0 ? "(root)" : path.map((k) => (typeof k === "number" ? `[${k}]` : String(k))).join(".")
    .replace(/\.\[/g, "[")

/**
 * The parse options of a decode whose issues {@link formatIssues} formats: every problem, and the values given
 * kept, so that a line can say what it got.
 */
export const decodeOptions = { errors: "all", reportInput: true } as const

/** How much of a value given a problem line shows (the rest is cut, with "…"). */
const maxInputChars = 60

const formatter = SchemaIssue.makeFormatterDefault()

/** The issue's message, its `, got <value>` (Effect's, when the input was kept) cut to {@link maxInputChars}. */
const leafMessage = (issue: SchemaIssue.Issue): string => {
  const full = formatter(issue)
  const value = SchemaIssue.hasInput(issue) ? Formatter.format(issue.input) : undefined
  const at = value === undefined ? -1 : full.indexOf(`, got ${value}`)
  if (value === undefined || at < 0) return full.split("\n")[0]!.trim()
  const shown = value.length > maxInputChars ? `${value.slice(0, maxInputChars)}…` : value
  return `${full.slice(0, at).split("\n")[0]!.trim()}, got ${shown}`
}

/** One line per problem, `path: message`, with a suggestion for mistyped keys. */
export const formatIssues = (schema: Schema.Top, issue: SchemaIssue.Issue): Array<string> => {
  const out: Array<string> = []
  const walk = (node: SchemaIssue.Issue, path: ReadonlyArray<PathKey>): void => {
    switch (node._tag) {
      case "Pointer":
        return walk(node.issue, [...path, ...node.path])
      case "Composite":
      case "AnyOf":
        if (node.issues.length === 0) out.push(`${dotted(path)}: ${leafMessage(node)}`)
        return node.issues.forEach((child) => walk(child, path))
      case "Encoding":
        return walk(node.issue, path)
      case "UnexpectedKey":
        return void out.push(`${dotted(path)}: unknown key${unknownKeyHint(schema, path)}`)
      case "MissingKey":
        return void out.push(`${dotted(path)}: missing`)
      default:
        return void out.push(`${dotted(path)}: ${leafMessage(node)}`)
    }
  }
  walk(issue, [])
  return out
}
