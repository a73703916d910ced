#!/usr/bin/python3
"""deploy/kubernetes/ is consistent with itself and with the daemon: the
DaemonSet's socket (--socket) lies in the hostPath-mounted directory, the
client pod mounts the same host directory and names the same socket, the
probes ask gpumemd_probe about that socket, no pod asks for the host's PID
namespace, the grace period exceeds --drain_seconds, the daemon offers only
slab handles that cross PID namespaces (--handle_kinds=cuda_vmm_fd: fds over
the socket do, legacy CUDA IPC handles do not, and the pods share no PID
namespace with the daemon), and every gpumemd flag in the manifest is one
the built daemon accepts (--help lists it).

Who reaches what (README "Who can reach what"): the client pod mounts only
the main socket's directory, read-only, and that directory holds nothing
else the daemon is told to put anywhere (tenant_socket_dir, state, ledger
lie outside it; its default tenant_socket_dir, /run/gpumemd/tenants, would
lie inside it, so the DaemonSet must set one); the metrics endpoint binds
the pod's IP from the downward API (status.podIP or status.hostIP), never
0.0.0.0 or [::]."""
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
if not pmount.get("readOnly"):
    fail("the client pod must mount the socket directory readOnly")
if len(pspec["containers"][0]["volumeMounts"]) != 1 or len(pspec.get("volumes", [])) != 1:
    fail("the client pod must mount the main socket's directory and nothing else")


def inside(path, directory):
    return path == directory or path.startswith(directory.rstrip("/") + "/")


# Nothing but the main socket in the directory client pods mount (paths in
# the daemon's container, on the mount of the socket's directory).
tenant_dir = args.get("tenant_socket_dir", "/run/gpumemd/tenants")
for name, path in (("tenant_socket_dir", tenant_dir), ("state", args.get("state", "")),
                   ("ledger", args.get("ledger", ""))):
    if path and inside(path, mount["mountPath"]):
        fail("--%s=%s is inside %s, the directory client pods mount" % (name, path,
                                                                         mount["mountPath"]))
tmount = next((m for m in c["volumeMounts"] if inside(tenant_dir, m["mountPath"])), None)
if tmount is None:
    fail("--tenant_socket_dir=%s is on no volume of the gpumemd container" % tenant_dir)
tvol = next(v for v in spec["volumes"] if v["name"] == tmount["name"])
if "hostPath" not in tvol or inside(tvol["hostPath"]["path"], host_dir) or \
        inside(host_dir, tvol["hostPath"]["path"]):
    fail("the tenant sockets' hostPath %s must be apart from the socket directory %s" %
         (tvol["hostPath"]["path"], host_dir))
if inside(tvol["hostPath"]["path"], pvol["hostPath"]["path"]):
    fail("the client pod's mount %s contains the tenant sockets" % pvol["hostPath"]["path"])

# Metrics on the pod's (or host's) IP, from the downward API.
listen = args.get("metrics_listen", "")
if listen:
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host in ("0.0.0.0", "::", ""):
        fail("--metrics_listen=%s binds every address; bind the pod's IP" % listen)
    if not host.startswith("$(") or not host.endswith(")"):
        fail("--metrics_listen=%s must name the pod's IP through an env var ($(POD_IP))" % listen)
    var = host[2:-1]
    envs = {e["name"]: e for e in c.get("env", [])}
    field = envs.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field not in ("status.podIP", "status.hostIP"):
        fail("$(%s) in --metrics_listen must come from status.podIP or status.hostIP, not %r" %
             (var, field))
    port = int(listen.rsplit(":", 1)[1])
    if not any(p.get("containerPort") == port for p in c.get("ports", [])):
        fail("the gpumemd container does not declare the metrics port %d" % port)
print("socket %s on host dir %s; probes, grace period and flags consistent" % (sock, host_dir))
print("PASS")
