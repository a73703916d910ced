#!/usr/bin/python3
"""--metrics_listen: slow clients cannot hold the metrics endpoint.

The endpoint is bound to one explicit address (127.0.0.2, as a DaemonSet
binds the pod's IP, not 0.0.0.0): it answers there and nothing listens on
127.0.0.1 at that port. Forty raw TCP clients hold connections to it: twenty
each send half an HTTP request and stay silent, twenty send nothing. While
they do, a scrape (another connection) is answered in under 1 s (with
civetweb's four workers, before, four such clients made a scrape wait 4.7 s
and twenty 24.7 s: each held a worker until its 5 s timeout). Each of them
is then closed by the daemon within its request timeout (5 s) plus slack, a
request that never ends is refused past 8 KiB, another path is 404, and a
scrape still works afterwards.
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
for i in range(40):
    s = socket.create_connection((ADDR, port), timeout=10)
    if i % 2 == 0:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: half a request
    slow.append(s)
time.sleep(0.3)  # the daemon has taken every one by now

t0 = time.monotonic()
body = scrape(url, timeout=10)
took = time.monotonic() - t0
if "gpumemd_" not in body:
    fail("the scrape beside forty slow clients has no gpumemd_ samples", d)
if took >= 1.0:
    fail("a scrape beside forty slow clients took %.2f s (>= 1 s)" % took, d)
print("scrape beside 20 half-request and 20 silent clients: %.3f s" % took)

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
    # The daemon closes it without an answer; what matters is the close.
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

# A request that never ends is refused past 8 KiB; another path is 404.
s = socket.create_connection((ADDR, port), timeout=10)
try:
    s.sendall(b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 9000)
except OSError:
    pass
status = s.recv(64)
s.close()
if not status.startswith(b"HTTP/1.1 431"):
    fail("a 9 KB request head was answered %r, not 431" % status, d)
s = socket.create_connection((ADDR, port), timeout=10)
s.sendall(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
status = s.recv(64)
s.close()
if not status.startswith(b"HTTP/1.1 404"):
    fail("GET /other was answered %r, not 404" % status, d)
d.stop()
print("PASS")
