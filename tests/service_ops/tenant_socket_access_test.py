#!/usr/bin/python3
"""Tenant sockets are reachable only by the uids/gids they are meant for.

Needs root (connects as other uids with setpriv); otherwise SKIP. A config
with three socket tenants, each socket in a directory of its own whose
owner, group and search bits follow the socket's access:
- "team" (uids 4242): owner 4242, group root, 0600 (the default for a
  tenant with uids only), its directory 4242 0100: uid 4242 connects, uid
  65534 gets EACCES connecting, looking it up and listing the directory;
- "grp" (gids 4343): owner root, group 4343, 0660, directory 0710: a
  process of gid 4343 (uid 5000) connects, uid 65534 and 4242 get EACCES;
- "open" (no uids or gids) with socket_mode "0666", directory 0711: uid
  65534 connects;
and tenant_socket_dir, made by the daemon, is 0711 (uid 65534 cannot list
it). A bad socket_mode ("0777") is refused at start naming the setting.
SIGHUP with team's socket_mode "0666": the live socket and its directory
change, uid 65534 connects; the allocating client as uid 4242 through
team's socket is charged to team.
Then the same config under a daemon that is not root and holds CAP_CHOWN
only (as deploy/gpumemd.service runs it): it gives team's socket and
directory to uid 4242, changes them on a reload (taking them back first),
and removes both when it stops.
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
team, grp, opened = (os.path.join(tdir, n, n + ".sock") for n in ("team", "grp", "open"))


def access(path):
    st = os.lstat(path)
    return (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))


def wait_access(path, want, daemon):
    """Waits for `path` to have (uid, gid, mode) `want` (a socket's access is
    set just after it appears)."""
    wait_for(lambda: os.path.exists(path) and access(path) == want,
             "%s to be %s (it is %s)" % (path, want, access(path) if os.path.exists(path) else None),
             daemon=daemon)


EXPECTED = ((team, (4242, 0, 0o600), (4242, 0, 0o100)),
            (grp, (0, 4343, 0o660), (0, 4343, 0o710)),
            (opened, (0, 0, 0o666), (0, 0, 0o711)))
for path, sock_access, dir_access in EXPECTED:
    wait_access(path, sock_access, d)
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        fail("%s is not a socket" % path, d)
    got = access(os.path.dirname(path))
    if got != dir_access:
        fail("%s's directory: owner, group, mode %s, expected %s" % (path, got, dir_access), d)

st = os.stat(tdir)
if stat.S_IMODE(st.st_mode) != 0o711:
    fail("tenant_socket_dir is mode %o, not 0711" % stat.S_IMODE(st.st_mode), d)

for listed in (tdir, os.path.dirname(team), os.path.dirname(grp), os.path.dirname(opened)):
    r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "ls", listed], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode == 0:
        fail("uid 65534 could list %s: %r" % (listed, r.stdout), d)
for path in (team, grp):
    r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "stat", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode == 0 or "Permission denied" not in r.stderr:
        fail("uid 65534 could look up %s: %r %r" % (path, r.stdout, r.stderr), d)

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
if access(team) != (4242, 0, 0o666) or access(os.path.dirname(team)) != (4242, 0, 0o111):
    fail("after the reload team.sock is %s in %s, not (4242, 0, 0o666) in (4242, 0, 0o111)" %
         (access(team), access(os.path.dirname(team))), d)
if connect_as(65534, 65534, team) != "connected":
    fail("after the reload uid 65534 still cannot connect to team.sock", d)
d.stop()

# The daemon as deploy/gpumemd.service runs it: not root, CAP_CHOWN only.
if subprocess.run(["/usr/bin/setpriv", "--reuid=4999", "--regid=4999", "--clear-groups",
                   "--inh-caps=+chown", "--ambient-caps=+chown", "true"]).returncode != 0:
    print("SKIP (last part): setpriv cannot keep CAP_CHOWN for another uid here")
    print("PASS")
    sys.exit(0)
work2 = tempfile.mkdtemp(prefix="/tmp/gpumemd-access-nonroot-")
os.chmod(work2, 0o755)
os.chown(work2, 4999, 4999)
tdir = os.path.join(work2, "tenants")
team = os.path.join(tdir, "team", "team.sock")
config = os.path.join(work2, "gpumemd.textproto")
write()
os.chown(config, 4999, 4999)
copy = os.path.join(work2, "gpumemd")
subprocess.run(["cp", gpumemd, copy], check=True)
os.chmod(copy, 0o755)
d = Daemon("/usr/bin/setpriv",
           ctl, ["--reuid=4999", "--regid=4999", "--clear-groups", "--inh-caps=+chown",
                 "--ambient-caps=+chown", copy, "--socket=" + os.path.join(work2, "gpumemd.sock"),
                 "--ledger=none", "--sim_devices=1x1GiB", "--slab_size=16MiB",
                 "--config=" + config],
           workdir=work2)
d.wait_serving()
# Root in the config stands for the daemon's own uid and gid (4999).
wait_access(team, (4242, 4999, 0o600), d)
if access(os.path.dirname(team)) != (4242, 4999, 0o100):
    fail("team's directory under a non-root daemon: %s" % (access(os.path.dirname(team)),), d)
for uid, gid, path, want in ((4242, 4242, team, "connected"), (65534, 65534, team, EACCES)):
    got = connect_as(uid, gid, path)
    if got != want:
        fail("non-root daemon: uid %d connecting to %s: %r, expected %r" % (uid, path, got, want), d)
write(team_mode="0666")
before = d.log().count("gpumemd: reloaded")
d.signal(signal.SIGHUP)
wait_for(lambda: d.log().count("gpumemd: reloaded") > before, "the reload", daemon=d)
if "keeps its access" in d.log():
    fail("the non-root daemon could not change team's socket on the reload", d)
wait_access(team, (4242, 4999, 0o666), d)
if access(os.path.dirname(team)) != (4242, 4999, 0o111):
    fail("after the reload team's directory is %s" % (access(os.path.dirname(team)),), d)
if connect_as(65534, 65534, team) != "connected":
    fail("non-root daemon: after the reload uid 65534 cannot connect to team.sock", d)
d.stop()
if os.path.exists(os.path.dirname(team)):
    fail("the non-root daemon left %s behind: %s" % (os.path.dirname(team),
                                                      os.listdir(os.path.dirname(team))), d)
print("PASS")
