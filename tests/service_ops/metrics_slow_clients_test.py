#!/usr/bin/python3
"""--metrics_listen: slow clients cannot hold the metrics endpoint.

The endpoint is bound to one explicit address (127.0.0.2, as a DaemonSet
binds the pod's IP, not 0.0.0.0): it answers there and nothing listens on
127.0.0.1 at that port. Three raw TCP clients each send half an HTTP request
and stay silent; while they hold their connections a scrape (a fourth
connection) is answered in under 1 s (with one civetweb worker, as before,
it waited for the first of them to time out, 30 s by civetweb's default).
Each half-request connection is then closed by the daemon within its
request timeout (5 s) plus slack, and a scrape still works afterwards.
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, scrape  # noqa: E402
import re  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
ADDR = "127.0.0.2"
d = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB", "--metrics_listen=%s:0" % ADDR])
d.wait_serving()
m = re.search(r"metrics on http://127\.0\.0\.2:(\d+)/metrics", d.log())
if not m:
    fail("the daemon did not log its metrics address on %s" % ADDR, d)
port = int(m.group(1))
url = "http://%s:%d/metrics" % (ADDR, port)
if "gpumemd_" not in scrape(url):
    fail("the first scrape has no gpumemd_ samples", d)

# Bound to that address only.
probe = socket.socket()
probe.settimeout(2)
try:
    probe.connect(("127.0.0.1", port))
    fail("something answers on 127.0.0.1:%d: the endpoint is not bound to %s only" % (port, ADDR), d)
except (ConnectionRefusedError, OSError):
    pass
finally:
    probe.close()

slow = []
for i in range(3):
    s = socket.create_connection((ADDR, port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: half a request
    slow.append(s)
time.sleep(0.3)  # civetweb has handed each to a worker by now

t0 = time.monotonic()
body = scrape(url, timeout=10)
took = time.monotonic() - t0
if "gpumemd_" not in body:
    fail("the scrape beside three slow clients has no gpumemd_ samples", d)
if took >= 1.0:
    fail("a scrape beside three half-request clients took %.2f s (>= 1 s)" % took, d)
print("scrape beside 3 half-request clients: %.3f s" % took)

# The slow ones are dropped after the request timeout (5 s), not held.
t1 = time.monotonic()
for s in slow:
    s.settimeout(12)
    try:
        data = s.recv(4096)
    except socket.timeout:
        fail("a half-request connection was still open %.1f s later" % (time.monotonic() - t1), d)
    except ConnectionResetError:
        data = b""
    # civetweb may answer 408/400 before closing; what matters is the close.
    while data:
        try:
            data = s.recv(4096)
        except (socket.timeout, ConnectionResetError):
            break
    s.close()
closed_after = time.monotonic() - t1
if closed_after > 9.0:
    fail("the half-request connections were closed only after %.1f s" % closed_after, d)
print("half-request connections closed by the daemon after %.1f s" % (closed_after + 0.3))
if "gpumemd_" not in scrape(url):
    fail("no scrape after the slow clients left", d)
d.stop()
print("PASS")
