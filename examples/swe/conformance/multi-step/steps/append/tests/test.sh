#!/bin/bash
set -euo pipefail
source /tests/expect.sh
expect one two
