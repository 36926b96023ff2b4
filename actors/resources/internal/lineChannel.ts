/**
 * Lines to and from a sandbox's main process over its standard input and output, shared by the Docker launcher
 * (an attached container) and the bubblewrap launcher (a child process's pipes).
 */
import type { Readable } from "node:stream"

/**
 * Lines to and from a sandbox's main process over one stream pair (no process per message).
 */
export interface LineChannel {
  readonly send: (line: string) => void
  /** Called with every line the main process writes to stdout. */
  readonly onLine: (f: (line: string) => void) => void
  /** Called once when the stream ends (the sandbox stopped or was killed). */
  readonly onClose: (f: () => void) => void
  readonly isOpen: () => boolean
}

/**
 * A channel reading lines from `output` and writing them with `write`; it closes when `output` ends or fails, or
 * when `closed` is called (by the owner, for its input's end).
 */
export const make = (
  output: Readable,
  write: (text: string) => void
): LineChannel & { readonly closed: () => void } => {
  const lineHandlers: Array<(line: string) => void> = []
  const closeHandlers: Array<() => void> = []
  let open = true
  let buffer = ""
  output.on("data", (chunk: Buffer) => {
    buffer += chunk.toString("utf8")
    let newline = buffer.indexOf("\n")
    while (newline >= 0) {
      const line = buffer.slice(0, newline)
      buffer = buffer.slice(newline + 1)
      for (const f of lineHandlers) f(line)
      newline = buffer.indexOf("\n")
    }
  })
  const closed = () => {
    if (!open) return
    open = false
    for (const f of closeHandlers) f()
  }
  output.on("end", closed)
  output.on("close", closed)
  output.on("error", closed)
  return {
    send: (line) => void (open && write(line + "\n")),
    onLine: (f) => void lineHandlers.push(f),
    onClose: (f) => void closeHandlers.push(f),
    isOpen: () => open,
    closed
  }
}
