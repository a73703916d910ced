#!/usr/bin/python3
"""SIGHUP reloads the config file without dropping anyone.

- A bad file (a syntax error; a value that does not parse) is refused: the
  log names file:line:column and the reason, the daemon keeps serving, the
  live allocation stays, and the config in force stays in force.
- A good file is applied: its reloadable setting
  (pool.empty_slab_release_seconds, 100000 -> 1) takes effect, seen as an
  emptied slab going back to the device, while a held allocation survives
  the reload untouched.
- A restart-only field that changed is reported as waiting for a restart.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, wait_for  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--slab_size=64MiB"])
config = os.path.join(d.workdir, "gpumemd.textproto")


def write(text):
    with open(config + ".new", "w") as f:
        f.write(text)
    os.rename(config + ".new", config)


write('backend: "sim"\npool {\n  empty_slab_release_seconds: 100000\n}\n')
d.proc.kill()
d.proc.wait()
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--slab_size=64MiB",
                          "--config=" + config], workdir=d.workdir)
d.wait_serving()
holder, held = d.hold("1MiB", "--gpus=0")
held_id = held["allocations"][0]["id"]


def reload_and_wait(marker, count):
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.log().count(marker) >= count, "%r in the log" % marker, daemon=d)


# 1. Syntax error on line 3.
write('backend: "sim"\npool {\n  empty_slab_release_seconds: = 1\n}\n')
reload_and_wait("reload refused", 1)
if config + ":3:" not in d.log():
    fail("a refused reload must name file:line (want %s:3:)" % config, d)
# 2. A value that parses as text but not as a size, on line 2.
write('backend: "sim"\npool { slab_size: "12 parsecs" }\n')
reload_and_wait("reload refused", 2)
if config + ":2:" not in d.log() or "pool.slab_size" not in d.log():
    fail("a bad value must be reported with its line and field", d)

# Still serving, the allocation is still there, and the old setting (slabs
# kept 100000 s) is still in force: a slab emptied now is not given back.
s = d.stats()
if s["devices"][0]["allocation_count"] != "1":
    fail("a refused reload dropped the held allocation: %s" % s["devices"][0], d)
_, other = d.hold("1MiB", "--gpus=1")
tmp_id = other["allocations"][0]["id"]
d.ctl("free", tmp_id)
time.sleep(2.5)  # > 2 maintenance passes of 1 s: a 1 s release would have run
if d.stats()["devices"][1]["slab_count"] != 1:
    fail("after a refused reload the old empty_slab_release_seconds must stay", d)

# 3. A good file: release after 1 s from now on; a restart-only change noted.
write('backend: "sim"\nsim_devices: "3x1GiB"\npool { empty_slab_release_seconds: 1 }\n')
reload_and_wait("gpumemd: reloaded", 1)
if "pool.empty_slab_release_seconds = 1 (config)" not in d.log():
    fail("the reload did not apply empty_slab_release_seconds", d)
if "sim_devices changed; these take effect at the next start" not in d.log():
    fail("a changed restart-only field must be reported", d)
wait_for(lambda: d.stats()["devices"][1]["slab_count"] == 0,
         "the empty slab to go back under the reloaded setting", timeout=30, daemon=d)
s = d.stats()
if s["devices"][0]["allocation_count"] != "1" or len(s["devices"]) != 2:
    fail("the good reload dropped an allocation or changed devices: %s" % s, d)
if d.ctl("free", held_id).stdout.strip() != "freed %s" % held_id:
    fail("the allocation held across reloads could not be freed", d)
holder.send_signal(signal.SIGINT)
holder.wait(30)
d.stop()
print("PASS")
