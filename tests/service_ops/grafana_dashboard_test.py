#!/usr/bin/python3
"""deploy/grafana: the dashboard is valid JSON that Grafana can import or
provision (uid, title, schemaVersion, a Prometheus data-source variable,
panels with unique ids, positions and queries on that data source), the
provisioning files parse, and every metric a query names appears in a scrape
of a live daemon (--metrics_listen) with the labels the query groups,
selects and names series by.

The daemon is given something to show first: a quota with a device limit,
memory held on both devices, a refusal, a Free, so that every family has
samples (counters with labels have none before their first event).

argv: gpumemd, gpumemctl, the dashboard JSON, the dashboard provider YAML,
the data source YAML.
"""
import grp
import json
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, scrape, wait_for  # noqa: E402

gpumemd, ctl, dashboard_path, provider_path, datasource_path = sys.argv[1:6]

# --- the files ---------------------------------------------------------
with open(dashboard_path) as f:
    try:
        dash = json.load(f)
    except ValueError as e:
        fail("%s is not JSON: %s" % (dashboard_path, e))
for key in ("uid", "title", "schemaVersion", "panels", "templating"):
    if key not in dash:
        fail("the dashboard has no %r" % key)
if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"]):
    fail("uid %r is not one Grafana accepts" % dash["uid"])
variables = {v["name"]: v for v in dash["templating"]["list"]}
ds = variables.get("datasource")
if ds is None or ds["type"] != "datasource" or ds["query"] != "prometheus":
    fail("no Prometheus data-source variable: %r" % ds)
if any(i["type"] == "datasource" and i["pluginId"] != "prometheus" for i in dash.get("__inputs", [])):
    fail("an import input that is not Prometheus")

panels = []
for p in dash["panels"]:
    panels.append(p)
    panels.extend(p.get("panels", []))
ids = [p["id"] for p in panels]
if len(ids) != len(set(ids)):
    fail("panel ids repeat: %s" % ids)
queries = []  # (panel title, target)
for p in panels:
    gp = p.get("gridPos", {})
    if not all(isinstance(gp.get(k), int) for k in ("x", "y", "w", "h")) or gp["x"] + gp["w"] > 24:
        fail("panel %r has no valid gridPos: %r" % (p.get("title"), gp))
    if p["type"] == "row":
        continue
    if p.get("datasource", {}).get("uid") != "${datasource}":
        fail("panel %r does not use the data-source variable" % p["title"])
    if not p.get("targets"):
        fail("panel %r has no query" % p["title"])
    for t in p["targets"]:
        if not t.get("expr") or t.get("datasource", {}).get("uid") != "${datasource}":
            fail("panel %r: a target without expr or data source: %r" % (p["title"], t))
        queries.append((p["title"], t))
types = {p["type"] for p in panels}
for want in ("timeseries", "heatmap"):
    if want not in types:
        fail("no %s panel" % want)
if not any(p["type"] == "timeseries" and
           p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
           and "gpumemd_device_used_bytes" in json.dumps(p["targets"]) for p in panels):
    fail("no stacked device memory panel")
dev_var = variables.get("device")
if dev_var is None:
    fail("no device variable")
queries.append(("variable device", {"expr": dev_var["definition"]}))

with open(provider_path) as f:
    provider = yaml.safe_load(f)
prov = provider["providers"][0]
if provider.get("apiVersion") != 1 or prov["type"] != "file" or not prov["options"]["path"].startswith("/"):
    fail("dashboard provider: %r" % provider)
with open(datasource_path) as f:
    dsy = yaml.safe_load(f)
if dsy.get("apiVersion") != 1 or dsy["datasources"][0]["type"] != "prometheus":
    fail("data source: %r" % dsy)
print("dashboard: %d panels, %d queries; provisioning files parse" % (len(panels), len(queries)))

# --- a live daemon with something to show ---------------------------------
ADMIN = "--admin_group=" + grp.getgrgid(os.getgid()).gr_name
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--slab_size=64MiB",
                          "--metrics_listen=127.0.0.1:0", ADMIN])
d.wait_serving()
url = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", d.log()).group(1)
d.ctl("quota", "uid-%d" % os.getuid(), "--total=512MiB", "--device=1:256MiB")
h1, _ = d.hold("8MiB", "--gpus=0")
h2, a2 = d.hold("4MiB", "--gpus=1", "--wait=1ms")
h3, a3 = d.hold("1MiB", "--gpus=1")
r = d.ctl("alloc", "600MiB", check=False)  # over the quota
if r.returncode != 1 or "RESOURCE_EXHAUSTED" not in r.stderr:
    fail("expected a quota refusal: %s" % r.stderr, d)
d.ctl("free", a3["allocations"][0]["id"])
wait_for(lambda: "gpumemd_frees_total 1" in scrape(url), "the free in the scrape", daemon=d)

labels_of = {}  # metric name -> set of label names seen
for line in scrape(url).splitlines():
    if not line or line.startswith("#"):
        continue
    head = line.rsplit(" ", 1)[0]
    name, _, rest = head.partition("{")
    labels_of.setdefault(name, set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest))

missing = []
for title, t in queries:
    expr = t["expr"]
    names = set(re.findall(r"\bgpumemd_[a-z0-9_]+\b", expr))
    if not names:
        missing.append("%s: %r names no gpumemd metric" % (title, expr))
    for n in sorted(names):
        if n not in labels_of:
            missing.append("%s: %s is not in the scrape" % (title, n))
    have = set().union(*(labels_of.get(n, set()) for n in names)) if names else set()
    # Labels the query selects on, groups by, and the legend names.
    used = set(re.findall(r"([a-z_]+)\s*=~?\s*\"", expr))
    for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        used.update(x.strip() for x in group.split(",") if x.strip())
    m = re.match(r"label_values\(\s*([a-z0-9_]+)\s*,\s*([a-z_]+)\s*\)", expr)
    if m:
        used.add(m.group(2))
    legend = set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", t.get("legendFormat", "")))
    for lab in sorted(used | legend):
        if lab not in have:
            missing.append("%s: label %r is on none of %s" % (title, lab, sorted(names)))
for h in (h1, h2, h3):
    h.terminate()
    h.wait(30)
d.stop()
if missing:
    fail("\n".join(missing))
print("every metric and label the dashboard queries is in a live scrape")
print("PASS")
