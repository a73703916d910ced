#!/usr/bin/python3
"""SIGHUP reloads the tenant section of a running daemon (issue 14, item 3).

Needs root (clients run as uid 65534 and 4243 through setuid); otherwise
it prints SKIP and passes. With a config file where uid 65534 belongs to
tenant t1:
- a process of uid 65534 holds 4 MiB, charged to t1;
- the file moves uid 65534 to a new tenant t2, adds t3 (also the new
  default_tenant) and changes t1's priority; SIGHUP: the held allocation is
  still there and still charged to t1 (GetStats' tenant row, the ledger),
  a new process of uid 65534 is charged to t2, a uid listed nowhere now
  resolves to t3, and GetUsage shows the new priorities; t1 keeps its id;
- a bad file (uid 65534 under two tenants) is refused with FILE:LINE and
  the tenants in force still resolve (uid 65534 -> t2);
- the file removes t1: its live allocation stays accounted to t1 (GetStats,
  GetUsage) until its process lets go, then t1 is gone from GetUsage;
- a restart with the same ledger: tenants are renumbered, and the ledger,
  which keys on names, still has t2's peak and t1's events.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, wait_for  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
if os.getuid() != 0:
    print("SKIP: needs root to run clients as other uids")
    print("PASS")
    sys.exit(0)

X = 65534       # the uid that moves from t1 to t2
OTHER = 4243    # listed by no tenant: the default_tenant's
MiB = 1 << 20

workdir = tempfile.mkdtemp(prefix="/tmp/gpumemd-ops-")
os.chmod(workdir, 0o755)  # the clients' uids must reach the socket
ctl_copy = os.path.join(workdir, "gpumemctl")
shutil.copy(ctl, ctl_copy)
os.chmod(ctl_copy, 0o755)
config = os.path.join(workdir, "gpumemd.textproto")
ledger = os.path.join(tempfile.mkdtemp(prefix="/tmp/gpumemd-ledger-"), "ledger.db")
args = ["--sim_devices=2x1GiB", "--slab_size=16MiB", "--config=" + config,
        "--ledger=" + ledger]


def write(text):
    with open(config + ".new", "w") as f:
        f.write(text)
    os.rename(config + ".new", config)


def as_uid(uid, *ctl_args, check=True):
    r = subprocess.run([ctl_copy, "--socket=" + d.sock] + list(ctl_args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       user=uid, group=uid, extra_groups=[], timeout=60)
    if check and r.returncode != 0:
        fail("gpumemctl %s as uid %d: %s" % (" ".join(ctl_args), uid, r.stderr), d)
    return r


def hold_as(uid, size):
    """gpumemctl alloc SIZE --hold --json as `uid`: (process, allocation id)."""
    p = subprocess.Popen([ctl_copy, "--socket=" + d.sock, "alloc", size, "--gpus=0",
                          "--hold", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, user=uid, group=uid,
                         extra_groups=[])
    text = ""
    while True:
        line = p.stdout.readline()
        if not line:
            fail("gpumemctl alloc --hold as uid %d ended without output" % uid, d)
        text += line
        try:
            return p, json.loads(text)["allocations"][0]["id"]
        except ValueError:
            continue


def rows():
    """GetStats' tenant rows as root: {name: (id, used bytes)}."""
    return {t["name"]: (t["tenant"], int(t["used_bytes"])) for t in d.stats()["tenants"]}


def usage(uid=0):
    r = as_uid(uid, "tenants", "--json") if uid else d.ctl("tenants", "--json")
    return {t["name"]: t for t in json.loads(r.stdout).get("tenants", [])}


def ledger_tenant_of(allocation_id):
    # The ledger commits in batches (every 100 ms): wait for the event.
    deadline = time.time() + 10
    while True:
        events = json.loads(d.ctl("ledger", "--limit=1000", "--json").stdout).get("events", [])
        for e in events:
            if e["kind"] == "ALLOCATE" and e["allocation_id"] == allocation_id:
                return e["tenant"]
        if time.time() > deadline:
            fail("no ALLOCATE event for allocation %s in the ledger after 10 s" % allocation_id, d)
        time.sleep(0.05)


reloads = [0]


def reload(refused=False):
    marker = "reload refused" if refused else "gpumemd: reloaded"
    before = d.log().count(marker)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.log().count(marker) > before, "%r in the log" % marker, daemon=d)


write('backend: "sim"\n'
      'tenant { name: "t1" uids: [%d] priority: 1 }\n' % X)
d = Daemon(gpumemd, ctl, args, workdir=workdir)
d.wait_serving()

# 1. uid X holds 4 MiB under t1.
h1, id1 = hold_as(X, "4MiB")
if rows().get("t1") != (1, 4 * MiB):
    fail("the first allocation should be t1's (id 1): %s" % rows(), d)
r = as_uid(OTHER, "tenants", check=False)
if r.returncode != 1 or "PERMISSION_DENIED" not in r.stderr:
    fail("uid %d belongs to no tenant yet: %s" % (OTHER, r.stderr), d)

