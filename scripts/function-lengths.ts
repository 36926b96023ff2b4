/**
 * Lists every function over {@link maxLines} lines in src/, actors/, environments/ and cli/ (declarations, arrows,
 * methods, the generator bodies of `Effect.gen` and `Effect.fn`), longest first, as `file:line  length  name`.
 * Exits with status 1 when it lists any. Run: `npx tsx scripts/function-lengths.ts [--max N] [--all]`.
 *
 * A function whose body is little more than one inner function (`(pool) => Effect.gen(function*() { … })`,
 * `Effect.suspend(() => { … })`) is counted once, as that inner function under the outer one's name (its
 * signature, however long, is not counted).
 *
 * Skipped: the model-graph builders, which write one ONNX graph node after another, in the order of the model's
 * own layers, and read best whole: `src/model/Qwen2.ts` (the forward graphs), `src/autodiff/` (the backward
 * graph, its shape inference and the loss heads) and `src/onnx/` (the graph builder). `--all` lists them too: on
 * 2026-12-06 that adds `src/autodiff/Shapes.ts`'s `infer` (211 lines, one case per ONNX op) and
 * `src/autodiff/LossHead.ts`'s `emit` (92, the loss head's nodes in order).
 */
import { readFileSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { parseSync } from "rolldown/utils"
import { sourceFiles as allSourceFiles } from "../test/utils/sourceTree.ts"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..")
const folders = ["src", "actors", "environments", "cli"]
/** The model-graph builders, skipped unless asked for (see the header). */
export const builders = ["src/model/Qwen2.ts", "src/autodiff/", "src/onnx/"]

/** How many lines a wrapper may add around the one function it wraps and still count as that function. */
const wrapperSlack = 4

interface Node {
  readonly type: string
  readonly start: number
  readonly end: number
  readonly [key: string]: unknown
}

interface Found {
  readonly file: string
  readonly line: number
  readonly lines: number
  /** Lines of its body alone (a long signature is not a wrapper's body). */
  readonly bodyLines: number
  readonly name: string
  /** The functions whose nearest enclosing function this one is. */
  readonly inner: Array<Found>
  /** Set when this function only wraps one inner function: that one is reported in its place. */
  wrapper: boolean
}

const functionTypes = new Set(["FunctionDeclaration", "FunctionExpression", "ArrowFunctionExpression"])

const isNode = (value: unknown): value is Node =>
  typeof value === "object" && value !== null && typeof (value as { type?: unknown }).type === "string"

const children = (node: Node): Array<Node> =>
  Object.entries(node).flatMap(([key, value]) =>
    key === "typeAnnotation" || key === "returnType"
      ? []
      : Array.isArray(value)
      ? value.filter(isNode)
      : isNode(value)
      ? [value]
      : []
  )

/** The TypeScript sources under `dir` (the structure tests' walk, without JavaScript and declaration files). */
const sourceFiles = (dir: string): Array<string> =>
  allSourceFiles(dir).filter((path) => /\.(ts|mts)$/.test(path) && !path.endsWith(".d.ts"))

/** The name a key or binding node reads as, if it is a plain one. */
const nameOf = (node: unknown): string | undefined => {
  if (!isNode(node)) return undefined
  if (node.type === "Identifier" || node.type === "PrivateIdentifier") return node["name"] as string
  if (node.type === "Literal") return String(node["value"])
  if (node.type === "MemberExpression") {
    const object = nameOf(node["object"])
    const property = nameOf(node["property"])
    return object !== undefined && property !== undefined ? `${object}.${property}` : property
  }
  return undefined
}

/** `Effect.gen`, `Effect.fn("name")`, `Effect.fnUntraced`, … when `call` is one of them. */
const effectCall = (call: Node): string | undefined => {
  const callee = call["callee"] as Node
  const direct = nameOf(callee)
  if (direct?.startsWith("Effect.")) return direct
  // Effect.fn("name")(function*() { … })
  if (callee.type === "CallExpression") {
    const inner = nameOf(callee["callee"])
    const label = (callee["arguments"] as Array<Node>)[0]
    if (inner?.startsWith("Effect.fn")) return label?.type === "Literal" ? `${inner}("${label["value"]}")` : inner
  }
  return undefined
}

/** Every function of one file, nested as in the source. */
const functionsOf = (file: string): Array<Found> => {
  const text = readFileSync(file, "utf8")
  const lineStarts = [0]
  for (let i = 0; i < text.length; i++) if (text[i] === "\n") lineStarts.push(i + 1)
  const lineOf = (offset: number) => {
    let lo = 0, hi = lineStarts.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if (lineStarts[mid]! <= offset) lo = mid
      else hi = mid - 1
    }
    return lo + 1
  }
  const path = relative(root, file)
  const top: Array<Found> = []
  const visit = (node: Node, name: string, enclosing: Array<Found>): void => {
    if (functionTypes.has(node.type) && node["body"] !== null && node["body"] !== undefined) {
      const line = lineOf(node.start)
      const own = nameOf(node["id"]) ?? name
      const lines = lineOf(node.end - 1) - line + 1
      const body = node["body"] as Node
      const bodyLines = lineOf(body.end - 1) - lineOf(body.start) + 1
      const found: Found = { file: path, line, lines, bodyLines, name: own, inner: [], wrapper: false }
      enclosing.push(found)
      for (const child of children(node)) visit(child, own, found.inner)
      return
    }
    const named = (key: string) => nameOf(node[key])
    let next = name
    if (node.type === "VariableDeclarator") next = named("id") ?? name
    else if (node.type === "MethodDefinition" || node.type === "PropertyDefinition") next = named("key") ?? name
    else if (node.type === "Property") next = `${name === "" ? "" : `${name}.`}${named("key") ?? "[computed]"}`
    else if (node.type === "AssignmentExpression") next = named("left") ?? name
    else if (node.type === "ClassDeclaration" || node.type === "ClassExpression") next = named("id") ?? name
    else if (node.type === "CallExpression") {
      const effect = effectCall(node)
      if (effect !== undefined) next = `${name} (${effect})`
    }
    for (const child of children(node)) visit(child, next, enclosing)
  }
  const result = parseSync(file, text)
  if (result.errors.length > 0) throw new Error(`${path}: ${result.errors.map((e) => e.message).join("; ")}`)
  visit(result.program as unknown as Node, "", top)
  return top
}

