/**
 * Helpers for testing a task of one's own (`agentfly-ts/testing`): an oracle (a plain TypeScript policy) played
 * through the task's tools, reward and episode as the model would play (`Oracle.rollout`, `Oracle.solveRate`), and
 * samplers that answer from a script instead of a model (`Sampler.layerScripted`, `withScriptedSampler`).
 *
 * @since 0.1.0
 */
export * as Oracle from "./Oracle.ts"
export { layerScripted, makeScripted, withScriptedSampler } from "../src/Sampler.ts"
export type { Script, ScriptedOptions } from "../src/Sampler.ts"
