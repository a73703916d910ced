#!/usr/bin/python3
"""The Debian packages, installed on this machine as an operator would: built
with tools/package-deb (lintian clean; a copy relabelled 0.1.0~prev1 is the
previous version); installed (user, units enabled, conffile, soname); the
installed examples built outside the repository (C with pkg-config, C++ with
CMake) and python3-gpumem run against the installed daemon; upgraded while a
client holds a block (planned restart, block intact, ledger, config and
socket kept); upgraded over a config the new daemon refuses (stops, says
why, the daemon keeps serving; dpkg --configure -a finishes); removed (state
kept), purged (all gone). fake_systemd.py plays systemd, in a mount
namespace of the test's own. Root only (skipped by name otherwise); refuses
to run where gpumemd is installed; leaves nothing installed or running.

argv: tools/package-deb, hold_block.c, fake_systemd.py, fake_systemctl.py,
then gpumemd, gpumemctl, gpumemd_probe, gpumemd-dra, libgpumem.so.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PACKAGES = ["gpumemd", "gpumemd-dra", "libgpumem1", "libgpumem-dev", "python3-gpumem"]
PREV, CUR = "0.1.0~prev1", None  # CUR: deploy/debian/changelog's
CONFIG = "/etc/gpumemd/gpumemd.textproto"
SOCKET = "/run/gpumemd/gpumemd.sock"
STATE_DIRS = ["/etc/gpumemd", "/var/lib/gpumemd", "/run/gpumemd"]
SIM_CONFIG = """# the operator's config: no GPU here
backend: "sim"
sim_devices: "2x1GiB"
socket: "/run/gpumemd/gpumemd.sock"
ledger: "/var/lib/gpumemd/ledger.db"
pool {
  slab_size: "256MiB"
  empty_slab_release_seconds: 30
}
"""

if os.geteuid() != 0:
    print("SKIP deb_install_test: needs root (apt-get install, system users, /run); "
          "run it as root, e.g. in CI")
    sys.exit(0)

package_deb, hold_src, fake_systemd, fake_systemctl = [os.path.abspath(a) for a in sys.argv[1:5]]
binaries = [os.path.abspath(a) for a in sys.argv[5:10]]

# --- into a mount namespace of our own --------------------------------------
if os.environ.get("GPUMEMD_PKGTEST_NS") != "1":
    os.environ["GPUMEMD_PKGTEST_NS"] = "1"
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--",
                          sys.executable] + sys.argv)

T0 = time.monotonic()
work = tempfile.mkdtemp(prefix="/tmp/gpumemd-pkgtest-")
os.chmod(work, 0o755)  # the unprivileged runs reach their programs
made = {"user": False, "group": False}
runner = None
holders = []


def say(msg):
    print("[%6.1f s] %s" % (time.monotonic() - T0, msg), flush=True)


def run(argv, check=True, env=None, timeout=600, **kw):
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        fail("%s did not finish within %d s" % (" ".join(argv), timeout))
    if check and r.returncode != 0:
        fail("%s exited %d:\n%s" % (" ".join(argv), r.returncode, r.stdout))
    return r


def journal():
    try:
        with open(os.path.join(work, "journal", "gpumemd.service.log")) as f:
            return f.read()
    except OSError:
        return ""


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    print("--- gpumemd.service output (last 60 lines):\n" +
          "\n".join(journal().splitlines()[-60:]), file=sys.stderr)
    cleanup()
    sys.exit(1)


def installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Status}", pkg],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return r.stdout if r.returncode == 0 else ""


def cleanup():
    """Leaves the machine as the test found it, whatever state it is in."""
    for h in holders:
        if h.poll() is None:
            h.kill()
            h.wait()
    global runner
    if runner is not None and runner.poll() is None:
        runner.terminate()  # it kills the service (SIGKILL) as it goes
        try:
            runner.wait(30)
        except subprocess.TimeoutExpired:
            runner.kill()
    runner = None
    left = [p for p in PACKAGES if installed(p) not in ("", "not-installed")]
    if left:
        subprocess.run(["dpkg", "--purge", "--force-all"] + left,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for d in STATE_DIRS:
        shutil.rmtree(d, ignore_errors=True)
    if made["user"]:
        subprocess.run(["userdel", "gpumemd"], stderr=subprocess.DEVNULL)
    for g in (["gpumem", "gpumemd"] if made["group"] else []):
        subprocess.run(["groupdel", g], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)


def on_signal(sig, _):
    fail("stopped by signal %d" % sig)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def systemctl(*args, check=True):
    return run(["systemctl"] + list(args), check=check)


def show():
    out = systemctl("show", "gpumemd.service").stdout
    return dict(l.split("=", 1) for l in out.splitlines() if "=" in l)


def apt(*args, check=True):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return run(["apt-get", "-y", "-q", "--no-install-recommends"] + list(args), check=check,
               env=env)


def ctl(*args, check=True, **kw):
    return run(["/usr/bin/gpumemctl"] + list(args), check=check, **kw)


# --- preconditions ------------------------------------------------------------
for tool in ("apt-get", "dpkg-buildpackage", "dh", "unshare", "pkg-config", "cmake", "cc",
             "c++", "objdump", "setpriv", "make"):
    if shutil.which(tool) is None:
        fail("%s is missing: run tools/install-deps" % tool)
present = [p for p in PACKAGES if installed(p) not in ("", "not-installed")]
if present:
    print("FAIL: %s installed on this machine; this test installs, upgrades and purges "
          "them: remove them first (apt-get purge %s)" % (", ".join(present), " ".join(present)),
          file=sys.stderr)
    sys.exit(1)
for d in STATE_DIRS:
    if os.path.exists(d):
        print("FAIL: %s exists (a gpumemd installed by hand?); the purge would delete it: "
              "move it away first" % d, file=sys.stderr)
        sys.exit(1)
made["user"] = subprocess.run(["getent", "passwd", "gpumemd"],
                              stdout=subprocess.DEVNULL).returncode != 0
made["group"] = subprocess.run(["getent", "group", "gpumem"],
                               stdout=subprocess.DEVNULL).returncode != 0

# ASan/UBSan builds (bazel test --config=asan): programs not built with the
# sanitizer load the library only with its runtime first.
consumer_env = dict(os.environ)
for k in ("PYTHONPATH", "GPUMEMD_SOCKET", "GPUMEM_LIBRARY", "LD_LIBRARY_PATH"):
    consumer_env.pop(k, None)
ldd = run(["ldd", binaries[4]]).stdout
for line in ldd.splitlines():
    if "libasan.so" in line and "=>" in line:
        consumer_env["LD_PRELOAD"] = line.split("=>")[1].split()[0]
        consumer_env["ASAN_OPTIONS"] = "detect_leaks=0"

# --- build -------------------------------------------------------------------
prebuilt = os.path.join(work, "prebuilt")
os.mkdir(prebuilt)
for src, name in zip(binaries, ["gpumemd", "gpumemctl", "gpumemd_probe", "gpumemd-dra",
                                "libgpumem.so"]):
    shutil.copy(src, os.path.join(prebuilt, name))
sanitized = "LD_PRELOAD" in consumer_env
if sanitized:
    # dpkg-buildpackage over ASan binaries (dh_shlibdeps, dh_strip) took more
    # than 10 minutes here; the packaging is the plain run's, and these
    # binaries are tested under ASan by every other test.
    print("SKIP deb_install_test: a sanitizer build (bazel test --config=asan); "
          "the packages are built, installed and upgraded in the plain run")
    cleanup()
    sys.exit(0)
t = time.monotonic()
built = run([package_deb, "--prebuilt=" + prebuilt, "--out=" + os.path.join(work, "cur")])
say("packages built in %.0f s (tools/package-deb, lintian clean)" % (time.monotonic() - t))
lint = [l for l in built.stdout.splitlines() if l[:2] in ("E:", "W:")]
if lint:
    fail("lintian reports what deploy/debian/README.md does not explain:\n" + "\n".join(lint))
cur_debs = sorted(os.path.join(work, "cur", f) for f in os.listdir(os.path.join(work, "cur"))
                  if f.endswith(".deb"))
if len(cur_debs) != len(PACKAGES):
    fail("expected %d packages, got %s" % (len(PACKAGES), cur_debs))
CUR = run(["dpkg-deb", "-f", [d for d in cur_debs if "/gpumemd_" in d][0],
           "Version"]).stdout.strip()
# The previous version: the same packages relabelled older (dpkg-deb), which
# is what an upgrade from the last release does to files, units and scripts.
os.mkdir(os.path.join(work, "prev"))
prev_debs = []
for deb in cur_debs:
    tree = tempfile.mkdtemp(dir=work)
    run(["dpkg-deb", "-R", deb, tree])
    control = os.path.join(tree, "DEBIAN", "control")
    text = open(control).read()
    with open(control, "w") as f:
        f.write(text.replace("Version: %s\n" % CUR, "Version: %s\n" % PREV)
                .replace("(= %s)" % CUR, "(= %s)" % PREV))
    prev_debs.append(os.path.join(work, "prev", os.path.basename(deb).replace(CUR, PREV)))
    run(["dpkg-deb", "-Zgzip", "-z1", "--root-owner-group", "-b", tree, prev_debs[-1]])
    shutil.rmtree(tree)

# --- systemd's stand-in ----------------------------------------------------------
os.makedirs("/run/systemd", exist_ok=True)
run(["mount", "-t", "tmpfs", "-o", "mode=0755", "fake-systemd", "/run/systemd"])
os.mkdir("/run/systemd/system")
open("/run/systemd/real-systemctl", "w").close()
run(["mount", "--bind", "/usr/bin/systemctl", "/run/systemd/real-systemctl"])
run(["mount", "--bind", fake_systemctl, "/usr/bin/systemctl"])
if os.path.exists("/usr/sbin/policy-rc.d"):
    allow = os.path.join(work, "policy-rc.d")
    with open(allow, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(allow, 0o755)
    run(["mount", "--bind", allow, "/usr/sbin/policy-rc.d"])
os.mkdir(os.path.join(work, "journal"))
runner = subprocess.Popen([sys.executable, fake_systemd, "/run/systemd/fake-systemd.sock",
                           os.path.join(work, "journal")])
deadline = time.monotonic() + 20
while not os.path.exists("/run/systemd/fake-systemd.sock"):
    if time.monotonic() > deadline or runner.poll() is not None:
        fail("fake_systemd.py did not start")
    time.sleep(0.05)

# --- install -------------------------------------------------------------------
t = time.monotonic()
apt("install", *prev_debs)
say("apt-get install of the previous version: %.1f s" % (time.monotonic() - t))
for p in PACKAGES:
    if installed(p) != "installed":
        fail("%s is %r after the install" % (p, installed(p)))
for link in ("/etc/systemd/system/multi-user.target.wants/gpumemd.service",
             "/etc/systemd/system/sockets.target.wants/gpumemd.socket"):
    if not os.path.islink(link):
        fail("%s: the unit was not enabled" % link)
if CONFIG not in run(["dpkg-query", "-W", "-f", "${Conffiles}", "gpumemd"]).stdout:
    fail("%s is not a conffile" % CONFIG)
run(["getent", "passwd", "gpumemd"])
run(["getent", "group", "gpumem"])
lib = "/usr/lib/x86_64-linux-gnu/libgpumem.so.1"
if "SONAME               libgpumem.so.1" not in run(["objdump", "-p", lib]).stdout:
    fail("%s has no soname libgpumem.so.1" % lib)
if "libgpumem.so.1 " not in run(["ldconfig", "-p"]).stdout:
    fail("ldconfig does not know libgpumem.so.1")
unit = open("/lib/systemd/system/gpumemd.service").read()
if "ExecStart=/usr/sbin/gpumemd " not in unit:
    fail("the installed unit does not start /usr/sbin/gpumemd")
# The postinst started it with the packaged config (backend cuda).
if "gpumemd: cuda backend: no NVIDIA driver" not in journal() and show()["ActiveState"] != "active":
    fail("the postinst did not start the service (or it failed for another reason)")
if "no NVIDIA driver" in journal():
    say("the packaged config (cuda) on a machine without a GPU: the service failed, saying "
        "\"%s\"" % [l for l in journal().splitlines() if "no NVIDIA driver" in l][0][:90])

with open(CONFIG, "w") as f:
    f.write(SIM_CONFIG)
systemctl("restart", "gpumemd")
svc = show()
if svc["ActiveState"] != "active":
    fail("gpumemd is %s after the restart with the sim config" % svc["ActiveState"])
st = os.stat(SOCKET)
if (oct(st.st_mode & 0o777), st.st_gid) != ("0o660", int(run(["getent", "group", "gpumem"])
                                                         .stdout.split(":")[2])):
    fail("%s: mode %o gid %d, not 0660 group gpumem" % (SOCKET, st.st_mode, st.st_gid))
if "SERVING" not in run(["/usr/bin/gpumemd_probe"]).stdout:
    fail("gpumemd_probe does not say SERVING")
stats = json.loads(ctl("stats", "--json").stdout)
if len(stats["devices"]) != 2:
    fail("expected the config's 2 sim devices: %s" % stats["devices"])
say("installed, enabled, running as user gpumemd (pid %s) on %s" % (svc["MainPID"], SOCKET))

# --- consumers, outside the repository ----------------------------------------------
ex = os.path.join(work, "examples")
shutil.copytree("/usr/share/doc/libgpumem-dev/examples", ex)
run(["make", "-C", os.path.join(ex, "pkg-config")], env=consumer_env)
hello = os.path.join(ex, "pkg-config", "gpumem_hello")
out = run([hello], env=consumer_env).stdout
if "written and read back, freed: ok" not in out:
    fail("gpumem_hello: %s" % out)
run(["cmake", "-S", os.path.join(ex, "cmake"), "-B", os.path.join(ex, "cmake", "build")],
    env=consumer_env)
run(["cmake", "--build", os.path.join(ex, "cmake", "build")], env=consumer_env)
out = run([os.path.join(ex, "cmake", "build", "gpumem_sharded")], env=consumer_env).stdout
if "2 shard(s) on 2 device(s), 2 written and read back, freed: ok" not in out:
    fail("gpumem_sharded: %s" % out)
as_member = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--groups=gpumem", hello]
if "freed: ok" not in run(as_member, env=consumer_env).stdout:
    fail("a member of group gpumem could not use the daemon")
outsider = run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", hello],
               check=False, env=consumer_env)
if outsider.returncode == 0:
    fail("a user outside group gpumem reached the socket: %s" % outsider.stdout)
py = run(["/usr/bin/python3", "-c",
          "import gpumem\n"
          "with gpumem.connect() as c:\n"
          "    b = c.malloc(4096)\n"
          "    b.view()[:5] = b'hello'\n"
          "    assert bytes(b.view()[:5]) == b'hello'\n"
          "    b.free()\n"
          "print(gpumem.library_path())\n"], env=consumer_env, cwd="/").stdout
if "/usr/lib/python3/dist-packages/gpumem/libgpumem.so.1" not in py:
    fail("python3-gpumem: %s" % py)
say("gpumem_hello (pkg-config, C) and gpumem_sharded (CMake, C++) built outside the "
    "repository and run: ok; group gpumem may connect, others not; python3-gpumem: ok")

# --- upgrade while a client holds memory ------------------------------------------------
run(["cc", "-O1", "-o", os.path.join(work, "hold_block"), hold_src] +
    run(["pkg-config", "--cflags", "--libs", "gpumem"]).stdout.split(), env=consumer_env)


def holder_ask(h, line):
    h.stdin.write(line + "\n")
    h.stdin.flush()
    answer = h.stdout.readline().strip()
    if not answer:
        fail("the holding client ended (asked %r)" % line)
    return answer


holder = subprocess.Popen([os.path.join(work, "hold_block")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env=consumer_env)
holders.append(holder)
if not holder.stdout.readline().startswith("held "):
    fail("the holding client did not get its block")
ledger_before = ctl("ledger", "--limit=1000", "--json").stdout
config_sum = hashlib.sha256(open(CONFIG, "rb").read()).hexdigest()
socket_ino = os.stat(SOCKET).st_ino
pid_before = show()["MainPID"]

t = time.monotonic()
apt("install", *cur_debs)
say("apt-get install of %s over %s: %.1f s" % (CUR, PREV, time.monotonic() - t))
for p in PACKAGES:
    v = run(["dpkg-query", "-W", "-f", "${Version}", p]).stdout
    if v != CUR:
        fail("%s is at %s after the upgrade, not %s" % (p, v, CUR))
svc = show()
if svc["MainPID"] == pid_before or svc["ActiveState"] != "active":
    fail("the upgrade did not restart gpumemd: %s" % svc)
if "exited 75" not in journal():
    fail("the old daemon did not take the planned restart (exit 75)")
# The holder's lease, its slab's handle from the fd store (none waits for a
# client to give it back).
if not re.search(r"restart: 1 allocation\(s\) in \d+ slab\(s\) of 1 session\(s\) survived the "
                 r"restart; 0 slab\(s\) wait for a client", journal()):
    fail("the new daemon did not take the held block back, its handle from the fd store")
answer = holder_ask(holder, "check")
if answer != "intact 2 0":
    fail("after the upgrade the held block says %r (want intact, generation 2, 0 lost)" % answer)
if hashlib.sha256(open(CONFIG, "rb").read()).hexdigest() != config_sum:
    fail("the upgrade changed the operator's config")
if os.stat(SOCKET).st_ino != socket_ino:
    fail("the upgrade made a new socket (clients connecting meanwhile were refused)")
ledger_after = json.loads(ctl("ledger", "--limit=1000", "--json").stdout)
before_ids = {json.dumps(e, sort_keys=True) for e in json.loads(ledger_before).get("events", [])}
after_ids = {json.dumps(e, sort_keys=True) for e in ledger_after.get("events", [])}
if not before_ids or not before_ids <= after_ids:
    fail("the ledger lost events over the upgrade")
if not any(e.get("kind") == "DAEMON_RESUMED" for e in ledger_after.get("events", [])):
    fail("the ledger has no DAEMON_RESUMED event for the upgrade")
say("upgraded while a client held 1 MiB: planned restart (exit 75), block intact, "
    "config, socket and %d ledger events kept" % len(before_ids))

# --- a config the new daemon refuses --------------------------------------------------
with open(CONFIG, "w") as f:
    f.write(SIM_CONFIG.replace('slab_size: "256MiB"', 'slab_size: "lots"'))
pid_before = show()["MainPID"]
r = apt("install", "--reinstall", [d for d in cur_debs if "/gpumemd_" in d][0], check=False)
if r.returncode == 0:
    fail("the upgrade over a refused config went through:\n" + r.stdout)
why = "the new gpumemd refuses %s (above), so it was not restarted" % CONFIG
if why not in r.stdout or "slab_size" not in r.stdout:
    fail("the refused upgrade does not say why:\n" + r.stdout)
if show()["MainPID"] != pid_before or show()["ActiveState"] != "active":
    fail("the refused upgrade stopped the running daemon")
if holder_ask(holder, "check") != "intact 2 0":
    fail("the held block after the refused upgrade")
ctl("stats")
print("  apt said: " + [l for l in r.stdout.splitlines() if "slab_size" in l][0])
with open(CONFIG, "w") as f:
    f.write(SIM_CONFIG)
run(["dpkg", "--configure", "-a"])
if show()["MainPID"] == pid_before or installed("gpumemd") != "installed":
    fail("dpkg --configure -a after the fix did not finish the upgrade")
if holder_ask(holder, "check") != "intact 3 0":
    fail("the held block after the completed upgrade")
if holder_ask(holder, "free") != "freed 0":
    fail("the held block did not free normally")
holder.stdin.write("quit\n")
holder.stdin.close()
if holder.wait(60) != 0:
    fail("the holding client did not close cleanly")
devices = json.loads(ctl("stats", "--json").stdout)["devices"]
if any(int(d.get("allocations", 0)) for d in devices):
    fail("allocations left after the client freed and closed: %s" % devices)
say("a refused config stopped the upgrade (daemon kept serving, block intact); fixed, "
    "dpkg --configure -a restarted it; the block freed normally")

# --- remove, then purge ------------------------------------------------------------------
apt("remove", *PACKAGES)
if show()["ActiveState"] not in ("inactive", "failed") or show()["MainPID"] != "0":
    fail("gpumemd still runs after the remove: %s" % show())
for p in PACKAGES:
    if installed(p) not in ("config-files", "not-installed", ""):
        fail("%s is %r after the remove" % (p, installed(p)))
for kept in (CONFIG, "/var/lib/gpumemd/ledger.db", SOCKET + ".state"):
    if not os.path.exists(kept):
        fail("the remove deleted %s" % kept)
if os.path.exists("/usr/sbin/gpumemd") or os.path.exists(lib):
    fail("the remove left the programs")
rc = [p for p in PACKAGES if installed(p) == "config-files"]
if rc != ["gpumemd"]:
    fail("after the remove, packages with files left: %s (want gpumemd's conffile only)" % rc)
apt("purge", *rc)
for gone in STATE_DIRS + ["/lib/systemd/system/gpumemd.service"]:
    if os.path.exists(gone):
        fail("the purge left %s" % gone)
left = [os.path.join(d, n) for top in ("/etc/systemd/system", "/var/lib/systemd")
        for d, dirs, files in os.walk(top) for n in dirs + files if "gpumemd" in n]
if left:
    fail("the purge left unit links: %s" % left)
for p in PACKAGES:
    if installed(p) not in ("", "not-installed"):
        fail("%s is %r after the purge" % (p, installed(p)))
say("removed (config, ledger and restart state kept), then purged (all gone)")
cleanup()
say("PASS")
