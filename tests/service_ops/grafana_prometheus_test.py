#!/usr/bin/python3
"""deploy/grafana and deploy/prometheus run for real: Debian's Prometheus on
loopback scrapes a loaded gpumemd every second; every panel query (and the
device variable) is evaluated through its HTTP API and must return series
with the labels its legend and grouping name; every alert rule must fire.
The load: blocks held across a planned restart (and one lost: its holder
dies while the daemon is down), refusals for fragmentation,
capacity, quota and a bad device, a request that waits until a Free, quotas,
device 0 full, a ledger that cannot write (--ledger_max_pages=1), and at the
end the daemon stopped. Rules fire with `for: 0s` (a copy): the shipped
expressions against real series; their durations are promtool's unit tests
(run here, after `promtool check rules`).

argv: gpumemd, gpumemctl, libgpumem.so, the gpumem package's __init__.py,
the dashboard JSON, the rules file, the rules' unit tests.
"""
import grp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

gpumemd, ctl, lib, pkg_init, dashboard_path, rules_path, rules_test = [
    os.path.abspath(a) for a in sys.argv[1:8]]

# The library's ASan build loads in python3 only with its runtime first.
if "GPUMEMD_PROMTEST_REEXEC" not in os.environ:
    env = dict(os.environ, GPUMEMD_PROMTEST_REEXEC="1")
    ldd = subprocess.run(["ldd", lib], stdout=subprocess.PIPE, text=True).stdout
    for line in ldd.splitlines():
        if "libasan.so" in line and "=>" in line:
            env["LD_PRELOAD"] = line.split("=>")[1].split()[0]
            env["ASAN_OPTIONS"] = "detect_leaks=0"
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

os.environ.pop("LD_PRELOAD", None)  # not for the programs started below
os.environ["GPUMEM_LIBRARY"] = lib
sys.path.insert(0, os.path.dirname(os.path.dirname(pkg_init)))
import gpumem  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
for tool in (PROMETHEUS, PROMTOOL):
    if not os.access(tool, os.X_OK):
        print("FAIL: %s is missing: run tools/install-deps (Debian's prometheus)" % tool,
              file=sys.stderr)
        sys.exit(1)

work = tempfile.mkdtemp(prefix="/tmp/gpumemd-promtest-")
procs = []
T0 = time.monotonic()


def say(msg):
    print("[%5.1f s] %s" % (time.monotonic() - T0, msg), flush=True)


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(work, ignore_errors=True)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    for name in ("gpumemd.log", "prometheus.log"):
        try:
            with open(os.path.join(work, name)) as f:
                print("--- %s (end):\n%s" % (name, f.read()[-3000:]), file=sys.stderr)
        except OSError:
            pass
    cleanup()
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    fail("timed out waiting for " + what)


# --- promtool -----------------------------------------------------------------
for argv in ([PROMTOOL, "check", "rules", rules_path], [PROMTOOL, "test", "rules", rules_test]):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       cwd=os.path.dirname(rules_test))
    if r.returncode != 0 or "SUCCESS" not in r.stdout:
        fail("%s:\n%s" % (" ".join(argv), r.stdout))
rule_names = re.findall(r"^\s*- alert:\s*(\S+)", open(rules_path).read(), re.M)
say("promtool: %d rules check, their unit tests pass" % len(rule_names))

# --- gpumemd and Prometheus -------------------------------------------------------
sock = os.path.join(work, "gpumemd.sock")
metrics_port = free_port()
os.mkdir(os.path.join(work, "ledger"))
DAEMON = [gpumemd, "--backend=sim", "--sim_devices=2x1GiB", "--slab_size=64MiB",
          "--socket=" + sock, "--metrics_listen=127.0.0.1:%d" % metrics_port,
          "--ledger=" + os.path.join(work, "ledger", "ledger.db"), "--ledger_max_pages=1",
          "--admin_group=" + grp.getgrgid(os.getgid()).gr_name]
starts = [0]


def start_daemon():
    log = open(os.path.join(work, "gpumemd.log"), "a")
    p = subprocess.Popen(DAEMON, stdout=log, stderr=log)
    procs.append(p)
    starts[0] += 1
    wait_for(lambda: p.poll() is not None or open(os.path.join(work, "gpumemd.log")).read()
             .count("gpumemd: serving") >= starts[0], "gpumemd to serve")
    if p.poll() is not None:
        fail("gpumemd exited %s at start" % p.returncode)
    return p


daemon = start_daemon()
rules_copy = os.path.join(work, "rules.yml")
with open(rules_copy, "w") as f:
    f.write(re.sub(r"^(\s*)for:\s*\S+", r"\1for: 0s", open(rules_path).read(), flags=re.M))
