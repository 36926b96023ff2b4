#!/bin/bash
set -euo pipefail
mkdir -p /logs/verifier
if [ "$(sha256sum /tests/fixture.bin | cut -d" " -f1)" = "37b21118c16414cb27f91b7f7e56d1d8c46a67cec6a5ce89b00f923aa181fca5" ] && [ "$(stat -c %s /tests/fixture.bin)" = "4102" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
