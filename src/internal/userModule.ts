/**
 * Importing a user's own module: a task, a config written as a module, a scaffolded folder's `generate.ts`.
 *
 * From a clone's TypeScript sources, tsx or vitest already runs this process and loads TypeScript. From an installed
 * package's compiled `dist/`, tsx is registered here, the first time a user's module is imported, and not when the
 * command starts: its loader hooks see every module loaded after them, and cost each command ≈ 1.4 s of start-up
 * (≈ 3 s of CPU, this machine) when nothing of the user's is loaded at all. It is registered for a JavaScript module
 * too, which may import TypeScript of its own.
 */

/** Whether this runs from a clone's TypeScript sources (through tsx or vitest), not from compiled JavaScript. */
export const fromSources = import.meta.url.endsWith(".ts")

let typescript: Promise<void> | undefined

/** Registers tsx once, from compiled JavaScript; nothing from the sources. */
const loadTypeScript = (): Promise<void> =>
  fromSources ? Promise.resolve() : (typescript ??= import("tsx/esm/api").then((tsx) => void tsx.register()))

/** Imports the module at an absolute path or `file:` URL, TypeScript or JavaScript. */
export const importUserModule = (path: string): Promise<Record<string, unknown>> =>
  loadTypeScript().then(() => import(path) as Promise<Record<string, unknown>>)
