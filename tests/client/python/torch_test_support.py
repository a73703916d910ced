"""What the stand-in-torch tests share: a check that ends the test with a
message, the daemon's used bytes per device (from gpumemctl stats --json,
argv[1] of every such test), and the sizes they speak in."""
import json
import subprocess
import sys

CTL = sys.argv[1]
MiB, GiB = 1 << 20, 1 << 30


def check(cond, what):
    if not cond:
        print("FAIL: " + what, file=sys.stderr)
        sys.exit(1)


def daemon_used(device):
    out = subprocess.run([CTL, "stats", "--json"], check=True, capture_output=True, text=True)
    return int(json.loads(out.stdout)["devices"][device]["used_bytes"])
