#!/bin/bash
set -euo pipefail
here=$(dirname "$0")
# The helper beside solve.sh (86 of 107 public solutions read such files).
source "$here/helper.sh"
reverse_lines /app/words.txt | cat > /app/reversed.txt
