/**
 * The OpenAI wire format both servers share: messages converted from OpenAI's shape (each role, content parts, tool
 * calls whose arguments are JSON strings) and back (tool calls with string arguments), error bodies and their types,
 * `usage`, a sampler's failures as statuses, the request rules as a 400, and JSON bodies read within a limit.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type * as Http from "node:http"
import { PassThrough } from "node:stream"
import * as Wire from "../../../actors/internal/openAiWire.ts"
import { samplerError } from "../../../src/Sampler.ts"

/** The error a `Check` holds, or a failed assertion. */
const refusedBy = <A>(check: Wire.Check<A>): Wire.ApiError => {
  assert.instanceOf(check, Wire.ApiError)
  return check as Wire.ApiError
}

/** A request whose body is `chunks`, with the headers given. */
const request = (chunks: ReadonlyArray<string>, headers: Record<string, string> = {}): Http.IncomingMessage => {
  const stream = new PassThrough()
  Object.assign(stream, { headers })
  queueMicrotask(() => {
    for (const c of chunks) stream.write(c)
    stream.end()
  })
  return stream as unknown as Http.IncomingMessage
}

/** A response that records what was written. */
const response = () => {
  const sent = { status: 0, headers: {} as Record<string, unknown>, body: "", ended: false }
  const res = {
    headersSent: false,
    writableEnded: false,
    writeHead(status: number, headers: Record<string, unknown>) {
      sent.status = status
      sent.headers = headers
      res.headersSent = true
    },
    write(chunk: string) {
      sent.body += chunk
    },
    end(chunk?: string) {
      if (chunk !== undefined) sent.body += chunk
      sent.ended = true
      res.writableEnded = true
    }
  }
  return { res: res as unknown as Http.ServerResponse & typeof res, sent }
}

