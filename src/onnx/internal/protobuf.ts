/**
 * A minimal protobuf writer: enough of the wire format (varints, length-delimited fields, packed repeated
 * scalars, fixed32 floats) to encode ONNX's ModelProto. Messages are kept as lists of chunks and only
 * concatenated once at the end, so large weight tensors are copied a single time.
 *
 * @since 0.1.0
 */

/** An encoded message: chunks in order plus their total length. */
export interface Message {
  readonly chunks: Array<Uint8Array>
  length: number
}

export const message = (): Message => ({ chunks: [], length: 0 })

const push = (m: Message, bytes: Uint8Array): void => {
  m.chunks.push(bytes)
  m.length += bytes.length
}

/** Varint bytes of a non-negative or negative integer (negatives as 10-byte two's complement, as int64). */
export const varint = (n: number | bigint): Uint8Array => {
  let v = BigInt.asUintN(64, BigInt(n))
  const out: Array<number> = []
  do {
    let b = Number(v & 0x7fn)
    v >>= 7n
    if (v !== 0n) b |= 0x80
    out.push(b)
  } while (v !== 0n)
  return Uint8Array.from(out)
}

// Fast path for small non-negative numbers, which are almost all keys, lengths and enum values.
const smallVarint = (n: number): Uint8Array => {
  if (n >= 0 && n < 0x80) return Uint8Array.of(n)
  if (n >= 0 && n < 0x4000) return Uint8Array.of((n & 0x7f) | 0x80, n >>> 7)
  return varint(n)
}

const key = (field: number, wire: 0 | 2 | 5): Uint8Array => smallVarint((field << 3) | wire)

export const int = (m: Message, field: number, n: number | bigint): void => {
  push(m, key(field, 0))
  push(m, typeof n === "number" ? smallVarint(n) : varint(n))
}

export const float = (m: Message, field: number, x: number): void => {
  push(m, key(field, 5))
  const b = new Uint8Array(4)
  new DataView(b.buffer).setFloat32(0, x, true)
  push(m, b)
}

export const bytes = (m: Message, field: number, data: Uint8Array): void => {
  push(m, key(field, 2))
  push(m, smallVarint(data.length))
  if (data.length > 0) push(m, data)
}

const encoder = new TextEncoder()

export const string = (m: Message, field: number, s: string): void => bytes(m, field, encoder.encode(s))

export const nested = (m: Message, field: number, child: Message): void => {
  push(m, key(field, 2))
  push(m, smallVarint(child.length))
  for (const c of child.chunks) m.chunks.push(c)
  m.length += child.length
}

export const packedInts = (m: Message, field: number, values: ReadonlyArray<number | bigint>): void => {
  const parts = values.map((v) => (typeof v === "number" ? smallVarint(v) : varint(v)))
  const body = message()
  for (const p of parts) push(body, p)
  nested(m, field, body)
}

export const packedFloats = (m: Message, field: number, values: ReadonlyArray<number>): void => {
  const b = new Uint8Array(values.length * 4)
  const view = new DataView(b.buffer)
  values.forEach((v, i) => view.setFloat32(i * 4, v, true))
  bytes(m, field, b)
}

export const finish = (m: Message): Uint8Array => {
  const out = new Uint8Array(m.length)
  let offset = 0
  for (const c of m.chunks) {
    out.set(c, offset)
    offset += c.length
  }
  return out
}
