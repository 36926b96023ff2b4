/**
 * JSON reading for model output: a safe strict parse, a scanner that finds where one JSON value ends, and a
 * tolerant parser that repairs near-JSON (single quotes, bare keys, trailing commas, Python literals, comments,
 * missing commas, truncation). All functions are total: they return `undefined` instead of throwing.
 */

// The one place model output meets exceptions: `JSON.parse` and the reader below throw on bad input, and a
// try/catch here keeps every caller total.

/** `JSON.parse` without exceptions; `undefined` when the text is not JSON. */
export const parseStrict = (text: string): { readonly value: unknown } | undefined => {
  try {
    return { value: JSON.parse(text) }
  } catch {
    return undefined
  }
}

/**
 * Index just past the JSON object or array that starts at `start` (brackets matched outside strings), or -1 when
 * it is not closed before the end of the text.
 */
export const scanValueEnd = (text: string, start: number): number => {
  let depth = 0
  let inString = false
  for (let i = start; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 92) i++ // backslash: skip the escaped character
      else if (c === 34) inString = false
    } else if (c === 34) inString = true
    else if (c === 123 || c === 91) depth++
    else if (c === 125 || c === 93) {
      depth--
      if (depth === 0) return i + 1
      if (depth < 0) return -1
    }
  }
  return -1
}

const maxDepth = 256

/** A tolerant recursive-descent reader; `fail` unwinds on input it cannot make sense of. */
class Reader {
  pos = 0
  readonly text: string
  constructor(text: string) {
    this.text = text
  }

  skip(): void {
    const t = this.text
    while (this.pos < t.length) {
      const c = t[this.pos]!
      if (c === " " || c === "\t" || c === "\n" || c === "\r") this.pos++
      else if (c === "/" && t[this.pos + 1] === "/") {
        const end = t.indexOf("\n", this.pos)
        this.pos = end === -1 ? t.length : end
      } else if (c === "/" && t[this.pos + 1] === "*") {
        const end = t.indexOf("*/", this.pos + 2)
        this.pos = end === -1 ? t.length : end + 2
      } else return
    }
  }

  value(depth: number): unknown {
    if (depth > maxDepth) throw new Error("too deep")
    this.skip()
    const c = this.text[this.pos]
    if (c === undefined) throw new Error("end of input")
    if (c === "{") return this.object(depth)
    if (c === "[") return this.array(depth)
    if (c === "\"" || c === "'") return this.string()
    if (c === "-" || c === "+" || c === "." || (c >= "0" && c <= "9")) return this.number()
    const word = this.word()
    switch (word) {
      case "true":
      case "True":
        return true
      case "false":
      case "False":
        return false
      case "null":
      case "None":
      case "undefined":
        return null
      default:
        throw new Error(`unexpected ${JSON.stringify(word || c)}`)
    }
  }

  word(): string {
    const start = this.pos
    while (this.pos < this.text.length && /[A-Za-z0-9_$]/.test(this.text[this.pos]!)) this.pos++
    return this.text.slice(start, this.pos)
  }

  number(): number {
    const m = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?/.exec(this.text.slice(this.pos, this.pos + 64))
    if (m === null) throw new Error("bad number")
    this.pos += m[0].length
    return Number(m[0])
  }

  string(): string {
    const quote = this.text[this.pos]!
    this.pos++
    let out = ""
    while (this.pos < this.text.length) {
      const c = this.text[this.pos]!
      if (c === quote) {
        this.pos++
        return out
      }
      if (c === "\\") {
        const e = this.text[this.pos + 1]
        this.pos += 2
        if (e === undefined) return out
        if (e === "n") out += "\n"
        else if (e === "t") out += "\t"
        else if (e === "r") out += "\r"
        else if (e === "b") out += "\b"
        else if (e === "f") out += "\f"
        else if (e === "u" && /^[0-9a-fA-F]{4}$/.test(this.text.slice(this.pos, this.pos + 4))) {
          out += String.fromCharCode(parseInt(this.text.slice(this.pos, this.pos + 4), 16))
          this.pos += 4
        } else out += e
      } else {
        out += c
        this.pos++
      }
    }
    return out // truncated: close the string
  }

  key(): string {
    this.skip()
    const c = this.text[this.pos]
    if (c === "\"" || c === "'") return this.string()
    const word = this.word()
    if (word.length === 0) throw new Error("expected a key")
    return word
  }

  object(depth: number): Record<string, unknown> {
    this.pos++
    const out: Record<string, unknown> = {}
    for (;;) {
      this.skip()
      const c = this.text[this.pos]
      if (c === undefined) return out // truncated: close the object
      if (c === "}") {
        this.pos++
        return out
      }
      if (c === ",") {
        this.pos++
        continue
      }
      const key = this.key()
      this.skip()
      if (this.text[this.pos] === ":" || this.text[this.pos] === "=") this.pos++
      else throw new Error("expected ':'")
      this.skip()
      if (this.pos >= this.text.length) return out
      // defineProperty: a "__proto__" key from the model must stay a plain key, not set the prototype
      const value = this.value(depth + 1)
      Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true })
    }
  }

  array(depth: number): Array<unknown> {
    this.pos++
    const out: Array<unknown> = []
    for (;;) {
      this.skip()
      const c = this.text[this.pos]
      if (c === undefined) return out
      if (c === "]") {
        this.pos++
        return out
      }
      if (c === ",") {
        this.pos++
        continue
      }
      out.push(this.value(depth + 1))
    }
  }
}

/** Strips a Markdown code fence around a JSON payload. */
const unfence = (text: string): string => {
  const m = /^\s*```[A-Za-z0-9_-]*\s*\n([\s\S]*?)\n?\s*```\s*$/.exec(text)
  return m === null ? text : m[1]!
}

/**
 * Parses JSON, repairing near-JSON when a strict parse fails. Text after the first complete value is ignored.
 * Returns `undefined` when nothing sensible can be read.
 */
export const parseLenient = (text: string): { readonly value: unknown; readonly repaired: boolean } | undefined => {
  const strict = parseStrict(text)
  if (strict !== undefined) return { value: strict.value, repaired: false }
  const reader = new Reader(unfence(text))
  try {
    const value = reader.value(0)
    return { value, repaired: true }
  } catch {
    return undefined
  }
}
