#!/bin/sh
mkdir -p /logs/verifier
python3 - <<'PY'
import os, socket
host, port = os.environ["PROBE"].rsplit(":", 1)
s = socket.socket(); s.settimeout(3)
try:
    s.connect((host, int(port))); ok = s.recv(2) == b"hi"
except OSError:
    ok = False
open("/logs/verifier/reward.txt", "w").write("1" if ok else "0")
PY
