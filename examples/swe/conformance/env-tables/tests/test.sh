#!/bin/bash
set -euo pipefail
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = "$EXPECTED" ] && [ "$GREETING" = hello ] && [ -z "${PART:-}" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
