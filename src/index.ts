/**
 * agentfly core: schemas, the token-level trajectory, backend interfaces and pure algorithms.
 *
 * @since 0.1.0
 */
export * as Environment from "./Environment.ts"
export * as Graph from "./onnx/Graph.ts"
export * as Message from "./Message.ts"
export * as ModelConfig from "./model/ModelConfig.ts"
export * as Qwen2 from "./model/Qwen2.ts"
export * as Sampler from "./Sampler.ts"
export * as Safetensors from "./Safetensors.ts"
export * as Sampling from "./Sampling.ts"
export * as Trajectory from "./Trajectory.ts"
export * as Tool from "./Tool.ts"
export * as Reward from "./Reward.ts"
export * as ByteTokenizer from "./ByteTokenizer.ts"
export * as ChatTemplate from "./ChatTemplate.ts"
export * as Tokenizer from "./Tokenizer.ts"
export * as ToolCallParser from "./ToolCallParser.ts"
export * as RolloutError from "./RolloutError.ts"
export * as OpenAiCompatSampler from "./backends/OpenAiCompatSampler.ts"