# 2. Move uid X to t2 (new), add t3 as the default, t1's priority 1 -> 2.
write('backend: "sim"\n'
      'tenant { name: "t2" uids: [%d] priority: 5 quota { total_bytes: "64MiB" } }\n'
      'tenant { name: "t1" priority: 2 }\n'
      'tenant { name: "t3" }\n'
      'default_tenant: "t3"\n' % X)
reload()
if 'added "t2" (id 2), "t3" (id 3)' not in d.log():
    fail("the reload should add t2 and t3 with new ids", d)
seen = rows()
if seen.get("t1") != (1, 4 * MiB):
    fail("after the reload the held 4 MiB must still be t1's (id 1): %s" % seen, d)
h2, id2 = hold_as(X, "2MiB")
seen = rows()
if seen.get("t2") != (2, 2 * MiB) or seen.get("t1") != (1, 4 * MiB):
    fail("a new process of uid %d must be charged to t2: %s" % (X, seen), d)
if ledger_tenant_of(id1) != "t1" or ledger_tenant_of(id2) != "t2":
    fail("the ledger must record t1 for the old session and t2 for the new one", d)
if list(usage(OTHER)) != ["t3"]:
    fail("uid %d should now fall to default_tenant t3: %s" % (OTHER, usage(OTHER)), d)
u = usage()
if u["t1"]["priority"] != 2 or u["t2"]["priority"] != 5:
    fail("GetUsage should show the reloaded priorities: %s" % u, d)
if u["t1"]["current_bytes"] != str(4 * MiB) or u["t2"]["current_bytes"] != str(2 * MiB):
    fail("GetUsage current bytes: %s" % u, d)
if u["t2"]["quota"]["total_bytes"] != str(64 * MiB):
    fail("t2's quota from the reloaded file: %s" % u["t2"], d)
print("moved uid %d: live session stays t1, new session t2; t3 is the default" % X)

# 3. A bad file: uid X under two tenants (line 3). Refused; t2 still resolves.
write('backend: "sim"\n'
      'tenant { name: "t2" uids: [%d] }\n'
      'tenant { name: "t4" uids: [%d] }\n' % (X, X))
reload(refused=True)
if config + ":3:" not in d.log() or "uid %d is listed by tenant" % X not in d.log():
    fail("a duplicate uid must be refused with FILE:LINE", d)
if list(usage(X)) != ["t2"]:
    fail("after a refused reload uid %d must still resolve to t2: %s" % (X, usage(X)), d)
if "t4" in usage():
    fail("a refused file must add no tenant", d)

# 4. t1 removed: its live allocation stays accounted to it until freed.
write('backend: "sim"\n'
      'tenant { name: "t2" uids: [%d] priority: 5 }\n'
      'tenant { name: "t3" }\n'
      'default_tenant: "t3"\n' % X)
reload()
if 'removed "t1" (id 1)' not in d.log():
    fail("the reload should report t1 removed", d)
if rows().get("t1") != (1, 4 * MiB):
    fail("a removed tenant's live allocation must stay charged to it: %s" % rows(), d)
u = usage()
if "t1" not in u or u["t1"]["current_bytes"] != str(4 * MiB):
    fail("GetUsage must list a removed tenant while it holds memory: %s" % u, d)
h1.send_signal(signal.SIGINT)  # frees its allocation and exits
h1.wait(30)
wait_for(lambda: rows().get("t1", (1, 0))[1] == 0, "t1's allocation to be freed", daemon=d)
wait_for(lambda: "t1" not in usage(), "t1 to leave GetUsage once it holds nothing", daemon=d)
if rows().get("t2") != (2, 2 * MiB):
    fail("t2's allocation must be untouched by the reloads: %s" % rows(), d)
print("removed t1: accounted until freed, then gone")

# 5. Restart after the reloads: ids renumbered (t2 is 1 now), the ledger
# keys on names, so t2's usage history and t1's events are still its own.
h2.send_signal(signal.SIGINT)
h2.wait(30)
d.stop()
d = Daemon(gpumemd, ctl, args, workdir=workdir)
d.wait_serving()
u = usage()
if sorted(u) != ["t2", "t3"] or int(u["t2"]["peak_bytes"]) < 2 * MiB:
    fail("after a restart the ledger should still give t2 its peak: %s" % u, d)
events = json.loads(d.ctl("ledger", "--tenant=t1", "--json").stdout).get("events", [])
if [e["kind"] for e in events][:1] != ["ALLOCATE"] or len(events) < 2:
    fail("t1's ledger events (allocate, free) should survive the restart: %s" % events, d)
h3, _ = hold_as(X, "1MiB")
if rows().get("t2") != (1, 1 * MiB):
    fail("after a restart t2 is numbered from the file again (id 1): %s" % rows(), d)
h3.send_signal(signal.SIGINT)
h3.wait(30)
d.stop()
print("PASS")
