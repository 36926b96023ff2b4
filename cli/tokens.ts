/**
 * `agentfly tokens`: renders a conversation through a model's chat template and shows every token with its source
 * and loss mask.
 *
 * @since 0.1.0
 */
import { Console, Effect } from "effect"
import { Command, Flag } from "effect/cli"

/**
 * @category commands
 * @since 0.1.0
 */
export const tokens = Command.make(
  "tokens",
  {
    modelDir: Flag.Directory("model-dir", { mustExist: true }).pipe(
      Flag.withDescription("A model folder with tokenizer.json and tokenizer_config.json")
    ),
    conversation: Flag.File("conversation", { mustExist: true }).pipe(
      Flag.withDescription("An OpenAI-style conversation: { messages, tools? } or a list of messages")
    ),
    json: Flag.Boolean("json").pipe(
      Flag.withDescription("Print { ids, mask, sources, segments } as JSON"),
      Flag.withDefault(false)
    )
  },
  Effect.fn("tokens")(function*({ modelDir, conversation }) {
    yield* Console.log(`${modelDir} ${conversation}: not implemented yet`)
  })
).pipe(Command.withDescription("Show the tokens of a conversation with their source and loss mask"))
