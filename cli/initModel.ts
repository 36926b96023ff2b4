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
import * as VisionTower from "../src/model/VisionTower.ts"

/**
 * @category commands
 * @since 0.1.0
 */
export const initModel = Command.make(
  "init-model",
  {
    out: Flag.Directory("out").pipe(Flag.withDescription("Folder to write (created if missing)")),
    preset: Flag.Literals("preset", ["tiny", "small", "medium", "tiny-vl"]).pipe(
      Flag.withDescription(
        "tiny: 2 layers, width 128; small: 4 layers, width 256; medium: 12 layers, width 768 (≈104 M); " +
          "tiny-vl: tiny with a vision tower (2 blocks, width 64, patch 8, images up to 64×64)"
      ),
      Flag.withDefault("tiny" as const)
    ),
    seed: Flag.Int("seed").pipe(Flag.withDescription("Seed of the random initialisation"), Flag.withDefault(0))
  },
  Effect.fn("initModel")(function*({ out, preset, seed }) {
    const config = yield* ModelFolder.init(out, { preset, seed })
    const vl = preset === "tiny-vl" ? { ...VisionTower.presets[preset], text: config } : undefined
    const specs = vl === undefined ? Qwen2.parameters(config) : VisionTower.allParameters(vl)
    const params = specs.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0)
    yield* Console.log(
      `wrote ${out}: qwen2 ${preset}${vl === undefined ? "" : " (with a vision tower)"}, ` +
        `${config.numHiddenLayers} layers, width ${config.hiddenSize}, ` +
        `${config.numAttentionHeads}/${config.numKeyValueHeads} heads, head dim ${ModelConfig.headDim(config)}, ` +
        `vocab ${config.vocabSize}, ${(params / 1e6).toFixed(2)} M parameters (seed ${seed})`
    )
  })
).pipe(Command.withDescription("Write a fresh model folder (config, safetensors weights, tokenizer, chat template)"))