prom_port = free_port()
with open(os.path.join(work, "prometheus.yml"), "w") as f:
    f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files: [%s]\n"
            "scrape_configs:\n  - job_name: gpumemd\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n" % (json.dumps(rules_copy), metrics_port))
prom = subprocess.Popen([PROMETHEUS, "--config.file=" + os.path.join(work, "prometheus.yml"),
                         "--storage.tsdb.path=" + os.path.join(work, "tsdb"),
                         "--web.listen-address=127.0.0.1:%d" % prom_port],
                        stdout=open(os.path.join(work, "prometheus.log"), "w"),
                        stderr=subprocess.STDOUT)
procs.append(prom)
API = "http://127.0.0.1:%d/api/v1/" % prom_port


def api(path, **params):
    url = API + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=20) as r:
        body = json.load(r)
    if body.get("status") != "success":
        fail("%s: %s" % (url, body))
    return body["data"]


def query(expr):
    return api("query", query=expr)["result"]


def prom_ready():
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % prom_port, timeout=2):
            return True
    except OSError:
        return prom.poll() is not None


wait_for(prom_ready, "Prometheus to be ready")
if prom.poll() is not None:
    fail("prometheus exited %s" % prom.returncode)
wait_for(lambda: query('up{job="gpumemd"} == 1'), "the first scrape")
say("Prometheus %s scrapes gpumemd on 127.0.0.1:%d every second" % (
    api("status/buildinfo")["version"], metrics_port))

# --- load ---------------------------------------------------------------------------
MiB = 1 << 20
c = gpumem.connect(sock)
row = [c.malloc(32 * MiB, gpus="0") for _ in range(32)]  # device 0: 16 slabs, full
keep1 = c.malloc(64 * MiB, gpus="1")
wait_for(lambda: query("gpumemd_device_used_bytes{device=\"0\"} >= %d" % (1 << 30)),
         "device 0 full in a scrape")

