#!/bin/bash
set -euo pipefail
mkdir -p /logs/verifier
c=0; [ -f /app/done ] && c=1
printf '{"correctness": %s, "performance": 0.5}' "$c" > /logs/verifier/reward.json
