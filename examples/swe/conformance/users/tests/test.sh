#!/bin/sh
# [agent] user over the image's USER; [verifier] user for this script.
mkdir -p /logs/verifier
if [ "$(id -u)" = 0 ] && [ "$(cat /logs/agent-uid 2>/dev/null)" = 4321 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
