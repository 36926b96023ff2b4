/**
 * The docs cannot rot: every TypeScript block of README.md and docs/ type-checks against the code, every `agentfly`
 * command in a shell block names a subcommand and flags the CLI has, every `npm run` script and example file a
 * command runs exists, every relative link resolves, the transcripts marked `<!-- check: run -->` print what they
 * show, and the configuration reference is what the config Schema generates.
 */
import { spawnSync } from "node:child_process"
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { basename, join, relative } from "node:path"
import { describe, expect, it } from "vitest"
import * as ConfigReference from "../../scripts/config-reference.ts"
import { cli } from "../utils/agentfly.ts"
import * as Docs from "./docsCheck.ts"

const all = Docs.pages().flatMap(Docs.blocks)
const shell = all.filter((b) => b.lang === "sh" || b.lang === "bash")
const where = (b: Docs.Block) => `${relative(Docs.root, b.page)}:${b.line}`

describe("docs", () => {
  it("the configuration reference is what the config Schema generates", () => {
    expect(readFileSync(ConfigReference.page, "utf8")).toBe(ConfigReference.render())
  })

  it("every relative link resolves to a file and heading", () => {
    const broken = Docs.pages().flatMap((page) =>
      Docs.links(page).flatMap(({ line, target }) => {
        const why = Docs.brokenLink(page, target)
        return why === undefined ? [] : [`${relative(Docs.root, page)}:${line}: ${why}`]
      })
    )
    expect(broken).toEqual([])
  })

  it("every TypeScript block type-checks against the code", () => {
    const typescript = all.filter((b) => b.lang === "ts" || b.lang === "typescript")
    expect(typescript.length).toBeGreaterThan(10)
    // Blocks that show a file of the repository are that file, or an excerpt of it.
    const stale = typescript.flatMap((b) => {
      const shown = Docs.shownFile(b)
      const why = shown === undefined ? undefined : Docs.differsFromFile(b, shown)
      return why === undefined ? [] : [`${where(b)}: ${why}`]
    })
    expect(stale).toEqual([])
    const ts = typescript.filter((b) => Docs.shownFile(b) === undefined)
    const dir = join(Docs.root, ".tmp", "docs-check")
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir, { recursive: true })
    const files = new Map<string, Docs.Block>()
    for (const b of ts) {
      // A block that opens with `// NAME.ts` is that module (others import it by name: `./my-task.ts`).
      const named = /^\/\/ ([\w-]+\.ts)\n/.exec(b.code)?.[1]
      const name = named ?? `${basename(b.page, ".md")}-${b.line}.ts`
      files.set(name, b)
      writeFileSync(join(dir, name), Docs.moduleOf(b, dir))
    }
    writeFileSync(
      join(dir, "tsconfig.json"),
      JSON.stringify({
        extends: "../../tsconfig.json",
        // Docs show values without always using them.
        compilerOptions: { noUnusedLocals: false, noUnusedParameters: false },
        include: ["*.ts"]
      })
    )
    const tsc = spawnSync(join(Docs.root, "node_modules/.bin/tsc"), ["-p", join(dir, "tsconfig.json")], {
      encoding: "utf8"
    })
    // Errors named by the page and line of the block they are in.
    const errors = `${tsc.stdout}${tsc.stderr}`.split("\n").filter((l) => l.trim() !== "").map((l) => {
      const m = /([\w.-]+\.ts)\((\d+),\d+\): (.*)$/.exec(l)
      const b = m === null ? undefined : files.get(m[1]!)
      return b === undefined ? l : `${where(b)} (module line ${m![2]}): ${m![3]}`
    })
    expect(errors).toEqual([])
    expect(tsc.status).toBe(0)
  }, 600_000)

  it("every agentfly command names a subcommand and flags the CLI has", () => {
    const calls = shell.flatMap((b) =>
      Docs.commands(b.code).flatMap((c) => {
        const call = Docs.cliCall(c.words)
        return call === undefined ? [] : [{ block: b, call, text: c.text }]
      })
    )
    expect(calls.length).toBeGreaterThan(20)
    const help = new Map<string, string>()
    const problems: Array<string> = []
    for (const { block, call, text } of calls) {
      if (!help.has(call.subcommand)) {
        // The compiled CLI: the same commands and flags as the sources', without tsx's start-up a subcommand.
        const r = spawnSync(process.execPath, [cli, call.subcommand, "--help"], {
          encoding: "utf8",
          cwd: Docs.root
        })
        help.set(call.subcommand, r.status === 0 ? r.stdout : "")
      }
      const text_ = help.get(call.subcommand)!
      if (text_ === "") problems.push(`${where(block)}: \`${text}\`: no subcommand ${call.subcommand}`)
      for (const flag of call.flags) {
        if (flag === "--help") continue
        if (!new RegExp(`${flag}\\b`).test(text_)) {
          problems.push(`${where(block)}: \`${text}\`: agentfly ${call.subcommand} has no ${flag}`)
        }
      }
    }
    expect(problems).toEqual([])
  }, 600_000)

  it("every npm script and example file a command runs exists", () => {
    const scripts = JSON.parse(readFileSync(join(Docs.root, "package.json"), "utf8")).scripts as Record<string, string>
    const problems: Array<string> = []
    for (const b of shell) {
      for (const { words, text } of Docs.commands(b.code)) {
        if (words[0] === "npm" && words[1] === "run" && !(words[2]! in scripts)) {
          problems.push(`${where(b)}: \`${text}\`: no npm script ${words[2]}`)
        }
        const file = words[0] === "npx" && words[1] === "tsx" ? words[2] : undefined
        // Files of this repository (a user's own, such as lock/generate.ts or examples/my-agent, are theirs to write).
        if (file !== undefined && /^(examples|scripts|bench)\//.test(file) && !/^examples\/my-/.test(file)) {
          const r = spawnSync("test", ["-f", join(Docs.root, file)])
          if (r.status !== 0) problems.push(`${where(b)}: \`${text}\`: no file ${file}`)
        }
      }
    }
    expect(problems).toEqual([])
  })

  it("the transcripts marked to run print what they show", () => {
    const runs = shell.filter((b) => /<!-- check: run -->/.test(readFileSync(b.page, "utf8").split("\n")
      .slice(Math.max(0, b.line - 3), b.line - 1).join("\n")))
    expect(runs.length).toBeGreaterThan(0)
    for (const b of runs) {
      // The output the block shows: its lines but the `$` commands and their `\\` continuations.
      const shown: Array<string> = []
      let continued = false
      for (const l of b.code.split("\n")) {
        if (l.startsWith("$ ") || continued) continued = l.endsWith("\\")
        else shown.push(l)
      }
      let output = ""
      for (const c of Docs.commands(b.code)) {
        const cmd = c.text.replace(/^npx agentfly\b/, "./bin/agentfly.mjs")
        const r = spawnSync("bash", ["-c", cmd], { encoding: "utf8", cwd: Docs.root, timeout: 300_000 })
        expect(r.status, `${where(b)}: \`${c.text}\`: ${r.stderr}`).toBe(0)
        output += r.stdout
      }
      const got = output.split("\n").map((l) => l.trimEnd())
      // Every output line shown in full (a line with "…" is trimmed in the docs) is printed.
      const missing = shown.filter((l) => l.trim() !== "" && !l.includes("…")).filter((l) => !got.includes(l.trimEnd()))
      expect(missing, where(b)).toEqual([])
    }
  }, 600_000)
})
