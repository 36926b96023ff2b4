#!/bin/sh
set -eu
mkdir -p /logs/verifier
if [ "$(pwd)" = /srv/project ] && [ -f /srv/project/here.txt ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
