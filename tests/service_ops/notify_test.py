#!/usr/bin/python3
"""sd_notify without systemd: under a NOTIFY_SOCKET made here the daemon
sends READY=1 with a STATUS= line once it serves, WATCHDOG=1 repeatedly
(WATCHDOG_USEC=600000: a ping at least every 300 ms is asked for; the test
only demands 3 within 20 s), RELOADING=1 then READY=1 on SIGHUP, and
STOPPING=1 on SIGTERM, then exits 0. Without NOTIFY_SOCKET nothing breaks
(every other test runs that way)."""
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, wait_for  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
import tempfile  # noqa: E402
workdir = tempfile.mkdtemp(prefix="/tmp/gpumemd-ops-")
notify_path = os.path.join(workdir, "notify.sock")
listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
listener.bind(notify_path)
listener.settimeout(0.2)
config = os.path.join(workdir, "gpumemd.textproto")
with open(config, "w") as f:
    f.write("pool { empty_slab_release_seconds: 10 }\n")

messages = []


def pump():
    try:
        while True:
            messages.append(listener.recv(4096).decode())
    except socket.timeout:
        pass
    return messages


def seen(prefix_line):
    return [m for m in messages if prefix_line in m.split("\n")]


d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--config=" + config],
           env={"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "600000"},
           workdir=workdir)
wait_for(lambda: pump() and seen("READY=1"), "READY=1", daemon=d)
ready = seen("READY=1")[0]
if not any(l.startswith("STATUS=serving 2 sim device(s)") for l in ready.split("\n")):
    fail("READY=1 came without the serving STATUS= line: %r" % ready, d)
# Ready means serving: a call succeeds at once.
d.ctl("stats")

wait_for(lambda: pump() and len(seen("WATCHDOG=1")) >= 3, "3 WATCHDOG=1 pings",
         daemon=d)

d.signal(signal.SIGHUP)
wait_for(lambda: pump() and seen("RELOADING=1") and len(seen("READY=1")) >= 2,
         "RELOADING=1 and a second READY=1 after SIGHUP", daemon=d)

d.signal(signal.SIGTERM)
wait_for(lambda: pump() and seen("STOPPING=1"), "STOPPING=1", daemon=d)
d.stop()
if any("\n" in line for m in messages for line in m.split("\n") if line.startswith("STATUS=")):
    fail("a STATUS= spans lines")
print("received %d notifications: %d watchdog pings; READY, RELOADING, STOPPING seen"
      % (len(messages), len(seen("WATCHDOG=1"))))
print("PASS")
