/**
 * A fake Tinker engine on the scripted loopback server: it keeps sessions, models, futures and saved states as the API
 * describes them, answers every computing call with a future, and records what it was asked. Its "model" learns
 * nothing: `forward_backward` answers each datum's own `logprobs` (ratio 1) or −1 per token for `cross_entropy`, and
 * `asample` answers `sample` tokens. For client-side tests; the real server is `agentfly trainer`.
 */
import type { Handler, Seen } from "./scriptedTinker.ts"

export interface FakeEngine {
  readonly handler: Handler
  /** The bodies of each route's requests, in order. */
  readonly bodies: (route: string) => Array<any>
  /** Optimiser steps applied per model id. */
  readonly steps: Map<string, number>
  /** What `asample` answers: tokens and logprobs (absent: none). */
  sample: { tokens: Array<number>; logprobs?: Array<number>; stop_reason: "stop" | "length" }
  /** When set, `optim_step` futures fail with this message (category `user`) and apply nothing. */
  failOptim: string | undefined
}

export const fakeTinker = (): FakeEngine => {
  const seen: Array<Seen> = []
  const futures = new Map<string, unknown>()
  const states = new Map<string, string>()
  const steps = new Map<string, number>()
  let models = 0
  const future = (result: unknown) => {
    const id = `f${futures.size}`
    futures.set(id, result)
    return { status: 200, json: { request_id: id } }
  }
  const engine: FakeEngine = {
    bodies: (route) => seen.filter((s) => s.path === `/api/v1/${route}`).map((s) => s.body),
    steps,
    sample: { tokens: [5, 6, 2], logprobs: [-0.5, -0.25, -0.125], stop_reason: "stop" },
    failOptim: undefined,
    handler: (s) => {
      seen.push(s)
      const route = s.path.replace("/api/v1/", "")
      const b = s.body
      switch (route) {
        case "create_session":
          return { status: 200, json: { type: "create_session", session_id: "sess-1" } }
        case "session_heartbeat":
          return { status: 200, json: { type: "session_heartbeat" } }
        case "create_model": {
          const id = `model-${models++}`
          steps.set(id, 0)
          return future({ model_id: id, type: "create_model" })
        }
        case "forward_backward":
        case "forward": {
          const input = b.forward_backward_input ?? b.forward_input
          const outputs = input.data.map((d: any) => {
            const n = d.loss_fn_inputs.target_tokens.data.length
            const lp = input.loss_fn === "cross_entropy" ? Array(n).fill(-1) : d.loss_fn_inputs.logprobs.data
            return { logprobs: { data: lp, dtype: "float32", shape: [n] } }
          })
          return future({ loss_fn_output_type: "ArrayRecord", loss_fn_outputs: outputs, metrics: {} })
        }
        case "optim_step":
          if (engine.failOptim !== undefined) return future({ error: engine.failOptim, category: "user" })
          steps.set(b.model_id, (steps.get(b.model_id) ?? 0) + 1)
          return future({ metrics: { grad_norm: 0.5 } })
        case "save_weights": {
          const path = `tinker://${b.model_id}/weights/${b.path}`
          states.set(path, b.model_id)
          return future({ path, type: "save_weights" })
        }
        case "save_weights_for_sampler":
          return future({ path: `tinker://${b.model_id}/sampler_weights/${b.path}` })
        case "load_weights":
          return states.has(b.path)
            ? future({ path: b.path, model_id: b.model_id, type: "load_weights" })
            : future({ error: `no checkpoint ${b.path}`, category: "user" })
        case "asample":
          return future({ sequences: [engine.sample], type: "sample" })
        case "retrieve_future": {
          const result = futures.get(b.request_id)
          if (result === undefined) return { status: 404, json: { detail: "unknown future" } }
          return { status: 200, json: result }
        }
        default:
          return { status: 404, json: { detail: `no route ${s.path}` } }
      }
    }
  }
  return engine
}
