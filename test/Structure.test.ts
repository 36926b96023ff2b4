/**
 * The shape of the code beside its layering (`test/Layering.test.ts`): no import circle among the modules of the
 * layered folders (`import type` counts: a circle of types is still two modules that cannot be read apart), and no
 * file under `actors/` longer than {@link maxActorLines} lines, no function over 80 lines outside the model-graph
 * builders (`scripts/function-lengths.ts` lists them).
 */
import { assert, describe, it } from "@effect/vitest"
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { longFunctions } from "../scripts/function-lengths.ts"
import { importSpecifiers, layers, sourceFiles } from "./utils/sourceTree.ts"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..")

/** The longest a file under `actors/` may be. */
const maxActorLines = 700

/** Each module of the layered folders (relative to `root`) and the modules of those folders it imports. */
const importGraph = (root: string): Map<string, Array<string>> => {
  const files = layers.flatMap((layer) => sourceFiles(join(root, layer)))
  const known = new Set(files)
  // A `.js` specifier may name a `.ts` file (TypeScript's NodeNext convention).
  const target = (path: string) => [path, path.replace(/\.js$/, ".ts"), path.replace(/\.mjs$/, ".mts")]
    .find((p) => known.has(p))
  return new Map(files.map((file) => {
    const imported = importSpecifiers(readFileSync(file, "utf8"))
      .filter((spec) => spec.startsWith("."))
      .flatMap((spec) => {
        const path = target(resolve(dirname(file), spec))
        return path === undefined ? [] : [relative(root, path)]
      })
    return [relative(root, file), [...new Set(imported)].sort()]
  }))
}

/** The strongly connected components of `graph` that hold a circle (Tarjan's algorithm, iterative). */
const circularComponents = (graph: ReadonlyMap<string, ReadonlyArray<string>>): Array<Array<string>> => {
  const index = new Map<string, number>(), low = new Map<string, number>()
  const stack: Array<string> = [], onStack = new Set<string>(), found: Array<Array<string>> = []
  for (const start of graph.keys()) {
    if (index.has(start)) continue
    const frames: Array<{ node: string; next: number }> = [{ node: start, next: 0 }]
    index.set(start, index.size)
    low.set(start, index.get(start)!)
    stack.push(start)
    onStack.add(start)
    while (frames.length > 0) {
      const frame = frames[frames.length - 1]!
      const edges = graph.get(frame.node) ?? []
      if (frame.next < edges.length) {
        const to = edges[frame.next++]!
        if (!index.has(to)) {
          index.set(to, index.size)
          low.set(to, index.get(to)!)
          stack.push(to)
          onStack.add(to)
          frames.push({ node: to, next: 0 })
        } else if (onStack.has(to)) low.set(frame.node, Math.min(low.get(frame.node)!, index.get(to)!))
        continue
      }
      frames.pop()
      const parent = frames[frames.length - 1]
      if (parent !== undefined) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!))
      if (low.get(frame.node) !== index.get(frame.node)) continue
      const component: Array<string> = []
      let member: string
      do {
        member = stack.pop()!
        onStack.delete(member)
        component.push(member)
      } while (member !== frame.node)
      if (component.length > 1 || edges.includes(frame.node)) found.push(component.sort())
    }
  }
  return found
}

/** The shortest circle through `from` inside `component`, as a path `from → … → from` (breadth first). */
const shortestCircle = (
  graph: ReadonlyMap<string, ReadonlyArray<string>>,
  component: ReadonlySet<string>,
  from: string
): Array<string> => {
  const previous = new Map<string, string>()
  const queue = [from]
  for (let i = 0; i < queue.length; i++) {
    const node = queue[i]!
    for (const to of graph.get(node) ?? []) {
      if (!component.has(to)) continue
      if (to === from) {
        const path = [node]
        while (path[0] !== from) path.unshift(previous.get(path[0]!)!)
        return [...path, from]
      }
      if (previous.has(to)) continue
      previous.set(to, node)
      queue.push(to)
    }
  }
  return [from]
}

