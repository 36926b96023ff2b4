/**
 * What `Docs.test.ts` reads of the docs: their code blocks, links and shell commands, as plain functions over the
 * Markdown text.
 *
 * A TypeScript block is checked as a module of its own. Its relative imports of this repository's folders are
 * pointed at the checkout (a block written for `examples/my-agent/task.ts` imports `../../src/AgentTask.ts`), and
 * the package's own name (`agentfly-ts`, `agentfly-ts/actors`, …) at the sources its `exports` map builds. A block that shows a fragment of a larger program says so in an
 * HTML comment just above it, `<!-- check: fragment NAME -->`: `test/docs/fragments/NAME.ts` declares the names it
 * uses, and a fragment that `yield*`s runs inside `Effect.gen`.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"

export const root = resolve(import.meta.dirname, "../..")

/** README.md and every page of docs/. */
export const pages = (): Array<string> => [
  join(root, "README.md"),
  ...readdirSync(join(root, "docs")).filter((f) => f.endsWith(".md")).sort().map((f) => join(root, "docs", f))
]

export interface Block {
  readonly page: string
  /** 1-based line of the opening fence. */
  readonly line: number
  readonly lang: string
  readonly code: string
  /** The `NAME` of a `<!-- check: fragment NAME -->` comment on the lines just above the fence. */
  readonly fragment: string | undefined
}

/** The fenced code blocks of a page. */
export const blocks = (page: string): Array<Block> => {
  const lines = readFileSync(page, "utf8").split("\n")
  const out: Array<Block> = []
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)\s*$/.exec(lines[i]!)
    if (open === null) continue
    let j = i + 1
    while (j < lines.length && !/^```\s*$/.test(lines[j]!)) j++
    const above = lines.slice(Math.max(0, i - 2), i).join("\n")
    const fragment = /<!-- check: fragment (\S+) -->/.exec(above)?.[1]
    out.push({ page, line: i + 1, lang: open[1]!, code: lines.slice(i + 1, j).join("\n"), fragment })
    i = j
  }
  return out
}

const repoFolders = /^(?:\.\.?\/)+((?:src|actors|environments|examples|cli|test|bench|scripts)\/.*)$/

const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as {
  readonly name: string
  readonly exports: Readonly<Record<string, { readonly default: string } | null>>
}

/**
 * The source file the package's `exports` map gives an import of it (`agentfly-ts/actors` → `actors/index.ts`: the
 * built `./dist/actors/index.js` is the compiled `actors/index.ts`), or undefined.
 */
export const packageSource = (spec: string): string | undefined => {
  if (spec !== manifest.name && !spec.startsWith(`${manifest.name}/`)) return undefined
  const sub = `.${spec.slice(manifest.name.length)}`
  for (const [key, target] of Object.entries(manifest.exports)) {
    const [head, tail] = key.split("*") as [string, string | undefined]
    const star = tail === undefined ? (sub === key ? "" : undefined)
      : sub.startsWith(head) && sub.endsWith(tail) ? sub.slice(head.length, sub.length - tail.length) : undefined
    if (star === undefined) continue
    if (target === null) return undefined
    return target.default.replace("*", star).replace(/^\.\/dist\//, "").replace(/\.js$/, ".ts")
  }
  return undefined
}

/** A block's import specifier as the check resolves it (`dir`: where the block's module is written). */
export const specifier = (spec: string, dir: string): string => {
  const fromPackage = packageSource(spec)
  if (fromPackage !== undefined) return relative(dir, join(root, fromPackage))
  const m = repoFolders.exec(spec)
  if (m === null) return spec
  const target = relative(dir, join(root, m[1]!))
  return target.startsWith(".") ? target : `./${target}`
}

/** A TypeScript block as a module written in `dir`: imports pointed at the checkout, a fragment's context added. */
export const moduleOf = (block: Block, dir: string): string => {
  const rewrite = (line: string) =>
    line.replace(/(from\s+|import\s*\()"([^"]+)"/g, (_, head: string, spec: string) => `${head}"${specifier(spec, dir)}"`)
  const lines = block.code.split("\n").map(rewrite)
  if (block.fragment === undefined) return lines.join("\n") + "\n"
  const context = readFileSync(join(root, "test/docs/fragments", `${block.fragment}.ts`), "utf8").split("\n")
    .map(rewrite)
  const imports = lines.filter((l) => /^import\s/.test(l))
  const body = lines.filter((l) => !/^import\s/.test(l))
  // A fragment that `yield*`s outside a generator of its own runs in one.
  const generator = body.some((l) => /\byield\*/.test(l)) && !body.some((l) => /function\*/.test(l))
  return [
    ...context,
    ...imports,
    ...(generator
      ? ["export const program = Effect__.gen(function*() {", ...body, "})"]
      : [...body, "export {}"])
  ].join("\n") + "\n"
}

/**
 * A block that shows a file of this repository opens with `// PATH` (the whole file) or `// from PATH` (an excerpt:
 * its lines appear in the file in that order). Such a block is checked against the file, which the repository's own
 * type-check covers; undefined for any other block.
 */
