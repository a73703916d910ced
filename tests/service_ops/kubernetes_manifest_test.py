#!/usr/bin/python3
"""deploy/kubernetes/ is consistent with itself and with the daemon: the
DaemonSet's socket (--socket) lies in the hostPath-mounted directory, the
client pod mounts the same host directory and names the same socket, the
probes ask gpumemd_probe about that socket, no pod asks for the host's PID
namespace, the grace period exceeds --drain_seconds, the daemon offers only
slab handles that cross PID namespaces (--handle_kinds=cuda_vmm_fd: fds over
the socket do, legacy CUDA IPC handles do not, and the pods share no PID
namespace with the daemon), and every gpumemd flag in the manifest is one
the built daemon accepts (--help lists it)."""
import os
import subprocess
import sys

import yaml

gpumemd, daemonset_path = sys.argv[1], sys.argv[2]
client_path = os.path.join(os.path.dirname(daemonset_path), "client-pod.yaml")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


docs = [d for d in yaml.safe_load_all(open(daemonset_path)) if d]
ds = next((d for d in docs if d["kind"] == "DaemonSet"), None)
if ds is None:
    fail("no DaemonSet")
spec = ds["spec"]["template"]["spec"]
if spec.get("hostPID") or spec.get("hostIPC") or spec.get("hostNetwork"):
    fail("the DaemonSet must not share the host's PID/IPC/network namespace")
c = next((c for c in spec["containers"] if c["name"] == "gpumemd"), None)
if c is None:
    fail("no gpumemd container in the DaemonSet")
args = dict(a[2:].split("=", 1) for a in c["args"])
sock = args["socket"]
mount = next(m for m in c["volumeMounts"] if sock.startswith(m["mountPath"] + "/"))
volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
host_dir = volume["hostPath"]["path"]
for probe in ("readinessProbe", "livenessProbe"):
    cmd = c[probe]["exec"]["command"]
    if not cmd[0].endswith("gpumemd_probe") or "--socket=" + sock not in cmd:
        fail("%s does not ask gpumemd_probe about %s: %s" % (probe, sock, cmd))
# Restarts: the state outside what client pods mount, on a hostPath of its
# own; a stopped pod keeps it (SIGUSR2 before the kubelet's SIGTERM).
state = args.get("state")
if not state or state == "none":
    fail("the DaemonSet must keep its restart state (--state=PATH)")
if os.path.dirname(state) == os.path.dirname(sock) or state.startswith(mount["mountPath"] + "/"):
    fail("--state=%s is in the socket directory that client pods mount" % state)
smount = next((m for m in c["volumeMounts"] if state.startswith(m["mountPath"] + "/")), None)
if smount is None:
    fail("--state=%s is not on a mounted volume: it would not outlive the pod" % state)
svol = next(v for v in spec["volumes"] if v["name"] == smount["name"])
if "hostPath" not in svol or svol["hostPath"]["path"] == host_dir:
    fail("--state's volume must be a hostPath of its own")
pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
if "kill -USR2 1" not in " ".join(pre):
    fail("the gpumemd container's preStop must send SIGUSR2 (a planned restart): %r" % pre)
if spec["terminationGracePeriodSeconds"] <= float(args.get("drain_seconds", 0)):
    fail("terminationGracePeriodSeconds must exceed --drain_seconds")
if args.get("backend") == "cuda":
    kinds = args.get("handle_kinds", "").split(",")
    if kinds != ["cuda_vmm_fd"]:
        fail("the DaemonSet must offer --handle_kinds=cuda_vmm_fd only (legacy CUDA IPC "
             "handles do not cross PID namespaces; the default offers them), not %r"
             % args.get("handle_kinds"))

help_text = subprocess.run([gpumemd, "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True).stdout
for flag in args:
    if "-" + flag + " " not in help_text and "-" + flag + "=" not in help_text \
            and "--" + flag not in help_text:
        fail("gpumemd has no flag --%s" % flag)

pod = yaml.safe_load(open(client_path))
pspec = pod["spec"]
if pspec.get("hostPID") or pspec.get("hostIPC"):
    fail("the client pod must not need the host's PID/IPC namespace")
env = {e["name"]: e["value"] for e in pspec["containers"][0]["env"]}
pmount = next(m for m in pspec["containers"][0]["volumeMounts"]
              if env["GPUMEMD_SOCKET"].startswith(m["mountPath"] + "/"))
pvol = next(v for v in pspec["volumes"] if v["name"] == pmount["name"])
if pvol["hostPath"]["path"] != host_dir:
    fail("the client pod mounts %s, the daemon's socket is in %s" %
         (pvol["hostPath"]["path"], host_dir))
if os.path.relpath(env["GPUMEMD_SOCKET"], pmount["mountPath"]) != \
        os.path.relpath(sock, mount["mountPath"]):
    fail("the client's GPUMEMD_SOCKET is not the daemon's socket")
print("socket %s on host dir %s; probes, grace period and flags consistent" % (sock, host_dir))
print("PASS")