# A second client holds a block and dies while the daemon is down: that
# block is the restart's one loss (gpumemd_restart_lost_allocations).
holder = subprocess.Popen([ctl, "--socket=" + sock, "alloc", "1MiB", "--gpus=1", "--hold"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
procs.append(holder)
for line in holder.stderr:
    if "holding" in line:
        break
else:
    fail("gpumemctl alloc --hold exited %s before holding" % holder.wait())

daemon.send_signal(signal.SIGUSR2)  # a planned restart, on the same metrics port
if daemon.wait(60) != 75:
    fail("SIGUSR2: gpumemd exited %s, not 75" % daemon.returncode)
holder.kill()
holder.wait()
daemon = start_daemon()
wait_for(lambda: c.stats()["daemon"]["devices"][0]["allocation_count"] == 32, "the blocks back")
wait_for(lambda: query("gpumemd_restart_lost_allocations == 1"),
         "the dead holder's block counted lost in a scrape")
say("planned restart: the client's 33 blocks came back, the dead holder's 1 was lost; "
    "scrapes resume")

for b in row[::2]:  # 16 holes of 32 MiB, one per slab
    b.free()
for size, gpus, err in ((48 * MiB, "0", gpumem.ResourceExhausted),   # fragmentation
                        (600 * MiB, "0", gpumem.ResourceExhausted),  # capacity
                        (MiB, "7", gpumem.InvalidArgument)):         # no device 7
    for _ in range(5):
        try:
            c.malloc(size, gpus=gpus)
            fail("a %d MiB block on %s was served" % (size // MiB, gpus))
        except err:
            pass
waiter = subprocess.Popen([ctl, "--socket=" + sock, "alloc", "48MiB", "--gpus=0", "--wait=60s"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
procs.append(waiter)
wait_for(lambda: query("gpumemd_waiting_requests == 1"), "a waiting request in a scrape")
held = row[1::2]
while waiter.poll() is None and held:  # until a slab is empty: room for the waiter
    held.pop().free()
    time.sleep(0.2)
out, _ = waiter.communicate(timeout=60)
if waiter.returncode != 0:
    fail("the waiting request: %s" % out)
say("refusals for fragmentation, capacity and a bad device; a request waited until a Free")

uid = "uid-%d" % os.getuid()
r = subprocess.run([ctl, "--socket=" + sock, "quota", uid, "--total=2GiB", "--device=0:1GiB",
                    "--device=1:192MiB"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   text=True)
if r.returncode != 0:
    fail("gpumemctl quota: %s" % r.stdout)
for _ in range(5):
    try:
        c.malloc(256 * MiB, gpus="1")  # over the device's 192 MiB
        fail("a block over the device quota was served")
    except gpumem.ResourceExhausted:
        pass
while True:  # device 0 full again
    try:
        held.append(c.malloc(32 * MiB, gpus="0"))
    except gpumem.ResourceExhausted:
        break
    if len(held) > 40:
        fail("device 0 holds more than it has")
# The ledger's file may not grow (one page): its commits fail, and the
# events wait in memory.
for _ in range(700):
    c.malloc(20 * MiB, gpus="1").free()
wait_for(lambda: query("gpumemd_ledger_held_events > 1000"), "held ledger events in a scrape")
time.sleep(5)  # a few scrapes of it all for the rate windows
say("quota refusals; device 0 full again; 1400 events held by a failing ledger")

# --- every panel query ------------------------------------------------------------------
dash = json.load(open(dashboard_path))
panels = []
for p in dash["panels"]:
    panels.append(p)
    panels.extend(p.get("panels", []))
targets = [(p["title"], t) for p in panels if p["type"] != "row" for t in p.get("targets", [])]
var = [v for v in dash["templating"]["list"] if v["name"] == "device"][0]
results = []
for device in (".*", "0"):
    for title, t in targets:
        expr = t["expr"].replace("$__rate_interval", "15s").replace("$device", device)
        series = query(expr)
        if not series:
            fail("panel %r (device %s): %s returns nothing" % (title, device, expr))
        want = set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", t.get("legendFormat", "")))
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            want.update(x.strip() for x in group.split(",") if x.strip())
        if expr.startswith("histogram_quantile("):
            want.discard("le")  # the quantile consumes the buckets
        for s in series:
            missing = want - set(s["metric"])
            if missing:
                fail("panel %r: a series of %s lacks %s: %s" % (title, expr, missing, s))
            if device == "0" and "device" in s["metric"] and s["metric"]["device"] != "0":
                fail("panel %r with device 0 shows device %s" % (title, s["metric"]["device"]))
        results.append((title, t.get("legendFormat", ""), device, len(series)))
m = re.match(r"label_values\(\s*([a-z0-9_]+)\s*,\s*([a-z_]+)\s*\)", var["definition"])
devices = sorted(s["metric"][m.group(2)] for s in query(m.group(1)))
if devices != ["0", "1"]:
    fail("the device variable lists %s" % devices)
reasons = {s["metric"]["reason"] for s in query(
    'sum by (reason) (increase(gpumemd_allocation_refusals_total[10m]))')}
if not {"fragmentation", "capacity", "quota", "invalid_argument"} <= reasons:
    fail("Refusals by reason shows %s" % sorted(reasons))
tenants = {s["metric"]["tenant"] for s in query("sum by (tenant) (gpumemd_tenant_quota_bytes)")}
if uid not in tenants:
    fail("Tenant usage against quota has no quota for %s: %s" % (uid, tenants))
if not query("max_over_time(gpumemd_waiting_requests[10m]) >= 1"):
    fail("Waiting requests never showed the waiting request")
say("%d panel queries x 2 device choices evaluated: every one returns series with the "
    "labels its legend and grouping name" % len(targets))
for title, legend, device, n in results:
    if device == ".*":
        print("  %-30s %-28s %d series" % (title, legend or "-", n))

# --- alerts ------------------------------------------------------------------------------
def firing():
    return {a["labels"]["alertname"] for a in api("alerts")["alerts"] if a["state"] == "firing"}


def rule_states():
    return ["%s: %s %s %s" % (r["name"], r.get("state"), r.get("health"), r.get("lastError", ""))
            for g in api("rules")["groups"] for r in g["rules"]]


want = set(rule_names) - {"GpumemdDown"}
deadline = time.monotonic() + 60
while not want <= firing():
    try:  # refusals go on (a counter's first sample already counts its first ones)
        c.malloc(256 * MiB, gpus="1")
        fail("a block over the device quota was served")
    except gpumem.ResourceExhausted:
        pass
    if time.monotonic() > deadline:
        fail("alerts %s did not all fire; the rules say:\n  %s" % (
            sorted(want), "\n  ".join(rule_states())))
    time.sleep(0.5)
fired = firing()
for b in held + [keep1]:
    b.free()
c.close()
daemon.send_signal(signal.SIGTERM)
if daemon.wait(60) != 0:
    fail("gpumemd exited %s on SIGTERM" % daemon.returncode)
wait_for(lambda: "GpumemdDown" in firing(), "GpumemdDown to fire")
say("alerts fired: %s" % ", ".join(sorted(fired | firing())))
cleanup()
print("PASS")
