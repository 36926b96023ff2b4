// The names docs/rollouts.md's `Rollout.run` call uses, as a program that made them would have them.
import type { Environment, Message, Tokenizer } from "../../../src/index.ts"
import * as ChainFormat from "../../../actors/ChainFormat.ts"
import * as RewardActor from "../../../actors/RewardActor.ts"
import * as Rollout from "../../../actors/Rollout.ts"
import * as ToolActor from "../../../actors/ToolActor.ts"
declare const messages: ReadonlyArray<Message.Message>
declare const tokenizer: Tokenizer.Tokenizer
declare const template: Parameters<typeof ChainFormat.fromTemplate>[0]["template"]
declare const toolActor: Parameters<typeof ToolActor.toPort>[0]
declare const rewardActor: Parameters<typeof RewardActor.toPort>[0]
declare const environment: Environment.Provider<any, any>
declare const step: number
