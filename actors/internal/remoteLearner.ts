/**
 * The trainer server of `learner.url`: the learner's steps run in an `agentfly trainer` process (here or on another
 * machine). This module holds what the local learner needs of it besides the trainers themselves: their settings,
 * the policy trainer in use (its weights' summary and, with `learner.pushWeights`, the pushes to the inference
 * servers) and the traffic figures of a step.
 */
import { Effect } from "effect"
import { createHash } from "node:crypto"
import type * as ModelFolder from "../../src/ModelFolder.ts"
import * as RemoteTrainer from "../../src/backends/RemoteTrainer.ts"
import type * as TrainConfig from "../../src/TrainConfig.ts"
import type * as InferenceServers from "../InferenceServers.ts"
import { runError } from "../RunError.ts"

export interface Remote {
  /** What every trainer of the run on the server shares (the policy's name: `policy-<run>`). */
  readonly settings: Omit<RemoteTrainer.Options, "weights" | "loss" | "optimizer" | "schedule">
  /** The run's name on the server: its output directory and seed, hashed. */
  readonly runName: string
  /** Whether the server pushes the weights to the inference servers itself (`learner.pushWeights`). */
  readonly pushes: boolean
  /** The policy's trainer on the server now, once made. */
  current: RemoteTrainer.RemoteTrainer | undefined
  /** The traffic up to the previous step's figures. */
  counted: RemoteTrainer.Traffic
}

/**
 * The run's trainer server, or undefined without `learner.url`. Its trainers are named after the run's output
 * directory and seed, so that runs sharing a trainer server keep their own, and a resumed run replaces what its
 * earlier process left there.
 */
export const make = (
  folder: ModelFolder.ModelFolder,
  config: TrainConfig.TrainConfig,
  parameters: RemoteTrainer.Options["parameters"]
): Remote | undefined => {
  if (config.learner.url === undefined) return undefined
  const runName = createHash("sha256").update(JSON.stringify([config.output, config.seed])).digest("hex").slice(0, 12)
  return {
    settings: {
      url: config.learner.url,
      name: `policy-${runName}`,
      token: process.env["AGENTFLY_TRAINER_TOKEN"] || undefined,
      model: folder.config,
      parameters,
      workers: config.learner.workers,
      callMillis: config.learner.timeoutSeconds === undefined ? undefined : config.learner.timeoutSeconds * 1000,
      traffic: RemoteTrainer.makeTraffic()
    },
    runName,
    pushes: config.engine.servers !== undefined && config.learner.pushWeights,
    current: undefined,
    counted: RemoteTrainer.makeTraffic()
  }
}

/** The traffic since the previous call: `trainer/calls`, `trainer/retries`, `trainer/sent_mb` and `…/received_mb`. */
export const figures = (remote: Remote) =>
  Effect.sync(() => {
    const now = { ...remote.settings.traffic! }
    const before = remote.counted
    remote.counted = now
    return {
      "trainer/calls": now.calls - before.calls,
      "trainer/retries": now.retries - before.retries,
      "trainer/sent_mb": (now.sentBytes - before.sentBytes) / 1e6,
      "trainer/received_mb": (now.receivedBytes - before.receivedBytes) / 1e6
    }
  })

const fromTrainer = (e: { readonly message: string }) =>
  runError("Servers", `the trainer server could not push the weights: ${e.message}`, e)

/** The inference servers' carrier of the weights: the policy's trainer on the server, which holds them. */
export const carrier = (remote: Remote): InferenceServers.Carrier => ({
  pushAll: (push, urls) =>
    Effect.suspend(() => remote.current!.push(push, urls)).pipe(
      Effect.mapError(fromTrainer),
      Effect.map((outcomes) =>
        outcomes.map((o) =>
          typeof o === "object" ? { ...o, message: `pushed by the trainer server: ${o.message}` } : o
        )
      )
    ),
  pushOne: (push, url) =>
    Effect.suspend(() => remote.current!.catchUp(push, [url])).pipe(
      Effect.map((outcomes) => outcomes[0]),
      Effect.catch((e) => Effect.succeed({ fatal: false, message: `the trainer server: ${e.message}` }))
    )
})
