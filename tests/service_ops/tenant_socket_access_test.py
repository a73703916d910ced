#!/usr/bin/python3
"""Tenant sockets are reachable only by the uids/gids they are meant for.

Needs root (connects as other uids with setpriv); otherwise SKIP. A config
with three socket tenants:
- "team" (uids 4242): owner 4242, group root, 0600 (the default for a
  tenant with uids only): uid 4242 connects, uid 65534 gets EACCES;
- "grp" (gids 4343): owner root, group 4343, 0660: a process of gid 4343
  (uid 5000) connects, uid 65534 gets EACCES;
- "open" (no uids or gids) with socket_mode "0666": uid 65534 connects;
and tenant_socket_dir, made by the daemon, is 0711 (uid 65534 cannot list
it). A bad socket_mode ("0777") is refused at start naming the setting.
SIGHUP with team's socket_mode "0666": the live socket changes, uid 65534
connects; the allocating client as uid 4242 through team's socket is
charged to team.
"""
import errno
import os
import signal
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_harness import Daemon, fail, wait_for  # noqa: E402

gpumemd, ctl = sys.argv[1], sys.argv[2]
if os.getuid() != 0 or not os.path.exists("/usr/bin/setpriv"):
    print("SKIP: needs root and setpriv to connect as other uids")
    print("PASS")
    sys.exit(0)

workdir = tempfile.mkdtemp(prefix="/tmp/gpumemd-access-")
os.chmod(workdir, 0o755)  # other uids must reach what is inside
tdir = os.path.join(workdir, "tenants")
config = os.path.join(workdir, "gpumemd.textproto")


def write(team_mode=""):
    with open(config + ".new", "w") as f:
        f.write('tenant_socket_dir: "%s"\n' % tdir)
        f.write('tenant { name: "team" uids: [4242] socket: "team.sock" %s}\n' %
                ('socket_mode: "%s" ' % team_mode if team_mode else ""))
        f.write('tenant { name: "grp" gids: [4343] socket: "grp.sock" }\n')
        f.write('tenant { name: "open" socket: "open.sock" socket_mode: "0666" }\n')
        f.write('default_tenant: "open"\n')
    os.rename(config + ".new", config)


CONNECT = ("import socket, sys\n"
           "s = socket.socket(socket.AF_UNIX)\n"
           "try:\n"
           "    s.connect(sys.argv[1])\n"
           "    print('connected')\n"
           "except OSError as e:\n"
           "    print('errno', e.errno)\n")


def connect_as(uid, gid, path):
    r = subprocess.run(["/usr/bin/setpriv", "--reuid=%d" % uid, "--regid=%d" % gid,
                        "--clear-groups", sys.executable, "-c", CONNECT, path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    return r.stdout.strip() or r.stderr.strip()


EACCES = "errno %d" % errno.EACCES

# A bad mode is refused at start, naming the setting.
with open(config, "w") as f:
    f.write('tenant_socket_dir: "%s"\n'
            'tenant { name: "bad" uids: [1] socket: "bad.sock" socket_mode: "0777" }\n' % tdir)
bad = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB", "--config=" + config], workdir=workdir)
rc = bad.wait_exit(30)
if rc == 0 or "socket_mode 0777 is not a socket mode" not in bad.log():
    fail("socket_mode \"0777\" must be refused at start naming socket_mode (exit %s)" % rc, bad)

write()
d = Daemon(gpumemd, ctl, ["--sim_devices=1x1GiB", "--slab_size=16MiB", "--config=" + config],
           workdir=workdir)
d.wait_serving()
team, grp, opened = (os.path.join(tdir, n) for n in ("team.sock", "grp.sock", "open.sock"))
for path in (team, grp, opened):
    wait_for(lambda: os.path.exists(path), path, daemon=d)

st = os.stat(tdir)
if stat.S_IMODE(st.st_mode) != 0o711:
    fail("tenant_socket_dir is mode %o, not 0711" % stat.S_IMODE(st.st_mode), d)
for path, uid, gid, mode in ((team, 4242, 0, 0o600), (grp, 0, 4343, 0o660), (opened, 0, 0, 0o666)):
    st = os.lstat(path)
    got = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    if not stat.S_ISSOCK(st.st_mode) or got != (uid, gid, mode):
        fail("%s: owner, group, mode %s, expected %s" % (path, got, (uid, gid, oct(mode))), d)

r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    "ls", tdir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
if r.returncode == 0:
    fail("uid 65534 could list tenant_socket_dir: %r" % r.stdout, d)

cases = [
    (4242, 4242, team, "connected"), (65534, 65534, team, EACCES),
    (5000, 4343, grp, "connected"), (65534, 65534, grp, EACCES), (4242, 4242, grp, EACCES),
    (65534, 65534, opened, "connected"),
]
for uid, gid, path, want in cases:
    got = connect_as(uid, gid, path)
    if got != want:
        fail("uid %d gid %d connecting to %s: %r, expected %r" % (uid, gid, path, got, want), d)
    print("uid %d gid %d -> %s: %s" % (uid, gid, os.path.basename(path), got))

# The tenant's uid allocates through it, charged to team.
ctl_copy = os.path.join(workdir, "gpumemctl")
subprocess.run(["cp", ctl, ctl_copy], check=True)
os.chmod(ctl_copy, 0o755)
r = subprocess.run(["/usr/bin/setpriv", "--reuid=4242", "--regid=4242", "--clear-groups",
                    ctl_copy, "--socket=" + team, "alloc", "1MiB"],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
if r.returncode != 0:
    fail("uid 4242 could not allocate through team's socket: %s" % r.stderr, d)

# A reload that opens team's socket changes the live one.
write(team_mode="0666")
before = d.log().count("gpumemd: reloaded")
d.signal(signal.SIGHUP)
wait_for(lambda: d.log().count("gpumemd: reloaded") > before, "the reload", daemon=d)
if stat.S_IMODE(os.lstat(team).st_mode) != 0o666:
    fail("after the reload team.sock is mode %o, not 0666" % stat.S_IMODE(os.lstat(team).st_mode), d)
if connect_as(65534, 65534, team) != "connected":
    fail("after the reload uid 65534 still cannot connect to team.sock", d)
d.stop()
print("PASS")
