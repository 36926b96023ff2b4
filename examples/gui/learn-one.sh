#!/usr/bin/env bash
# The GUI learning figure for one seed (BENCHMARKS.md, "gui"): one-button click screens on a 16-pixel grid with a
# gradient backdrop, the screen before the question; the tiny-vl model pretrained on the screens' auxiliary task
# (pretrain.ts), warmed up on the oracle's demonstrations until validation success reaches 0.3, then GRPO.
#
#   examples/gui/learn-one.sh SEED        (writes runs/models/gui-learn-one and runs/gui-learn-one-sSEED)
set -euo pipefail
seed="${1:?usage: examples/gui/learn-one.sh SEED}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
if [ ! -f data-one/demos.jsonl ]; then
  npx tsx generate.ts data-one 2026 0 --kinds click --grid 16 --screenFirst 1 --buttons 1 --backdrop gradient \
    --demos 3000 --train 2000 --heldOut 200 --validation 100
fi
model="$root/runs/models/gui-learn-one"
rm -rf "$model"
"$root/bin/agentfly.mjs" init-model --preset tiny-vl --seed "$seed" --out "$model"
npx tsx pretrain.ts "$model" --steps 600 --buttons 1 --seed "$seed"
"$root/bin/agentfly.mjs" train learn-one.json --seed "$seed" --output "$root/runs/gui-learn-one-s$seed" --overwrite