/**
 * One circle per knot of mutually importing modules, written `A → B → A` and starting at the knot's first module
 * by name. A knot with several circles shows one: breaking it shows the next.
 */
const importCircles = (root: string): Array<string> => {
  const graph = importGraph(root)
  return circularComponents(graph)
    .map((component) => shortestCircle(graph, new Set(component), component[0]!).join(" → "))
    .sort()
}

/** Every file under `dir` (relative to `root`) longer than `max` lines, with its length. */
const longFiles = (root: string, dir: string, max: number): Array<string> =>
  sourceFiles(join(root, dir)).flatMap((file) => {
    const lines = readFileSync(file, "utf8").split("\n").length - 1
    return lines > max ? [`${relative(root, file)}: ${lines} lines`] : []
  })

describe("structure", () => {
  it("no import circle among the modules of src, actors, environments, examples and cli", () => {
    assert.deepStrictEqual(importCircles(root), [])
  })

  it("no function over 80 lines outside the model-graph builders (scripts/function-lengths.ts)", () => {
    const { long, read } = longFunctions(80)
    assert.isAbove(read, 1000, "the functions were read")
    assert.deepStrictEqual(long.map((f) => `${f.file}:${f.line} ${f.name}: ${f.lines} lines`), [])
  })

  it("the function count can fail: at 20 lines it finds some", () => {
    assert.isAbove(longFunctions(20).long.length, 0, "some function of the code is over 20 lines")
  })

  it(`no file under actors/ is over ${maxActorLines} lines`, () => {
    assert.deepStrictEqual(longFiles(root, "actors", maxActorLines), [])
  })

  it("finds each circle, type imports and subfolders included, and only circles", () => {
    const tmp = mkdtempSync(join(tmpdir(), "structure-"))
    for (const dir of ["src", "actors/internal", "cli"]) mkdirSync(join(tmp, dir), { recursive: true })
    const write = (path: string, text: string) => writeFileSync(join(tmp, path), text)
    // A → B → C → A, the last step by a type import from a subfolder.
    write("actors/A.ts", `import { b } from "./B.ts"\nexport const a = b\n`)
    write("actors/B.ts", `import { c } from "./internal/C.ts"\nexport const b = c\n`)
    write("actors/internal/C.ts", `import type { A } from "../A.ts"\nexport const c = 1\n`)
    // A module that imports itself, and one that only imports others (no circle).
    write("src/Self.ts", `export * from "./Self.ts"\n`)
    write("src/D.ts", `import { a } from "../actors/A.ts"\nimport { e } from "./E.ts"\nexport const d = a + e\n`)
    write("src/E.ts", `export const e = 1\n`)
    // Two circles through one module: the shorter is shown.
    write("cli/X.ts", `import "./Y.ts"\nimport "./Z.ts"\n`)
    write("cli/Y.ts", `import "./Z.ts"\n`)
    write("cli/Z.ts", `const x = await import("./X.ts")\n`)
    assert.deepStrictEqual(importCircles(tmp), [
      "actors/A.ts → actors/B.ts → actors/internal/C.ts → actors/A.ts",
      "cli/X.ts → cli/Z.ts → cli/X.ts",
      "src/Self.ts → src/Self.ts"
    ])
  })

  it("finds the long files in subfolders too, and no others", () => {
    const tmp = mkdtempSync(join(tmpdir(), "structure-"))
    mkdirSync(join(tmp, "actors/internal"), { recursive: true })
    writeFileSync(join(tmp, "actors/Short.ts"), "x\n".repeat(700))
    writeFileSync(join(tmp, "actors/internal/Long.ts"), "x\n".repeat(701))
    assert.deepStrictEqual(longFiles(tmp, "actors", 700), ["actors/internal/Long.ts: 701 lines"])
  })
})
