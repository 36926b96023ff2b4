/**
 * Telling a full disk from other write failures. Node reports it as `ENOSPC` (or `EDQUOT` past a quota) on the
 * error's `code`; Effect's `FileSystem` wraps that error as the `cause` of a `PlatformError` tagged `Unknown`, whose
 * message ("Unknown: FileSystem.writeAll (28)") does not say it, and errors built from it further up often keep
 * only that message. So a failure is a full disk when its cause chain holds such a code or it already says so (a
 * `DiskFull` reason, an `ENOSPC` message); {@link annotate} makes a `FileSystem` whose write errors say it in their
 * message, for code that keeps only messages.
 */
import { Effect, FileSystem, PlatformError } from "effect"

const codes = new Set(["ENOSPC", "EDQUOT"])

/** Whether `e` (or anything in its `cause` / `reason` chain) is a full disk. */
export const isDiskFull = (e: unknown, depth = 0): boolean => {
  if (typeof e !== "object" || e === null || depth > 6) return false
  const u = e as { code?: unknown; reason?: unknown; message?: unknown; cause?: unknown }
  if (typeof u.code === "string" && codes.has(u.code)) return true
  if (u.reason === "DiskFull" || (u as { _tag?: unknown })._tag === "DiskFull") return true
  if (typeof u.message === "string" && /\bENOSPC\b|\bEDQUOT\b|no space left on device/.test(u.message)) return true
  return isDiskFull(u.cause, depth + 1) || (typeof u.reason === "object" && isDiskFull(u.reason, depth + 1))
}

/** The start of every disk-full message, so that a layer that keeps only the message still tells it apart. */
export const marker = "disk full (ENOSPC)"

const said = (e: PlatformError.PlatformError): PlatformError.PlatformError => {
  const reason = e.reason
  if (reason._tag === "BadArgument" || !isDiskFull(e)) return e
  return PlatformError.systemError({
    _tag: reason._tag,
    module: reason.module,
    method: reason.method,
    syscall: reason.syscall,
    pathOrDescriptor: reason.pathOrDescriptor,
    description: "ENOSPC: no space left on device",
    cause: reason.cause
  })
}

const sayIt = <A, R>(effect: Effect.Effect<A, PlatformError.PlatformError, R>) => Effect.mapError(effect, said)

/**
 * `fs` with the messages of its write errors saying `ENOSPC` when the disk is full (`writeFile`, `writeFileString`
 * and an opened file's `write`, `writeAll`, `truncate`, `sync`).
 */
export const annotate = (fs: FileSystem.FileSystem): FileSystem.FileSystem =>
  Object.assign(Object.create(fs) as FileSystem.FileSystem, {
    writeFile: (...args: Parameters<FileSystem.FileSystem["writeFile"]>) => sayIt(fs.writeFile(...args)),
    writeFileString: (...args: Parameters<FileSystem.FileSystem["writeFileString"]>) =>
      sayIt(fs.writeFileString(...args)),
    open: (...args: Parameters<FileSystem.FileSystem["open"]>) =>
      Effect.map(sayIt(fs.open(...args)), (file) =>
        // `sync` is a getter on Node's file class: the overrides are properties of an object inheriting the file.
        Object.create(file, {
          write: { value: (buffer: Uint8Array) => sayIt(file.write(buffer)) },
          writeAll: { value: (buffer: Uint8Array) => sayIt(file.writeAll(buffer)) },
          truncate: { value: (length?: number) => sayIt(file.truncate(length)) },
          sync: { get: () => sayIt(file.sync) }
        }) as FileSystem.File)
  })
