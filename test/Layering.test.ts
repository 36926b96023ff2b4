/**
 * The one-way dependency rule: src ← actors ← environments ← examples ← cli. A module may import from its own
 * layer and layers to its left, never to its right. Test and bench code may import anything.
 */
import { assert, describe, it } from "@effect/vitest"
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, relative, resolve, sep } from "node:path"
import { fileURLToPath } from "node:url"
import { importSpecifiers, layers, sourceFiles } from "./utils/sourceTree.ts"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..")

const violations = (root: string): Array<string> => {
  const layerOf = (path: string): number => layers.indexOf(relative(root, path).split(sep)[0] as never)
  return layers.flatMap((layer) =>
    sourceFiles(join(root, layer)).flatMap((file) => {
      const own = layerOf(file)
      return importSpecifiers(readFileSync(file, "utf8"))
        .filter((spec) => spec.startsWith("."))
        .flatMap((spec) => {
          const target = resolve(dirname(file), spec)
          const targetLayer = layerOf(target)
          if (targetLayer === -1 && !relative(root, target).startsWith("..")) {
            return [`${relative(root, file)} imports ${spec}, outside the layered folders`]
          }
          return targetLayer > own
            ? [`${relative(root, file)} (${layer}) imports ${spec} (${layers[targetLayer]})`]
            : []
        })
    })
  )
}

describe("layering", () => {
  it("finds import specifiers of every form", () => {
    const source = `import { a } from "./a.ts"\nimport type { B } from "../b.ts"\nexport * from "./c.ts"\n` +
      `import "./d.ts"\nconst e = await import("./e.ts")\nimport {\n  f,\n  g\n} from "./f.ts"`
    assert.deepStrictEqual(importSpecifiers(source).sort(), [
      "../b.ts",
      "./a.ts",
      "./c.ts",
      "./d.ts",
      "./e.ts",
      "./f.ts"
    ])
  })

  it("src ← actors ← environments ← examples ← cli: no import points right", () => {
    assert.deepStrictEqual(violations(root), [])
  })

  it("reports an import that points right", () => {
    const tmp = mkdtempSync(join(tmpdir(), "layering-"))
    mkdirSync(join(tmp, "src"))
    mkdirSync(join(tmp, "actors"))
    writeFileSync(join(tmp, "actors", "A.ts"), `export const a = 1\n`)
    writeFileSync(join(tmp, "src", "B.ts"), `import { a } from "../actors/A.ts"\nexport const b = a\n`)
    writeFileSync(join(tmp, "actors", "C.ts"), `import { b } from "../src/B.ts"\nexport const c = b\n`)
    assert.deepStrictEqual(violations(tmp), ["src/B.ts (src) imports ../actors/A.ts (actors)"])
  })
})
