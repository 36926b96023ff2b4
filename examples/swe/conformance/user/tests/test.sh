#!/bin/sh
mkdir -p /logs/verifier
if [ "$(id -u)" = 1234 ] && [ "$(stat -c %u /home/runner/mine.txt 2>/dev/null)" = 1234 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
