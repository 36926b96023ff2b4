#!/bin/bash
set -euo pipefail
echo "$GREETING-$PART" > /app/out.txt
