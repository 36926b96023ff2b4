/**
 * agentfly's runtime (`agentfly-ts/actors`): rollouts, the training loop as one call, the learner and policy
 * engines, the gateway and the servers, each module as a namespace. Oracles and scripted samplers for tests are in
 * `agentfly-ts/testing`.
 *
 * @since 0.1.0
 */
export * as ChainFormat from "./ChainFormat.ts"
export * as EngineThread from "./EngineThread.ts"
export * as Gateway from "./Gateway.ts"
export * as InferenceServers from "./InferenceServers.ts"
export * as Journal from "./Journal.ts"
export * as Learner from "./Learner.ts"
export * as LocalPolicy from "./LocalPolicy.ts"
export * as Metrics from "./Metrics.ts"
export * as OpenAiServer from "./OpenAiServer.ts"
export * as Oracle from "./Oracle.ts"
export * as PolicyEngine from "./PolicyEngine.ts"
export * as PolicyVersions from "./PolicyVersions.ts"
export * as ResourceManager from "./ResourceManager.ts"
export * as Resume from "./Resume.ts"
export * as RewardActor from "./RewardActor.ts"
export * as Rollout from "./Rollout.ts"
export * as RolloutChain from "./RolloutChain.ts"
export * as RolloutQueue from "./RolloutQueue.ts"
export * as RolloutWorker from "./RolloutWorker.ts"
export * as Rollouts from "./Rollouts.ts"
export * as RunError from "./RunError.ts"
export * as TaskRuntime from "./TaskRuntime.ts"
export * as ToolActor from "./ToolActor.ts"
export * as Train from "./Train.ts"
export * as TrainLoop from "./TrainLoop.ts"
export * as TrainerServer from "./TrainerServer.ts"
export * as TinkerServer from "./tinker/TinkerServer.ts"
