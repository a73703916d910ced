#!/usr/bin/python3
"""Drain on SIGTERM (--drain_seconds):
- while an allocation is live the daemon keeps running; a new Allocate gets
  UNAVAILABLE saying the daemon is stopping; GetStats and Free still work;
- once the last allocation is freed the daemon exits 0 without waiting out
  the drain time (60 s here; the test allows 30);
- with an allocation that is never freed the daemon waits --drain_seconds
  (2 s here), then releases it and exits 0;
- SIGHUP while draining does not end it; a second SIGTERM ends the wait at
  once;
- gpumemd_probe (the health check) says SERVING before and NOT_SERVING
  while the daemon drains.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, wait_for  # noqa: E402

gpumemd, ctl, probe = sys.argv[1], sys.argv[2], sys.argv[3]


def probe_says(d):
    r = subprocess.run([probe, "--socket=" + d.sock], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


# 1. Drained by a Free.
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--drain_seconds=60"])
d.wait_serving()
holder, held = d.hold("4MiB", "--gpus=0")
held_id = held["allocations"][0]["id"]
rc, out = probe_says(d)
if rc != 0 or "SERVING" not in out:
    fail("probe before the drain: %d %s" % (rc, out), d)
d.signal(signal.SIGTERM)
wait_for(lambda: "new allocations are refused" in d.log(), "the daemon to begin draining",
         daemon=d)
rc, out = probe_says(d)
if rc != 1 or "NOT_SERVING" not in out:
    fail("probe while draining: %d %s" % (rc, out), d)
r = d.ctl("alloc", "1MiB", check=False)
if r.returncode != 1 or "UNAVAILABLE" not in r.stderr or "gpumemd is stopping" not in r.stderr:
    fail("Allocate while draining: rc %d, %s" % (r.returncode, r.stderr), d)
if d.proc.poll() is not None:
    fail("the daemon exited with an allocation live and drain time left", d)
if d.stats()["devices"][0]["allocation_count"] != "1":
    fail("GetStats while draining", d)
t0 = time.monotonic()
if d.ctl("free", held_id).stdout.strip() != "freed %s" % held_id:
    fail("Free while draining", d)
rc = d.wait_exit(30)
if rc != 0:
    fail("exit status %d after the drain" % rc, d)
if "drained: no live allocations" not in d.log():
    fail("the daemon did not say it drained", d)
print("drained by Free: exited %.2f s after the last Free" % (time.monotonic() - t0))
holder.send_signal(signal.SIGINT)
holder.wait(30)

# 2. Never freed: waits --drain_seconds=2, then releases and exits 0.
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--drain_seconds=2"])
d.wait_serving()
holder, _ = d.hold("4MiB")
t0 = time.monotonic()
d.signal(signal.SIGTERM)
rc = d.wait_exit(60)
waited = time.monotonic() - t0
if rc != 0 or waited < 1.9:
    fail("drain time not honoured: rc %d after %.2f s" % (rc, waited), d)
if "drain time over; releasing 1 live allocation(s)" not in d.log():
    fail("the daemon did not say it released what was left", d)
print("drain time 2 s: exited after %.2f s" % waited)
holder.kill()
holder.wait()

# 3. SIGHUP while draining changes nothing; a second SIGTERM cuts a 120 s
# drain short.
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--drain_seconds=120"])
d.wait_serving()
holder, _ = d.hold("4MiB")
d.signal(signal.SIGTERM)
wait_for(lambda: "new allocations are refused" in d.log(), "the daemon to begin draining",
         daemon=d)
d.signal(signal.SIGHUP)
time.sleep(1)
if d.proc.poll() is not None:
    fail("SIGHUP ended the drain", d)
d.signal(signal.SIGTERM)
rc = d.wait_exit(60)
if rc != 0 or "second signal" not in d.log():
    fail("second SIGTERM: rc %d" % rc, d)
holder.kill()
holder.wait()
print("PASS")
