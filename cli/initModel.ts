/**
 * `agentfly init-model --out DIR --preset tiny|small [--seed N]`: writes a fresh model folder (Hugging Face
 * layout) with randomly initialised weights, the byte-level tokenizer and a Qwen2.5-style chat template.
 *
 * @since 0.1.0
 */
import { Console, Effect } from "effect"
import { Command, Flag } from "effect/cli"
import * as ModelConfig from "../src/model/ModelConfig.ts"
import * as ModelFolder from "../src/ModelFolder.ts"
import * as Qwen2 from "../src/model/Qwen2.ts"

/**
 * @category commands
 * @since 0.1.0
 */
export const initModel = Command.make(
  "init-model",
  {
    out: Flag.Directory("out").pipe(Flag.withDescription("Folder to write (created if missing)")),
    preset: Flag.Literals("preset", ["tiny", "small", "medium"]).pipe(
      Flag.withDescription(
        "tiny: 2 layers, width 128; small: 4 layers, width 256; medium: 12 layers, width 768 (≈104 M)"
      ),
      Flag.withDefault("tiny" as const)
    ),
    seed: Flag.Int("seed").pipe(Flag.withDescription("Seed of the random initialisation"), Flag.withDefault(0))
  },
  Effect.fn("initModel")(function*({ out, preset, seed }) {
    const config = yield* ModelFolder.init(out, { preset, seed })
    const params = Qwen2.parameters(config).reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
    yield* Console.log(
      `wrote ${out}: qwen2 ${preset}, ${config.numHiddenLayers} layers, width ${config.hiddenSize}, ` +
        `${config.numAttentionHeads}/${config.numKeyValueHeads} heads, head dim ${ModelConfig.headDim(config)}, ` +
        `vocab ${config.vocabSize}, ${(params / 1e6).toFixed(2)} M parameters (seed ${seed})`
    )
  })
).pipe(Command.withDescription("Write a fresh model folder (config, safetensors weights, tokenizer, chat template)"))
