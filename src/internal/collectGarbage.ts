/**
 * Freeing onnxruntime-node's output copies as soon as they are read. onnxruntime-node returns a JavaScript copy of
 * every output it fetches, pre-allocated or not (`scripts/ort-output-copy.ts`). A full fine-tuning step's outputs are
 * its gradients, 4 bytes a parameter (1.84 GiB at 0.5 B), and the copies of one step were still resident when the
 * next step's activations came on top (measured with `scripts/learner-memory.ts --marks`): something keeps the
 * latest run's outputs reachable until the next run, so a collection alone frees nothing (tried). Detaching each
 * copy's buffer (moving its memory into a clone nobody references) and then collecting frees them.
 *
 * `collectGarbage` uses `globalThis.gc` where Node exposes it (`--expose-gc`), else turns the flag on and takes `gc`
 * from a fresh context (the flag applies to contexts created afterwards; it changes nothing else).
 *
 * @since 0.1.0
 */
import * as v8 from "node:v8"
import * as vm from "node:vm"

let gc: (() => void) | undefined

/** Collects garbage now (a full, synchronous collection: tens to hundreds of ms when gigabytes are freed). */
export const collectGarbage = (): void => {
  if (gc === undefined) {
    const exposed = (globalThis as { gc?: () => void }).gc
    if (exposed === undefined) v8.setFlagsFromString("--expose-gc")
    gc = exposed ?? (vm.runInNewContext("gc") as () => void)
  }
  gc()
}

/**
 * Frees the memory of `arrays` (outputs already read): their buffers are detached (the arrays read as empty from now
 * on) and garbage is collected. Arrays sharing `keep`'s buffers are left alone.
 */
export const release = (arrays: Iterable<ArrayBufferView>, keep: ReadonlySet<ArrayBufferLike> = new Set()): void => {
  const buffers = new Set<ArrayBuffer>()
  for (const a of arrays) {
    if (a.buffer instanceof ArrayBuffer && !keep.has(a.buffer) && a.buffer.byteLength > 0) buffers.add(a.buffer)
  }
  structuredClone([...buffers], { transfer: [...buffers] })
  collectGarbage()
}

/**
 * Outputs at least this large (bytes) are worth a collection once their copies are garbage: below it V8's own
 * schedule keeps up and a collection per run would only cost time (the embedded presets never reach it).
 */
export const worthCollecting = 256 * 1024 * 1024