describe("openAiWire", () => {
  describe("toMessage", () => {
    it("system, developer and user messages keep their text; developer is system", () => {
      assert.deepStrictEqual(Wire.toMessage({ role: "system", content: "Be brief." }, 0), {
        role: "system",
        content: "Be brief."
      })
      assert.deepStrictEqual(Wire.toMessage({ role: "developer", content: "Be brief." }, 0), {
        role: "system",
        content: "Be brief."
      })
      assert.deepStrictEqual(Wire.toMessage({ role: "user", content: "Hi" }, 0), { role: "user", content: "Hi" })
    })

    it("content parts: text and input_text are text parts, image_url is kept; another part is refused, named", () => {
      const content = [
        { type: "text", text: "a" },
        { type: "input_text", text: "b" },
        { type: "image_url", image_url: { url: "data:," } }
      ]
      assert.deepStrictEqual(Wire.toMessage({ role: "user", content }, 0), {
        role: "user",
        content: [{ type: "text", text: "a" }, { type: "text", text: "b" }, {
          type: "image_url",
          image_url: { url: "data:," }
        }]
      })
      const e = refusedBy(Wire.toMessage({ role: "user", content: [{ type: "audio" }] }, 2))
      assert.strictEqual(e.status, 400)
      assert.strictEqual(e.message, "messages[2].content[0] is not a text or image_url part")
      assert.strictEqual(e.param, "messages[2].content[0]")
    })

    it("assistant tool calls: JSON arguments parsed, a string that is not JSON kept; null content is empty", () => {
      const raw = {
        role: "assistant",
        content: null,
        tool_calls: [
          { id: "c0", type: "function", function: { name: "calc", arguments: "{\"x\":1}" } },
          { id: "c1", type: "function", function: { name: "calc", arguments: "{not json" } }
        ],
        reasoning_content: "think"
      }
      assert.deepStrictEqual(Wire.toMessage(raw, 1), {
        role: "assistant",
        content: "",
        tool_calls: [
          { id: "c0", type: "function", function: { name: "calc", arguments: { x: 1 } } },
          { id: "c1", type: "function", function: { name: "calc", arguments: "{not json" } }
        ],
        reasoning_content: "think"
      })
      const e = refusedBy(Wire.toMessage({ role: "assistant", tool_calls: [{ id: 3 }] }, 1))
      assert.strictEqual(e.param, "messages[1].tool_calls[0]")
    })

    it("a tool message needs its call id; its name is kept", () => {
      assert.deepStrictEqual(Wire.toMessage({ role: "tool", tool_call_id: "c0", content: "2", name: "calc" }, 3), {
        role: "tool",
        content: "2",
        tool_call_id: "c0",
        name: "calc"
      })
      const e = refusedBy(Wire.toMessage({ role: "tool", content: "2" }, 3))
      assert.strictEqual(e.message, "messages[3].tool_call_id must be a string")
      assert.strictEqual(e.param, "messages[3].tool_call_id")
    })

    it("an unknown role, a message that is not an object, a user message without content: a 400 naming it", () => {
      assert.strictEqual(refusedBy(Wire.toMessage({ role: "wizard", content: "x" }, 4)).param, "messages[4].role")
      assert.strictEqual(refusedBy(Wire.toMessage("hi", 0)).message, "messages[0] must be an object")
      assert.strictEqual(refusedBy(Wire.toMessage({ role: "user" }, 0)).message, "messages[0].content is required")
    })
  })

  it("toTools keeps a function's name, description and parameters (dropping `strict`), and names a bad entry", () => {
    const tools = Wire.toTools([{
      type: "function",
      function: { name: "calc", description: "d", parameters: { type: "object" }, strict: true }
    }])
    assert.deepStrictEqual(tools, [{
      type: "function",
      function: { name: "calc", description: "d", parameters: { type: "object" } }
    }])
    assert.deepStrictEqual(Wire.toTools(undefined), [])
    assert.strictEqual(refusedBy(Wire.toTools([{ type: "function", function: {} }])).param, "tools[0]")
    assert.strictEqual(refusedBy(Wire.toTools({})).message, "tools must be a list")
  })

  it("toolCalls writes arguments as JSON text (a string as it is), each call with its index", () => {
    const calls = Wire.toolCalls([
      { id: "a", type: "function", function: { name: "calc", arguments: { x: 1 } } },
      { id: "b", type: "function", function: { name: "calc", arguments: "{bad" } }
    ])
    assert.deepStrictEqual(calls, [
      { index: 0, id: "a", type: "function", function: { name: "calc", arguments: "{\"x\":1}" } },
      { index: 1, id: "b", type: "function", function: { name: "calc", arguments: "{bad" } }
    ])
  })

  it("a message converted to OpenAI's tool calls and back is the same message", () => {
    const message = {
      role: "assistant" as const,
      content: "",
      tool_calls: [{ id: "a", type: "function" as const, function: { name: "calc", arguments: { x: [1, 2] } } }]
    }
    const wire = { role: "assistant", content: null, tool_calls: Wire.toolCalls(message.tool_calls) }
    assert.deepStrictEqual(Wire.toMessage(wire, 0), message)
  })

  it("errorBody: a 4xx is an invalid_request_error (404 too, as OpenAI's), a 5xx a server_error", () => {
    assert.deepStrictEqual(Wire.errorBody(Wire.invalid("bad", "n", "x")), {
      error: { message: "bad", type: "invalid_request_error", param: "n", code: "x" }
    })
    assert.deepStrictEqual(Wire.errorBody(Wire.notFound("no route GET /x")), {
      error: { message: "no route GET /x", type: "invalid_request_error", param: null, code: null }
    })
    assert.strictEqual(Wire.errorBody(Wire.internalError("boom")).error.type, "server_error")
    assert.strictEqual(Wire.errorBody(Wire.internalError("boom")).error.message, "internal error: boom")
    const notAllowed = Wire.notAllowed("GET", "/v1/completions", "POST")
    assert.strictEqual(notAllowed.message, "GET is not allowed on /v1/completions; use POST")
  })

  it("usage adds the prompt's and the completion's tokens", () => {
    assert.deepStrictEqual(Wire.usage(7, 5), { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 })
  })

  it("a sampler's failure: 400 refused, 429 overloaded, 503 closed, 500 otherwise with the reason as its code", () => {
    const of = (e: Wire.ApiError) => [e.status, e.code]
    assert.deepStrictEqual(of(Wire.samplerError(samplerError("BadRequest", "no"))), [400, "sampler_rejected"])
    assert.deepStrictEqual(of(Wire.samplerError(samplerError("Overloaded", "busy"))), [429, "overloaded"])
    assert.deepStrictEqual(of(Wire.samplerError(samplerError("Closed", "shut"))), [503, "Closed"])
    assert.deepStrictEqual(of(Wire.samplerError(samplerError("Timeout", "slow"))), [500, "Timeout"])
    assert.strictEqual(Wire.samplerError(samplerError("Timeout", "slow")).message, "slow")
  })

  it("refusal: the shared request rules as a 400 naming the field; a body within them passes", () => {
    const e = Wire.refusal({ messages: [], temprature: 1 }, "chat", [])
    assert.strictEqual(e?.status, 400)
    assert.strictEqual(e?.param, "temprature")
    assert.match(e?.message ?? "", /^Unrecognized request argument supplied: temprature/)
    assert.strictEqual(Wire.refusal({ messages: [], top_k: 3 }, "chat", ["top_k"]), undefined)
    assert.strictEqual(Wire.refusal({ messages: [], temperature: 3 }, "chat", [])?.code, "decimal_above_max_value")
  })

  describe("readJson", () => {
    it.effect("a JSON body in pieces is parsed; no body at all is an empty object", () =>
      Effect.gen(function*() {
        assert.deepStrictEqual(yield* Wire.readJson(request(["{\"a\":", "[1,2]}"]), 100), { a: [1, 2] })
        assert.deepStrictEqual(yield* Wire.readJson(request([]), 100), {})
      }))

    it.effect("a body that is not JSON is a 400; one over the limit a 413, from Content-Length or as it is read", () =>
      Effect.gen(function*() {
        const notJson = yield* Effect.flip(Wire.readJson(request(["{not"]), 100))
        assert.deepStrictEqual([notJson.status, notJson.message], [400, "the request body is not valid JSON"])
        const declared = yield* Effect.flip(Wire.readJson(request([], { "content-length": "101" }), 100))
        assert.deepStrictEqual([declared.status, declared.message], [413, "the request body exceeds 100 bytes"])
        const read = yield* Effect.flip(Wire.readJson(request(["x".repeat(60), "x".repeat(60)]), 100))
        assert.deepStrictEqual([read.status, read.message], [413, "the request body exceeds 100 bytes"])
      }))
  })

  describe("answers", () => {
    it.effect("sendJson writes the status and the JSON; sendError before a stream is the error's JSON body", () =>
      Effect.gen(function*() {
        const ok = response()
        yield* Wire.sendJson(ok.res, 200, { a: 1 })
        assert.deepStrictEqual([ok.sent.status, ok.sent.body, ok.sent.ended], [200, "{\"a\":1}", true])
        const failed = response()
        yield* Wire.sendError(failed.res, Wire.invalid("bad", "n"))
        assert.strictEqual(failed.sent.status, 400)
        assert.deepStrictEqual(JSON.parse(failed.sent.body), Wire.errorBody(Wire.invalid("bad", "n")))
      }))

    it.effect("sendError mid-stream ends it with an error event and [DONE]; after its end, writes nothing", () =>
      Effect.gen(function*() {
        const { res, sent } = response()
        Wire.startEvents(res)
        res.write(Wire.event({ a: 1 }))
        yield* Wire.sendError(res, Wire.samplerError(samplerError("Closed", "shut")))
        assert.strictEqual(sent.status, 200)
        assert.strictEqual(sent.headers["content-type"], "text/event-stream")
        const error = Wire.errorBody(Wire.samplerError(samplerError("Closed", "shut")))
        assert.strictEqual(sent.body, `data: {"a":1}\n\ndata: ${JSON.stringify(error)}\n\ndata: [DONE]\n\n`)
        const before = sent.body
        yield* Wire.sendError(res, Wire.invalid("late"))
        assert.strictEqual(sent.body, before)
      }))
  })
})
