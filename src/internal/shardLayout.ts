/**
 * The file-level pieces of safetensors checkpoints that know nothing of tensors' meaning: the header's bytes, how
 * tensors split into Hugging Face shards and what the shards are called, and paths joined without a `Path` service
 * (so readers need only a `FileSystem`; POSIX and Windows both take "/").
 */

/** `dir/name`. */
export const join = (dir: string, name: string) => (dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`)

const lastSeparator = (file: string) => Math.max(file.lastIndexOf("/"), file.lastIndexOf("\\"))

/** The folder of `file` ("." when it has none). */
export const dirname = (file: string) => {
  const at = lastSeparator(file)
  return at < 0 ? "." : at === 0 ? "/" : file.slice(0, at)
}

/** The last segment of `file`. */
export const basename = (file: string) => file.slice(lastSeparator(file) + 1)

/**
 * The 8-byte length and the JSON header, padded with spaces to a multiple of 8 bytes as the reference
 * implementation pads it, of tensors laid out in order (`bytes`: each one's data size); `dataBytes` in all.
 */
export const encodeHeader = (
  tensors: ReadonlyArray<{ readonly name: string; readonly shape: ReadonlyArray<number>; readonly dtype: string }>,
  bytes: ReadonlyArray<number>,
  metadata: Readonly<Record<string, string>> | undefined
) => {
  const header: Record<string, unknown> = metadata === undefined ? {} : { __metadata__: metadata }
  let offset = 0
  tensors.forEach((t, i) => {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes[i]!] }
    offset += bytes[i]!
  })
  const json = new TextEncoder().encode(JSON.stringify(header))
  const padded = Math.ceil(json.length / 8) * 8
  const prefix = new Uint8Array(8 + padded).fill(0x20)
  new DataView(prefix.buffer).setBigUint64(0, BigInt(padded), true)
  prefix.set(json, 8)
  return { prefix, dataBytes: offset }
}

/** Splits tensors, in order, into shards of at most `max` data bytes (a bigger tensor gets a shard of its own). */
export const planShards = (sizes: ReadonlyArray<number>, max: number): Array<Array<number>> => {
  const shards: Array<Array<number>> = []
  let current: Array<number> = [], bytes = 0
  sizes.forEach((size, i) => {
    if (current.length > 0 && bytes + size > max) {
      shards.push(current)
      current = [], bytes = 0
    }
    current.push(i)
    bytes += size
  })
  if (current.length > 0 || shards.length === 0) shards.push(current)
  return shards
}

/** The file names of `count` shards: `<prefix>.safetensors` alone, else `<prefix>-0000K-of-0000N.safetensors`. */
export const shardNames = (prefix: string, count: number): Array<string> => {
  const pad = (n: number) => String(n).padStart(5, "0")
  return count === 1
    ? [`${prefix}.safetensors`]
    : Array.from({ length: count }, (_, i) => `${prefix}-${pad(i + 1)}-of-${pad(count)}.safetensors`)
}

/** Whether `name` is a tensor file of `prefix` (its single file or one of its shards, of any count). */
export const isTensorFile = (prefix: string, name: string): boolean =>
  name === `${prefix}.safetensors` ||
  (name.startsWith(`${prefix}-`) && /^-\d{5}-of-\d{5}\.safetensors$/.test(name.slice(prefix.length)))
