/**
 * The shared guard of every network endpoint: tokens from a variable or a file, a check that takes any of several
 * tokens and tells which, loopback detection, the bind refusal, random ids and the cap on requests in flight.
 */
import * as NodeServices from "@effect/platform-node/NodeServices"
import { assert, describe, it } from "@effect/vitest"
import { Effect, FileSystem } from "effect"
import type * as Http from "node:http"
import * as Auth from "../../../actors/internal/auth.ts"

const request = (authorization?: string) =>
  ({ headers: authorization === undefined ? {} : { authorization } }) as unknown as Http.IncomingMessage

describe("auth", () => {
  it("a request is matched to the token it bears, and refused without one or with a wrong one", () => {
    const t = Auth.tokens(["alice-0123456789", "bob-0123456789", undefined, ""])
    assert.strictEqual(t.digests.length, 2)
    assert.deepStrictEqual(Auth.authorize(t, request("Bearer alice-0123456789")), { ok: true, client: 0 })
    assert.deepStrictEqual(Auth.authorize(t, request("bearer bob-0123456789")), { ok: true, client: 1 })
    for (const bad of [undefined, "", "Bearer", "Bearer alice", "Bearer alice-0123456789x", "Basic alice-0123456789"]) {
      assert.isFalse(Auth.authorize(t, request(bad)).ok, String(bad))
    }
    // No token configured: everyone is client 0.
    assert.deepStrictEqual(Auth.authorize(Auth.tokens([]), request()), { ok: true, client: 0 })
    assert.deepStrictEqual(Auth.headers("x"), { authorization: "Bearer x" })
    assert.deepStrictEqual(Auth.headers(undefined), {})
  })

  it("a non-loopback bind needs a token; loopback does not", () => {
    for (const host of ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"]) {
      assert.isTrue(Auth.isLoopback(host), host)
      assert.isUndefined(Auth.bindProblem(host, Auth.tokens([]), "X"))
    }
    for (const host of ["0.0.0.0", "::", "10.0.0.2", "example.com", "127.0.0.1.evil"]) {
      assert.isFalse(Auth.isLoopback(host), host)
      const problem = Auth.bindProblem(host, Auth.tokens([]), "AGENTFLY_X_TOKEN or --token-file")
      assert.include(problem, `refusing to listen on ${host} without a token`)
      assert.include(problem, "AGENTFLY_X_TOKEN or --token-file")
      assert.isUndefined(Auth.bindProblem(host, Auth.tokens(["t"]), "X"))
    }
  })

  it.effect("tokens load from the variable and a file (one a line, comments skipped); an empty file is refused", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectoryScoped({ prefix: "agentfly-auth-" })
      yield* fs.writeFileString(`${dir}/tokens`, "# clients\nalice\n\n  bob  \n")
      yield* fs.writeFileString(`${dir}/empty`, "# nothing\n\n")
      process.env["AGENTFLY_TEST_TOKEN"] = " from-env "
      const both = yield* Auth.load(fs, { env: ["AGENTFLY_TEST_NONE", "AGENTFLY_TEST_TOKEN"], file: `${dir}/tokens` })
      delete process.env["AGENTFLY_TEST_TOKEN"]
      assert.deepStrictEqual(both, ["from-env", "alice", "bob"])
      const empty = yield* Effect.flip(Auth.load(fs, { env: [], file: `${dir}/empty` }))
      assert.include(empty.message, "holds no token")
      const missing = yield* Effect.flip(Auth.load(fs, { env: [], file: `${dir}/nope` }))
      assert.include(missing.message, "could not be read")
      // What a command does at start: 0.0.0.0 without a token is refused with the reason.
      const refused = yield* Effect.flip(Auth.forServer({ env: ["AGENTFLY_TEST_NONE"], host: "0.0.0.0" }))
      assert.include(refused.message, "refusing to listen on 0.0.0.0 without a token")
      assert.include(refused.message, "AGENTFLY_TEST_NONE or --token-file")
      assert.deepStrictEqual(yield* Auth.forServer({ env: [], file: `${dir}/tokens`, host: "0.0.0.0" }), [
        "alice",
        "bob"
      ])
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)))

  it("random ids are 128 bits of hex, and differ", () => {
    const ids = new Set(Array.from({ length: 1000 }, Auth.randomId))
    assert.strictEqual(ids.size, 1000)
    for (const id of ids) assert.match(id, /^[0-9a-f]{32}$/)
  })

  it.effect("the gate refuses past its cap and gives places back when a request ends, failed or not", () =>
    Effect.gen(function*() {
      const g = Auth.gate(2)
      const refused = Effect.succeed("refused")
      assert.isTrue(Auth.enter(g))
      assert.isTrue(Auth.enter(g))
      assert.strictEqual(yield* Auth.within(g, Effect.succeed("ran"), refused), "refused")
      Auth.leave(g)
      assert.strictEqual(yield* Auth.within(g, Effect.succeed("ran"), refused), "ran")
      yield* Effect.flip(Auth.within(g, Effect.fail("boom"), Effect.fail("refused")))
      assert.strictEqual(g.inFlight, 1)
      assert.isTrue(Auth.closesConnection(401) && Auth.closesConnection(413) && !Auth.closesConnection(404))
    }))
})