export const shownFile = (block: Block): { readonly path: string; readonly excerpt: boolean } | undefined => {
  const m = /^\/\/ (from )?((?:src|actors|environments|examples|cli)\/\S+\.ts)\n/.exec(block.code)
  if (m === null || !existsSync(join(root, m[2]!))) return undefined
  return { path: m[2]!, excerpt: m[1] !== undefined }
}

/** Why a block that shows a file differs from it, or undefined. */
export const differsFromFile = (block: Block, shown: { readonly path: string; readonly excerpt: boolean }) => {
  const file = readFileSync(join(root, shown.path), "utf8")
  const body = block.code.split("\n").slice(1)
  if (!shown.excerpt) {
    return file.trimEnd() === body.join("\n").trimEnd() ? undefined : `differs from ${shown.path}`
  }
  // Lines compared without their trailing comments: the docs may explain a line where the file does not.
  const code = (l: string) => l.replace(/\s+\/\/ .*$/, "").trim()
  const fileLines = file.split("\n").map(code)
  let at = 0
  for (const line of body.map(code).filter((l) => l !== "")) {
    const found = fileLines.indexOf(line, at)
    if (found < 0) return `"${line}" is not in ${shown.path} (after line ${at})`
    at = found + 1
  }
  return undefined
}

/** Relative links of a page (`[text](target)`), outside code blocks, with their line. */
export const links = (page: string): Array<{ readonly line: number; readonly target: string }> => {
  const out: Array<{ line: number; target: string }> = []
  let fence = false
  readFileSync(page, "utf8").split("\n").forEach((l, i) => {
    if (/^```/.test(l)) fence = !fence
    if (fence) return
    for (const m of l.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (!/^[a-z]+:/.test(m[1]!)) out.push({ line: i + 1, target: m[1]! })
    }
  })
  return out
}

/** GitHub's anchor of a heading. */
export const slug = (heading: string): string =>
  heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\- _]/gu, "").replace(/ /g, "-")

/** The anchors of a Markdown file's headings. */
export const anchors = (file: string): Set<string> => {
  const out = new Set<string>()
  let fence = false
  for (const l of readFileSync(file, "utf8").split("\n")) {
    if (/^```/.test(l)) fence = !fence
    const h = /^#{1,6} (.*)$/.exec(l)
    if (!fence && h !== null) out.add(slug(h[1]!))
  }
  return out
}

/** Why a link of `page` does not resolve, or undefined. */
export const brokenLink = (page: string, target: string): string | undefined => {
  const [path, anchor] = target.split("#") as [string, string | undefined]
  const file = path === "" ? page : resolve(dirname(page), path)
  if (!existsSync(file)) return `${target}: no such file`
  if (anchor !== undefined && file.endsWith(".md") && !anchors(file).has(anchor)) return `${target}: no such heading`
  return undefined
}

/** A command of a shell block: its words, and the block's line. */
export interface Command {
  readonly words: ReadonlyArray<string>
  readonly text: string
}

/**
 * The commands of a shell block. In a transcript (lines starting `$ `) the `$` lines, with their `\` continuations,
 * are the commands and the rest is output; otherwise every line that is not a comment. Each line is cut at `&&`,
 * `;` and `|` and at a trailing `# comment`.
 */
export const commands = (code: string): Array<Command> => {
  const raw = code.split("\n")
  const transcript = raw.some((l) => l.startsWith("$ "))
  const joined: Array<string> = []
  for (let i = 0; i < raw.length; i++) {
    let line = raw[i]!
    if (transcript) {
      if (!line.startsWith("$ ")) continue
      line = line.slice(2)
    }
    while (line.endsWith("\\") && i + 1 < raw.length) line = line.slice(0, -1) + " " + raw[++i]!.trim()
    joined.push(line)
  }
  const out: Array<Command> = []
  for (const line of joined) {
    const code = line.replace(/(^|\s)#.*$/, "").trim()
    if (code === "") continue
    for (const part of code.split(/&&|;|\|/)) {
      const text = part.trim()
      if (text === "") continue
      out.push({ text, words: text.match(/'[^']*'|"[^"]*"|\S+/g) ?? [] })
    }
  }
  return out
}

/**
 * The `agentfly` subcommand and flags of a command, when it runs the CLI (`npx agentfly`, `npm run agentfly --`,
 * `./bin/agentfly.mjs`, `agentfly`); undefined otherwise.
 */
export const cliCall = (
  words: ReadonlyArray<string>
): { readonly subcommand: string; readonly flags: ReadonlyArray<string> } | undefined => {
  let rest: ReadonlyArray<string> | undefined
  const w = words.filter((x) => !/^[A-Z_]+=/.test(x)) // environment assignments before the command
  if (w[0] === "npx" && w[1] === "agentfly") rest = w.slice(2)
  else if (w[0] === "npm" && w[1] === "run" && w[2] === "agentfly" && w[3] === "--") rest = w.slice(4)
  else if (w[0] === "agentfly" || w[0] === "./bin/agentfly.mjs" || w[0] === "bin/agentfly.mjs") rest = w.slice(1)
  if (rest === undefined || rest.length === 0) return undefined
  return {
    subcommand: rest[0]!,
    flags: rest.slice(1).filter((x) => x.startsWith("--")).map((x) => x.split("=")[0]!)
  }
}
