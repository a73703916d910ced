#!/usr/bin/python3
"""--metrics_listen: a Prometheus scrape agrees with GetStats.

With allocations held on two devices by two processes, a refusal for
capacity and one for a bad argument, and one Free, the scrape shows:
per-device gauges equal to GetStats' figures, tenant gauges (totals and per
device) equal to GetStats' tenant rows, gpumemd_allocations_total per device, refusals by
reason, gpumemd_frees_total, and the latency histogram counting every
Allocate, whether it came over the Stream RPC or unary. Without the flag no HTTP port is opened. A port in use is a
start-up error.

Quota gauges (gpumemd_tenant_quota_bytes, gpumemd_tenant_device_quota_bytes,
gpumemd_tenant_quota_allocations) equal GetStats' tenant quota: no sample
for an unlimited tenant; after SetQuota the new figures (and a limit lifted
loses its sample); with tenants in the config, the configured quota, then
SetQuota's.
"""
import grp
import os
import re
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, parse_metrics, scrape, wait_for  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
# The test's own group administers (SetQuota), root or not.
ADMIN = "--admin_group=" + grp.getgrgid(os.getgid()).gr_name
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--slab_size=64MiB",
                          "--metrics_listen=127.0.0.1:0", ADMIN])
d.wait_serving()
m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", d.log())
if not m:
    fail("the daemon did not log its metrics address", d)
url = m.group(1)

# The counters and the histogram see both paths: gpumemctl's library uses
# the Stream RPC, and --wait makes it call Allocate unary.
UNARY = "--wait=1ms"
h1, a1 = d.hold("3MiB", "--gpus=0")                    # over the stream
h2, a2 = d.hold("5MiB", "--shards=2", UNARY)          # one shard per device
h3, a3 = d.hold("1MiB", "--gpus=1", UNARY)
r = d.ctl("alloc", "900MiB", "--shards=2", "--gpus=0,1", UNARY, check=False)  # fits
r = d.ctl("alloc", "1GiB", "--gpus=0", check=False)   # stream; a device holding 5.5 MiB
if r.returncode != 1 or "RESOURCE_EXHAUSTED" not in r.stderr:
    fail("expected a capacity refusal: %s" % r.stderr, d)
r = d.ctl("alloc", "5GiB", UNARY, check=False)        # larger than any device
if r.returncode != 1 or "INVALID_ARGUMENT" not in r.stderr:
    fail("expected INVALID_ARGUMENT: %s" % r.stderr, d)
d.ctl("free", a3["allocations"][0]["id"])

# gpumemctl without --hold leaves its memory to session-end reclaim, which
# is asynchronous: wait until only the held blocks remain, then read GetStats
# on both sides of the scrape and use a reading where they agree.
wait_for(lambda: [dev["allocation_count"] for dev in d.stats()["devices"]] == ["2", "1"],
         "only the held allocations to remain", daemon=d)
for attempt in range(10):
    before = d.stats()
    metrics = parse_metrics(scrape(url))
    stats = d.stats()
    if before == stats:
        break
else:
    fail("GetStats never held still around a scrape", d)


def metric(name, **labels):
    key = (name, frozenset(labels.items()))
    if key not in metrics:
        fail("no sample %s%s in the scrape" % (name, labels), d)
    return metrics[key]


for dev in stats["devices"]:
    labels = {"device": str(dev["index"]), "uuid": dev["uuid"]}
    for field, name in [("total_bytes", "gpumemd_device_total_bytes"),
                        ("used_bytes", "gpumemd_device_used_bytes"),
                        ("pooled_bytes", "gpumemd_device_pooled_bytes"),
                        ("free_bytes", "gpumemd_device_free_bytes"),
                        ("retained_bytes", "gpumemd_device_retained_bytes"),
                        ("largest_free_block_bytes", "gpumemd_device_largest_free_block_bytes"),
                        ("slab_count", "gpumemd_device_slabs"),
                        ("allocation_count", "gpumemd_device_allocations")]:
        want = float(dev[field])
        got = metric(name, **labels)
        if got != want:
            fail("%s device %s: scrape %s, GetStats %s" % (name, dev["index"], got, want), d)
    if abs(metric("gpumemd_device_fragmentation", **labels) - dev["fragmentation"]) > 1e-9:
        fail("fragmentation of device %s" % dev["index"], d)

