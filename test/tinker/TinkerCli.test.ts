/**
 * `agentfly trainer --tinker-model` as a user runs it: a real process, SIGKILLed while an optimiser step it accepted
 * is still waiting, then started again on its state directory: the step completes once, on the state its client saw.
 */
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as FutureLog from "../../actors/tinker/FutureLog.ts"
import * as Models from "../../actors/tinker/Models.ts"
import * as ModelFolder from "../../src/ModelFolder.ts"
import * as T from "../../src/tinker/Types.ts"
import { startCommand } from "../utils/agentfly.ts"
import { client, createModel, fbRequest, forwardLogprobs, inProcess, optimRequest, postFb } from "./utils.ts"

const ready = /Tinker API at (http:\/\/\S+)\/api\/v1/

/** A batch large enough that the step behind it is still waiting when the process is killed. */
const bigBatch = (): Array<T.Datum> =>
  Array.from({ length: 32 }, (_, r) => {
    const ids = Array.from({ length: 160 }, (_, i) => (i * 13 + r * 7) % 256)
    return {
      model_input: { chunks: [{ tokens: ids.slice(0, -1), type: "encoded_text" }] },
      loss_fn_inputs: { target_tokens: { data: ids.slice(1), dtype: "int64" } }
    }
  })

const probe = (): Array<T.Datum> => bigBatch().slice(0, 2)

describe("agentfly trainer --tinker-model", () => {
  it.live("SIGKILLed with an optimiser step pending and started again, the step completes once", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "tinker-cli-"))
      const state = join(dir, "state")
      const args = ["--port", "0", "--tinker-model", "tiny", "--tinker-state-dir", state]
      const first = yield* Scope.make()
      const one = yield* startCommand("trainer", args, ready).pipe(Scope.provide(first))
      const c1 = client(one.url)
      const { model } = yield* createModel(c1, undefined, "tiny")
      yield* postFb(c1, fbRequest(model, bigBatch(), 1))
      const opt = yield* c1.post("optim_step", T.OptimStepRequest, optimRequest(model, 2), T.UntypedAPIFuture)
      one.child.kill("SIGKILL")
      yield* Scope.close(first, Exit.void)
      const logPath = join(state, "requests.jsonl")
      const outcomes = (entries: ReadonlyArray<FutureLog.Entry>) =>
        entries.filter((e) => e.t === "outcome" && e.id === opt.request_id).length
      // The scenario: the process died before the step ran.
      assert.strictEqual(outcomes(yield* FutureLog.read(logPath)), 0)

      const two = yield* startCommand("trainer", args, ready)
      const c2 = client(two.url)
      const stepped = yield* c2.done(opt, T.OptimStepResponse)
      assert.strictEqual(stepped.metrics?.["step"], 1)
      const tiny = Models.baseOf("tiny", yield* ModelFolder.load(join(state, "bases", "tiny")))
      const expected = yield* inProcess([bigBatch()], 1, tiny, probe())
      assert.deepStrictEqual(yield* forwardLogprobs(c2, model, probe()), expected.logprobs)
      assert.strictEqual(outcomes(yield* FutureLog.read(logPath)), 1)
    }).pipe(Effect.scoped, Effect.provide(NodeServices.layer)), 300_000)
})
