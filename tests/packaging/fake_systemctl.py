#!/usr/bin/python3
"""`systemctl` where fake_systemd.py plays systemd: the test mounts this file
over /usr/bin/systemctl in its own mount namespace, so the packages'
maintainer scripts (deb-systemd-invoke, daemon-reload) and the test reach the
stand-in. Forwards the command line, prints the answer, exits with its code.
Offline operations on unit files (`--root=DIR`: deb-systemd-helper's
`preset`, which enables a unit on its first install) need no running
systemd: they go to the real systemctl, which the test mounts at REAL.
"""
import json
import os
import socket
import sys

CONTROL = "/run/systemd/fake-systemd.sock"
REAL = "/run/systemd/real-systemctl"

if any(a.startswith("--root=") for a in sys.argv[1:]):
    os.execv(REAL, [REAL] + sys.argv[1:])

s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(CONTROL)
except OSError as e:
    print("fake systemctl: %s: %s (is fake_systemd.py running?)" % (CONTROL, e), file=sys.stderr)
    sys.exit(1)
s.sendall((json.dumps({"argv": sys.argv[1:]}) + "\n").encode())
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
answer = json.loads(data)
sys.stdout.write(answer["out"])
sys.stderr.write(answer["err"])
sys.exit(answer["rc"])
