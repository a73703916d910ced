#!/usr/bin/python3
"""The wheel as a Python user installs it: tools/package-wheel from this
build's libgpumem.so; its name, tag and metadata (the version is
deploy/debian/changelog's, the library inside); `pip install --no-index`
into a fresh virtual environment, whose python imports gpumem from there and
allocates, writes, reads and frees against a daemon, and whose `gpumem`
console script answers; then `pip install ./client/python` (GPUMEM_LIBRARY
naming the library) offline into a second environment.

argv: tools/package-wheel, libgpumem.so, gpumemd, deploy/debian/changelog,
client/python/pyproject.toml.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

package_wheel, lib, gpumemd, changelog, pyproject = [os.path.abspath(a) for a in sys.argv[1:6]]
work = tempfile.mkdtemp(prefix="/tmp/gpumemd-wheeltest-")
daemon = None


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    if daemon is not None:
        daemon.kill()
        with open(os.path.join(work, "daemon.log")) as f:
            print("--- daemon log:\n" + f.read()[-4000:], file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1)


def run(argv, check=True, **kw):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300, **kw)
    if check and r.returncode != 0:
        fail("%s exited %d:\n%s" % (" ".join(argv), r.returncode, r.stdout))
    return r


# Programs not built with the sanitizer load an ASan build of the library
# only with its runtime first (bazel test --config=asan).
env = {k: v for k, v in os.environ.items()
       if k not in ("PYTHONPATH", "GPUMEM_LIBRARY", "PYTHONHOME")}
for line in run(["ldd", lib]).stdout.splitlines():
    if "libasan.so" in line and "=>" in line:
        env["LD_PRELOAD"] = line.split("=>")[1].split()[0]
        env["ASAN_OPTIONS"] = "detect_leaks=0"

# --- the wheel ---------------------------------------------------------------------
t = time.monotonic()
out = run([package_wheel, "--lib=" + lib, "--out=" + os.path.join(work, "dist")]).stdout
print("package-wheel: %.1f s" % (time.monotonic() - t))
wheels = os.listdir(os.path.join(work, "dist"))
with open(changelog) as f:
    version = re.match(r"gpumemd \(([^)]+)\)", f.readline()).group(1)
want = "gpumem-%s-py3-none-linux_x86_64.whl" % version
if wheels != [want]:
    fail("expected %s, got %s" % (want, wheels))
wheel = os.path.join(work, "dist", want)
z = zipfile.ZipFile(wheel)
names = z.namelist()
for n in ("gpumem/__init__.py", "gpumem/_lib.py", "gpumem/_version.py", "gpumem/libgpumem.so.1",
          "gpumem-%s.dist-info/METADATA" % version, "gpumem-%s.dist-info/RECORD" % version):
    if n not in names:
        fail("the wheel has no %s: %s" % (n, names))
meta = z.read("gpumem-%s.dist-info/METADATA" % version).decode()
for field in ("Name: gpumem", "Version: " + version, "Summary: ", "Requires-Python: >=3.8",
              "Provides-Extra: numpy"):
    if field not in meta:
        fail("METADATA has no %r:\n%s" % (field, meta[:800]))
if "Root-Is-Purelib: false" not in z.read("gpumem-%s.dist-info/WHEEL" % version).decode():
    fail("the wheel says it is pure Python, but it has a library inside")
if 'version = {attr = "gpumem._version.__version__"}' not in open(pyproject).read():
    fail("pyproject.toml no longer takes the version from gpumem._version")

# --- a fresh virtual environment -----------------------------------------------------
venv = os.path.join(work, "venv")
run(["/usr/bin/python3", "-m", "venv", venv])
t = time.monotonic()
run([venv + "/bin/pip", "install", "--no-index", "--disable-pip-version-check", "--no-cache-dir", wheel], env=env)
print("pip install of the wheel into a fresh venv: %.1f s" % (time.monotonic() - t))
sock = os.path.join(work, "gpumemd.sock")
daemon = subprocess.Popen([gpumemd, "--backend=sim", "--sim_devices=2x1GiB", "--slab_size=64MiB",
                           "--socket=" + sock, "--ledger=none", "--state=none"],
                          stdout=open(os.path.join(work, "daemon.log"), "w"),
                          stderr=subprocess.STDOUT)
deadline = time.monotonic() + 60
while "gpumemd: serving" not in open(os.path.join(work, "daemon.log")).read():
    if time.monotonic() > deadline or daemon.poll() is not None:
        fail("the daemon did not start")
    time.sleep(0.05)
env["GPUMEMD_SOCKET"] = sock
script = """
import importlib.metadata, json, os, gpumem
assert gpumem.__version__ == importlib.metadata.version("gpumem"), gpumem.__version__
with gpumem.connect() as c:
    b = c.malloc(3 << 20, gpus="1")
    v = b.view()
    v[:] = bytes(range(256)) * (len(v) // 256)
    ok = bytes(v[:512]) == bytes(range(256)) * 2
    dev = b.device
    del v
    b.free()
print(json.dumps({"file": gpumem.__file__, "lib": gpumem.library_path(),
                  "version": gpumem.__version__, "ok": ok, "device": dev}))
"""
r = run([venv + "/bin/python", "-c", script], env=env, cwd="/")
got = json.loads(r.stdout.strip().splitlines()[-1])
site = os.path.join(venv, "lib")
if not got["file"].startswith(site) or not got["lib"].startswith(site):
    fail("gpumem did not come from the virtual environment: %s" % got)
if got["version"] != version or not got["ok"] or got["device"] != 1:
    fail("in the venv: %s" % got)
stats = run([venv + "/bin/gpumem", "stats", "--json"], env=env, cwd="/").stdout
if len(json.loads(stats)["daemon"]["devices"]) != 2:
    fail("gpumem stats (console script): %s" % stats[:300])
print("venv: import gpumem %s from %s; allocated, wrote, read back and freed 3 MiB on "
      "device 1" % (version, got["lib"]))

# --- pip install ./client/python, as a developer would -------------------------------
src = os.path.join(work, "client-python")
shutil.copytree(os.path.dirname(pyproject), src)
dev = os.path.join(work, "venv-dev")
run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", dev])
dev_env = dict(env, GPUMEM_LIBRARY=lib)
run([dev + "/bin/pip", "install", "--no-index", "--no-build-isolation",
     "--disable-pip-version-check", "--no-cache-dir", src], env=dev_env)
dev_env.pop("GPUMEM_LIBRARY")
r = run([dev + "/bin/python", "-c", "import gpumem; c = gpumem.connect(); b = c.malloc(4096); "
         "b.free(); c.close(); print(gpumem.library_path())"], env=dev_env, cwd="/")
if not r.stdout.strip().startswith(dev):
    fail("pip install ./client/python: the library is not the installed one: %s" % r.stdout)
print("pip install ./client/python (GPUMEM_LIBRARY set) into a venv: ok")

daemon.terminate()
if daemon.wait(60) != 0:
    fail("the daemon exited %s" % daemon.returncode)
daemon = None
shutil.rmtree(work, ignore_errors=True)
print("PASS")
