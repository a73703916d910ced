"""python3 -m gpumem COMMAND [--socket PATH] [--json]

  stats     devices as the daemon sees them, and this process's pool
  session   this process's session and tenant
  tenants   the tenants the caller may see: quota, current, peak
  ledger    the newest ledger events [--tenant NAME] [--limit N]
  meminfo   what the caller's tenant may still take per device (free/total)

Exit status: 0 ok, 1 the daemon refused or could not be reached (the
message is printed), 2 usage.
"""
import argparse
import json
import sys

import gpumem


def _bytes(n):
    n = int(n)
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return "%.2f %s" % (n / div, unit)
    return "%d B" % n


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m gpumem",
                                description="gpumemd from Python: " + __doc__.splitlines()[0])
    p.add_argument("command", choices=["stats", "session", "tenants", "ledger", "meminfo"])
    p.add_argument("--socket", default=None, help="the daemon's socket ($GPUMEMD_SOCKET)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--tenant", default=None, help="ledger: only this tenant's events")
    p.add_argument("--limit", type=int, default=20, help="ledger: the newest N events")
    a = p.parse_args(argv)
    try:
        with gpumem.connect(a.socket) as c:
            if a.command == "stats":
                out = c.stats()
                if a.json:
                    result = out
                else:
                    d = out["daemon"]
                    print("backend: %s" % d.get("backend", "?"))
                    print("%-4s %-40s %12s %12s %12s %12s" % ("DEV", "UUID", "TOTAL", "USED",
                                                               "FREE", "POOLED"))
                    for dev in d.get("devices", []):
                        print("%-4d %-40s %12s %12s %12s %12s" % (
                            dev["index"], dev["uuid"], _bytes(dev["total_bytes"]),
                            _bytes(dev["used_bytes"]), _bytes(dev["free_bytes"]),
                            _bytes(dev["pooled_bytes"])))
                    print("this process: %d leases, %s leased, %s in use" % (
                        out["leases"], _bytes(out["leased_bytes"]), _bytes(out["in_use_bytes"])))
                    return 0
            elif a.command == "session":
                result = c.session()
            elif a.command == "tenants":
                rows = c.tenants()
                if not a.json:
                    print("%-20s %12s %12s %10s  %s" % ("TENANT", "CURRENT", "PEAK", "ALLOCS",
                                                         "QUOTA"))
                    for t in rows:
                        q = t.get("quota") or {}
                        quota = _bytes(q["total_bytes"]) if "total_bytes" in q else "-"
                        print("%-20s %12s %12s %10d  %s" % (
                            t["name"], _bytes(t["current_bytes"]), _bytes(t["peak_bytes"]),
                            t["allocation_count"], quota))
                    return 0
                result = rows
            elif a.command == "ledger":
                events, _ = c.ledger(tenant=a.tenant, limit=a.limit, newest=True)
                if not a.json:
                    for e in events:
                        print("seq=%d %-14s tenant=%s pid=%d device=%d bytes=%d id=%d" % (
                            e["seq"], e["kind"], e["tenant"], e["pid"], e["device"],
                            e["bytes"], e["allocation_id"]))
                    return 0
                result = events
            else:  # meminfo
                rows = []
                for d in range(c.device_count()):
                    free, total = c.mem_get_info(d)
                    rows.append({"device": d, "free_bytes": free, "total_bytes": total})
                if not a.json:
                    print("%-4s %12s %12s" % ("DEV", "FREE", "TOTAL"))
                    for r in rows:
                        print("%-4d %12s %12s" % (r["device"], _bytes(r["free_bytes"]),
                                                  _bytes(r["total_bytes"])))
                    return 0
                result = rows
            print(json.dumps(result, indent=1, sort_keys=True))
            return 0
    except gpumem.Error as e:
        print("gpumem: %s" % e, file=sys.stderr)
        return 1
    except ImportError as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