uid = os.getuid()
mine = [t for t in stats["tenants"] if t["tenant"] == uid]
if len(mine) != 1:
    fail("GetStats has no tenant row for uid %d: %s" % (uid, stats["tenants"]), d)
for t in stats["tenants"]:
    tenant = t["name"]
    tenant_id = str(t["tenant"])
    if tenant != "uid-%d" % t["tenant"]:
        fail("uid tenant named %r" % tenant, d)
    for field, name in [("used_bytes", "gpumemd_tenant_used_bytes"),
                        ("retained_bytes", "gpumemd_tenant_retained_bytes"),
                        ("allocation_count", "gpumemd_tenant_allocations"),
                        ("peak_bytes", "gpumemd_tenant_peak_bytes"),
                        ("waiting_requests", "gpumemd_tenant_waiting_requests")]:
        got = metric(name, tenant=tenant, tenant_id=tenant_id)
        if got != float(t[field]):
            fail("%s %s: scrape %s, GetStats %s" % (name, tenant, got, t[field]), d)
    for dev in t["devices"]:
        labels = {"tenant": tenant, "tenant_id": tenant_id, "device": str(dev["device_index"])}
        for field, name in [("used_bytes", "gpumemd_tenant_device_used_bytes"),
                            ("retained_bytes", "gpumemd_tenant_device_retained_bytes"),
                            ("slab_count", "gpumemd_tenant_device_slabs")]:
            if metric(name, **labels) != float(dev[field]):
                fail("%s %s: scrape vs GetStats" % (name, labels), d)
if int(mine[0]["used_bytes"]) != (3 << 20) + (5 << 20):
    fail("held bytes: %s" % mine[0]["used_bytes"], d)
if metric("gpumemd_sessions") != len(stats["sessions"]):
    fail("sessions gauge", d)
# Nothing waits here: the daemon-wide gauge is GetStats' counter (0).
if metric("gpumemd_waiting_requests") != float(
        d.stats(counters=True)["counters"].get("waiting_requests", 0)):
    fail("waiting gauge", d)
if int(mine[0]["peak_bytes"]) < (3 << 20) + (5 << 20) + (900 << 20):
    fail("peak below what was held at once: %s" % mine[0]["peak_bytes"], d)

# Counters: device 0 got a1 + a shard of a2 + a shard of the 900 MiB call;
# device 1 the other shards and a3.
if metric("gpumemd_allocations_total", device="0") != 3:
    fail("allocations on device 0: %s" % metric("gpumemd_allocations_total", device="0"), d)
if metric("gpumemd_allocations_total", device="1") != 3:
    fail("allocations on device 1", d)
if metric("gpumemd_allocation_refusals_total", reason="capacity") != 1:
    fail("capacity refusals", d)
if metric("gpumemd_allocation_refusals_total", reason="invalid_argument") != 1:
    fail("invalid_argument refusals", d)
# The one explicit free (gpumemctl free, over the stream).
if metric("gpumemd_frees_total") != 1:
    fail("frees: %s" % metric("gpumemd_frees_total"), d)
# 6 Allocate calls, every one timed.
if metric("gpumemd_allocation_latency_seconds_count") != 6:
    fail("latency histogram count: %s" % metric("gpumemd_allocation_latency_seconds_count"), d)
if metric("gpumemd_allocation_latency_seconds_bucket", le="+Inf") != 6:
    fail("latency histogram +Inf bucket", d)
print("scrape matches GetStats for %d devices; counters as expected" % len(stats["devices"]))

QUOTA = ("gpumemd_tenant_quota_bytes", "gpumemd_tenant_device_quota_bytes",
         "gpumemd_tenant_quota_allocations")


def quota_samples(metrics, tenant):
    """{(name, device or None): value} of the quota gauges of `tenant`."""
    out = {}
    for (name, labels), value in metrics.items():
        labels = dict(labels)
        if name in QUOTA and labels.get("tenant_id") == tenant:
            out[(name, labels.get("device"))] = value
    return out


