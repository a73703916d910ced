#!/usr/bin/python3
"""Socket activation without systemd: the test binds and listens on a Unix
socket, hands it to gpumemd as fd 3 with LISTEN_FDS=1 and LISTEN_PID=<the
daemon's pid> (what systemd does), and the daemon serves gRPC and the slab
channel on it, never binding --socket. On SIGTERM it exits 0 and leaves the
socket to its owner: the file stays and the socket still listens (systemd
would start the daemon again on the next connection). A LISTEN_FDS that
passes two sockets, or a socket that is not a listening Unix stream socket,
is a start-up error (exit 1) naming the problem."""
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
workdir = tempfile.mkdtemp(prefix="/tmp/gpumemd-ops-")
path = os.path.join(workdir, "activated.sock")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(path)
os.chmod(path, 0o666)
sock.listen(16)

unused = os.path.join(workdir, "never-bound.sock")
d = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--socket=" + unused],
           inherit_socket=sock, workdir=workdir)
d.sock = path  # gpumemctl talks to the inherited socket
d.wait_serving()
if "(socket from systemd)" not in d.log() or path not in d.log():
    fail("the daemon did not say it serves the inherited socket", d)
if os.path.exists(unused):
    fail("the daemon bound --socket although a socket was passed", d)
stats = d.stats()
if len(stats["devices"]) != 2:
    fail("stats over the inherited socket: %s" % stats, d)
# alloc maps the slab: the fd channel works on the same inherited socket.
out = d.ctl("alloc", "1MiB", "--gpus=1").stdout
if " 1 " not in out:
    fail("alloc over the inherited socket: %s" % out, d)
d.stop()
if not os.path.exists(path):
    fail("the daemon removed a socket file it does not own")
probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    probe.connect(path)  # queued on the test's (systemd's) listening socket
except OSError as e:
    fail("the inherited socket no longer listens after the daemon exited: %s" % e)
probe.close()
# The connection the probe left queued is what systemd would hand to the
# next daemon; a second daemon on the same socket serves again.
d2 = Daemon(gpumemd, ctl, ["--sim_devices=2x1GiB", "--socket=" + unused],
            inherit_socket=sock)
d2.sock = path
d2.wait_serving()
d2.ctl("stats")
d2.stop()

# Wrong things passed: each is exit 1 with a message.
two = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB"], inherit_socket=sock, listen_fds=2)
rc = two.wait_exit(30)
if rc != 1 or "takes exactly one" not in two.log():
    fail("two sockets: rc %d" % rc, two)
dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
dgram.bind(os.path.join(workdir, "dgram.sock"))
bad = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB"], inherit_socket=dgram)
rc = bad.wait_exit(30)
if rc != 1 or "not a listening Unix stream socket" not in bad.log():
    fail("datagram socket: rc %d" % rc, bad)
print("PASS")
