#!/bin/bash
set -euo pipefail
mkdir -p /logs/verifier
# pipefail: a failing first stage fails the pipe, so a missing file scores 0.
if got=$(cat /app/reversed.txt | tr -d " ") && [ "$got" = "$(printf "gamma\nbeta\nalpha")" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
