#!/usr/bin/env bash
# The GUI learning figure for one seed (BENCHMARKS.md, "gui"): one-button click screens on a 16-pixel grid with a
# gradient backdrop, the screen before the question; the tiny-vl model pretrained on the screens' auxiliary task
# (pretrain.ts), warmed up on the oracle's demonstrations (at least 200 steps, until validation success reaches
# 0.3), then GRPO (learn-one.json, or the config named second: learn-one-aligned.json adds the alignment term and
# keeps the lr constant for 100 steps; learn-one-grouped.json, the figure's recipe, adds groups of 16 chains).
#
#   examples/gui/learn-one.sh SEED [CONFIG]   (writes runs/models/NAME-sSEED and runs/NAME-sSEED, NAME the config's)
set -euo pipefail
seed="${1:?usage: examples/gui/learn-one.sh SEED [CONFIG]}"
base="${2:-learn-one.json}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
if [ ! -f data-one/demos.jsonl ]; then
  npx tsx generate.ts data-one 2026 0 --kinds click --grid 16 --screenFirst 1 --buttons 1 --backdrop gradient \
    --demos 3000 --train 2000 --heldOut 200 --validation 100
fi
name="$(basename "$base" .json)"
name="gui-${name}"
model="$root/runs/models/$name-s$seed"
rm -rf "$model"
"$root/bin/agentfly.mjs" init-model --preset tiny-vl --seed "$seed" --out "$model"
npx tsx pretrain.ts "$model" --steps 600 --buttons 1 --seed "$seed"
# The run's config with this seed's model folder (paths made absolute: the copy lives beside the run).
config="$root/runs/$name-s$seed.json"
node -e '
  const [src, out, model, dir] = process.argv.slice(1)
  const c = JSON.parse(require("fs").readFileSync(src, "utf8"))
  const abs = (p) => require("path").resolve(dir, p)
  c.model.path = model
  c.data = { train: abs(c.data.train), eval: abs(c.data.eval) }
  c.warmup.data = abs(c.warmup.data)
  c.warmup.stopAt.data = abs(c.warmup.stopAt.data)
  require("fs").writeFileSync(out, JSON.stringify(c, null, 2))
' "$base" "$config" "$model" "$here"
"$root/bin/agentfly.mjs" train "$config" --seed "$seed" --output "$root/runs/$name-s$seed" --overwrite
