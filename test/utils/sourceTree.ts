/**
 * Reading the source tree for the structure tests (`test/Layering.test.ts`, `test/Structure.test.ts`): the layered
 * folders, their source files and the import specifiers of a source text.
 */
import { readdirSync, statSync } from "node:fs"
import { join } from "node:path"

/** The layers, left to right: a module may import from its own layer and layers to its left. */
export const layers = ["src", "actors", "environments", "examples", "cli"] as const

/** Every source file (`.ts`, `.mts`, `.js`, `.mjs`) under `dir`, recursively, skipping `node_modules`. */
export const sourceFiles = (dir: string): Array<string> => {
  let entries: Array<string>
  try {
    entries = readdirSync(dir)
  } catch {
    return []
  }
  return entries.sort().flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return name === "node_modules" ? [] : sourceFiles(path)
    return /\.(ts|mts|js|mjs)$/.test(name) ? [path] : []
  })
}

/** Every static and dynamic import / re-export specifier in a source text, `import type` included. */
export const importSpecifiers = (source: string): Array<string> => {
  const found: Array<string> = []
  const patterns = [
    /\b(?:import|export)\s[^'"`;]*?\bfrom\s*["']([^"']+)["']/g,
    /\bimport\s*["']([^"']+)["']/g,
    /\bimport\s*\(\s*["']([^"']+)["']\s*\)/g,
    /\brequire\s*\(\s*["']([^"']+)["']\s*\)/g
  ]
  for (const pattern of patterns) for (const m of source.matchAll(pattern)) found.push(m[1]!)
  return found
}