def check_quota(daemon, url, tenant_id, want):
    """The scrape's quota gauges of tenant `tenant_id` equal `want` and
    GetStats' quota of its row (read on both sides of the scrape)."""
    for attempt in range(10):
        before = daemon.stats()
        metrics = parse_metrics(scrape(url))
        stats = daemon.stats()
        if before == stats:
            break
    else:
        fail("GetStats never held still around a scrape", daemon)
    row = [t for t in stats["tenants"] if t["tenant"] == tenant_id]
    if len(row) != 1:
        fail("GetStats has no row for tenant %d: %s" % (tenant_id, stats["tenants"]), daemon)
    q = row[0].get("quota") or {}
    from_stats = {}
    if "total_bytes" in q:
        from_stats[("gpumemd_tenant_quota_bytes", None)] = float(q["total_bytes"])
    if "max_allocations" in q:
        from_stats[("gpumemd_tenant_quota_allocations", None)] = float(q["max_allocations"])
    for dq in q.get("devices", []):
        from_stats[("gpumemd_tenant_device_quota_bytes", dq["device"])] = float(dq["bytes"])
    got = quota_samples(metrics, str(tenant_id))
    names = set(dict(labels).get("tenant") for (name, labels) in metrics
                if name in QUOTA and dict(labels).get("tenant_id") == str(tenant_id))
    if got and names != {row[0]["name"]}:
        fail("quota gauges of tenant %d labelled %s, GetStats names it %r"
             % (tenant_id, names, row[0]["name"]), daemon)
    if got != from_stats:
        fail("quota gauges %s differ from GetStats' quota %s" % (got, q), daemon)
    if got != want:
        fail("quota gauges %s, want %s" % (got, want), daemon)


# No tenants configured: uid tenants have no quota, so no quota sample.
check_quota(d, url, uid, {})
d.ctl("quota", "uid-%d" % uid, "--total=64MiB", "--device=1:8MiB", "--max_allocations=10")
check_quota(d, url, uid, {("gpumemd_tenant_quota_bytes", None): 64.0 * (1 << 20),
                          ("gpumemd_tenant_device_quota_bytes", "1"): 8.0 * (1 << 20),
                          ("gpumemd_tenant_quota_allocations", None): 10.0})
d.ctl("quota", "uid-%d" % uid, "--total=128MiB")  # the others lifted
check_quota(d, url, uid, {("gpumemd_tenant_quota_bytes", None): 128.0 * (1 << 20)})
print("quota gauges follow SetQuota")
for h in (h1, h2, h3):
    h.send_signal(signal.SIGINT)
    h.wait(30)
d.stop()

# Tenants in the config: the configured quota, then SetQuota's.
cfg = os.path.join(d.workdir, "tenants.textproto")
with open(cfg, "w") as f:
    f.write('tenant { name: "ml" uids: [%d] quota { total_bytes: "256MiB" '
            'device { device: "0" bytes: "100MiB" } } }\n' % uid)
t = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--slab_size=64MiB", "--config=" + cfg,
                          "--metrics_listen=127.0.0.1:0", ADMIN])
t.wait_serving()
turl = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", t.log()).group(1)
th, _ = t.hold("3MiB", "--gpus=0")
check_quota(t, turl, 1, {("gpumemd_tenant_quota_bytes", None): 256.0 * (1 << 20),
                         ("gpumemd_tenant_device_quota_bytes", "0"): 100.0 * (1 << 20)})
t.ctl("quota", "ml", "--total=512MiB", "--device=1:1GiB")
check_quota(t, turl, 1, {("gpumemd_tenant_quota_bytes", None): 512.0 * (1 << 20),
                         ("gpumemd_tenant_device_quota_bytes", "1"): 1024.0 * (1 << 20)})
print("quota gauges: configured quota, then SetQuota's")
th.send_signal(signal.SIGINT)
th.wait(30)
t.stop()

# Off by default: no metrics line, no TCP listener of ours.
plain = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB"])
plain.wait_serving()
if "metrics on" in plain.log():
    fail("metrics served without --metrics_listen", plain)
plain.stop()

# A port in use is a one-line start-up error.
busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
busy.bind(("127.0.0.1", 0))
busy.listen(1)
port = busy.getsockname()[1]
clash = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB",
                              "--metrics_listen=127.0.0.1:%d" % port])
rc = clash.wait_exit(30)
if rc != 1 or "cannot serve metrics on 127.0.0.1:%d" % port not in clash.log():
    fail("port in use: rc %d" % rc, clash)
print("PASS")
