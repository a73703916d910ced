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
- Tenant quotas reload (4 MiB -> 16 MiB lets an 8 MiB allocation through),
  and so does a membership change with its quota (1 MiB refuses 8 MiB);
  dropping the tenant section altogether (back to one tenant per uid) is
  reported as waiting for a restart and the tenants in force stay.
  (Moving uids between tenants: reload_tenants_test.py.)
- admin_group is reloadable: a group that does not exist is refused with
  its line; when run as root, a caller of uid/gid nobody/nogroup sees only
  its own sessions until admin_group "nogroup" is reloaded, then everyone's.
"""
import grp
import os
import shutil
import signal
import subprocess
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
# 4. admin_group: an unknown group is refused with its line.
write('backend: "sim"\n\nadmin_group: "no-such-group-gpumemd"\n')
reload_and_wait("reload refused", 3)
if config + ":3:1: admin_group" not in d.log():
    fail("an unknown admin group must be refused with its line", d)

# ... and a real one applies to the next GetStats. Needs root (to run a
# client as nobody) and no sandbox; otherwise this part is skipped.
if os.getuid() == 0 and grp.getgrgid(65534).gr_name:
    group = grp.getgrgid(65534).gr_name
    os.chmod(d.workdir, 0o755)  # nobody must reach the socket
    ctl_copy = os.path.join(d.workdir, "gpumemctl")
    shutil.copy(ctl, ctl_copy)
    os.chmod(ctl_copy, 0o755)

    def sessions_seen_by_nobody():
        r = subprocess.run([ctl_copy, "--socket=" + d.sock, "stats", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           user=65534, group=65534, extra_groups=[], timeout=60)
        if r.returncode != 0:
            fail("gpumemctl as nobody: %s" % r.stderr, d)
        import json
        return {s["uid"] for s in json.loads(r.stdout)["sessions"]}

    if 0 in sessions_seen_by_nobody():
        fail("nobody sees root's sessions before admin_group is set", d)
    write('backend: "sim"\nsim_devices: "3x1GiB"\npool { empty_slab_release_seconds: 1 }\n'
          'admin_group: "%s"\n' % group)
    reload_and_wait("gpumemd: reloaded", 2)
    if 'admin_group = "%s" (config)' % group not in d.log():
        fail("the reload did not apply admin_group", d)
    if 0 not in sessions_seen_by_nobody():
        fail("after admin_group \"%s\" was reloaded, nobody must see root's sessions" % group, d)
    print("admin_group reloaded: nobody (gid %d) sees every session" % 65534)
else:
    print("SKIP admin_group visibility part: needs root")

if d.ctl("free", held_id).stdout.strip() != "freed %s" % held_id:
    fail("the allocation held across reloads could not be freed", d)
holder.send_signal(signal.SIGINT)
holder.wait(30)
d.stop()

# 5. Tenant quotas reload, alone or with a membership change; switching
# back to one tenant per uid waits for a restart.
uid = os.getuid()
tenant = 'tenant {{ name: "me" uids: [{uid}] quota {{ total_bytes: "{q}" }} }}\n'
q = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--config=" + config])
write('backend: "sim"\n' + tenant.format(uid=uid, q="4MiB"))
q.proc.kill()
q.proc.wait()
q = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--config=" + config], workdir=q.workdir)
q.wait_serving()
r = q.ctl("alloc", "8MiB", check=False)
if r.returncode != 1 or "quota" not in r.stderr:
    fail("8 MiB over a 4 MiB quota should be refused: %s" % r.stderr, q)
write('backend: "sim"\n' + tenant.format(uid=uid, q="16MiB"))
q.signal(signal.SIGHUP)
wait_for(lambda: "quotas of 1 tenant(s) from the config" in q.log(), "the quota reload",
         daemon=q)
q.ctl("alloc", "8MiB")  # fits the reloaded 16 MiB
write('backend: "sim"\n' + tenant.format(uid=str(uid) + ", 4242", q="1MiB"))
q.signal(signal.SIGHUP)
wait_for(lambda: 'changed (members or priority) "me" (id 1)' in q.log(),
         "the membership change to be applied", daemon=q)
r = q.ctl("alloc", "8MiB", check=False)  # the changed section's 1 MiB quota applies
if r.returncode != 1 or "quota" not in r.stderr:
    fail("8 MiB over the reloaded 1 MiB quota should be refused: %s" % r.stderr, q)
write('backend: "sim"\n')
q.signal(signal.SIGHUP)
wait_for(lambda: "tenants (none configured now" in q.log(),
         "dropping the tenants to be left for a restart", daemon=q)
r = q.ctl("alloc", "8MiB", check=False)  # "me" and its 1 MiB are still in force
if r.returncode != 1 or "quota" not in r.stderr:
    fail("the tenants in force must stay when the section is dropped: %s" % r.stderr, q)
q.stop()
print("quota reload: 4 MiB -> 16 MiB -> 1 MiB with a membership change; "
      "dropping tenants left for restart")
print("PASS")
