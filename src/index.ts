/**
 * agentfly core: schemas, the token-level trajectory, backend interfaces and pure algorithms.
 *
 * @since 0.1.0
 */
export * as Graph from "./onnx/Graph.ts"
export * as Environment from "./Environment.ts"
export * as Message from "./Message.ts"
export * as Sampler from "./Sampler.ts"
export * as Trajectory from "./Trajectory.ts"
