/** A custom tool and a custom reward on one scripted episode. Run: npx tsx examples/01_custom_tool_and_reward.ts */
import { Effect, Schema } from "effect"
import * as RewardActor from "../actors/RewardActor.ts"
import * as ToolActor from "../actors/ToolActor.ts"
import * as Answer from "../environments/answer/Answer.ts"
import { type Message, Reward, Tool } from "../src/index.ts"

const WordCount = Tool.make("word_count", {
  description: "Count the words of a text",
  parameters: Schema.Struct({ text: Schema.String }),
  success: Schema.Int,
  handler: ({ text }) => Effect.succeed(text.split(/\s+/).filter(Boolean).length)
})

const RightCount = Reward.make("rightCount", {
  row: Schema.Struct({ count: Schema.Int }), // the dataset-row fields it reads
  score: ({ response, row }) => Effect.succeed({ reward: Number(response === String(row.count)) })
})

const call = (id: string, name: string, a: {}) => ({ id, type: "function", function: { name, arguments: a } }) as const
const program = Effect.gen(function*() {
  const tools = yield* ToolActor.make([WordCount, Answer.answer])
  const messages: Array<Message.Message> = [{ role: "user", content: "How many words in 'to be or not to be'?" }]
  // What a policy might emit, turn by turn: one good call and one malformed, then the answer.
  for (const calls of [[call("1", "word_count", { text: "to be or not to be" }), call("2", "word_count", {})],
    [call("3", "answer", { answer: 6 })]]) {
    messages.push({ role: "assistant", content: "", tool_calls: calls })
    const turn = yield* tools.executeTurn(calls)
    messages.push(...turn.messages)
    for (const m of turn.messages) console.log(`${m.tool_call_id} ${m.is_error ? "error" : "ok"}: ${m.content}`)
  }
  const rewards = yield* RewardActor.make(RightCount, { onError: "zero" })
  const { trajectory } = yield* rewards.score({ trajectoryId: "t", groupId: "g", chainId: "c", messages, segments: [],
    termination: "answer", reward: 0, rewardStatus: "pending", metrics: {}, trainable: true, masked: false,
    row: { count: 6 } })
  console.log(`reward ${trajectory.reward}`, JSON.stringify(trajectory.metrics), JSON.stringify(yield* tools.metrics))
})

Effect.runPromise(program)