/** Marks each function that only wraps one inner function, and lists every function that is not a wrapper. */
const flatten = (found: ReadonlyArray<Found>): Array<Found> =>
  found.flatMap((f) => {
    const widest = f.inner.reduce<Found | undefined>(
      (w, g) => (w !== undefined && w.lines >= g.lines ? w : g),
      undefined
    )
    f.wrapper = widest !== undefined && f.bodyLines - widest.lines <= wrapperSlack
    return [...(f.wrapper ? [] : [f]), ...flatten(f.inner)]
  })

/**
 * The functions of the layered folders over `maxLines` lines, longest first, and how many functions were read;
 * `skipped` folders and files are not read (default: the model-graph builders).
 */
export const longFunctions = (maxLines = 80, skipped: ReadonlyArray<string> = builders) => {
  const all = folders
    .flatMap((folder) => sourceFiles(join(root, folder)))
    .filter((file) => !skipped.some((skip) => relative(root, file).startsWith(skip)))
    .flatMap((file) => flatten(functionsOf(file)))
  const long = all.filter((f) => f.lines > maxLines).sort((a, b) => b.lines - a.lines || a.file.localeCompare(b.file))
  return { long, read: all.length }
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const skipped = process.argv.includes("--all") ? [] : builders
  const maxArgument = process.argv.indexOf("--max")
  const maxLines = maxArgument >= 0 ? Number(process.argv[maxArgument + 1]) : 80
  const { long, read } = longFunctions(maxLines, skipped)
  for (const f of long) {
    console.log(`${`${f.file}:${f.line}`.padEnd(44)} ${String(f.lines).padStart(4)}  ${f.name || "(anonymous)"}`)
  }
  console.log(`${long.length} functions over ${maxLines} lines (of ${read}; skipped: ${skipped.join(", ")})`)
  process.exitCode = long.length > 0 ? 1 : 0
}
