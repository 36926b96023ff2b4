#!/bin/sh
# Public verifiers install their tools here (apt-get install curl, uv, pytest); offline, the run bakes them in.
mkdir -p /logs/verifier
if [ "$(cat /opt/verifier-tool 2>/dev/null)" = ready ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
