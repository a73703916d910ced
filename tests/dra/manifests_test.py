#!/usr/bin/python3
"""deploy/kubernetes/ names what gpumemd-dra needs, consistently:

- every manifest parses (python3-yaml) and uses resource.k8s.io/v1 for DRA;
- the DaemonSet runs gpumemd-dra beside gpumemd, with only flags the built
  plugin accepts (--help), NODE_NAME from spec.nodeName, and the pod's
  service account;
- the kubelet's directories (--registration_dir, --plugin_dir) and the CDI
  directory are hostPaths mounted at the same paths inside (the kubelet and
  the container runtime read them on the host, and CDI specs name host
  paths);
- --gpumemd_socket is gpumemd's --socket and --claims_dir is gpumemd's
  tenant_socket_dir (its default, /run/gpumemd/tenants, unless the daemon's
  args set one), each in a hostPath the two containers share at the same
  mount path, the claims directory in a hostPath apart from the main
  socket's (client pods mount that one: they must not reach claims);
- the RBAC lets that service account apply ResourceSlices and get
  ResourceClaims;
- the DeviceClass selects the plugin's --driver_name; the example
  ResourceClaimTemplate asks that class for 8Gi of memory and the example
  pod's container uses the claim;
- the image carries the plugin and libcurl.
"""
import os
import re
import subprocess
import sys

import yaml

plugin, daemonset_path = sys.argv[1], sys.argv[2]
kdir = os.path.dirname(daemonset_path)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def load(name):
    return [d for d in yaml.safe_load_all(open(os.path.join(kdir, name))) if d]


docs = []
for name in ("gpumemd-daemonset.yaml", "dra-driver.yaml", "dra-example.yaml"):
    docs += load(name)


def one(kind):
    found = [d for d in docs if d["kind"] == kind]
    if len(found) != 1:
        fail("expected one %s, found %d" % (kind, len(found)))
    return found[0]


ds = one("DaemonSet")
spec = ds["spec"]["template"]["spec"]
containers = {c["name"]: c for c in spec["containers"]}
if "gpumemd-dra" not in containers or "gpumemd" not in containers:
    fail("the DaemonSet must run gpumemd and gpumemd-dra: %s" % list(containers))
daemon, dra = containers["gpumemd"], containers["gpumemd-dra"]
if not dra["command"][0].endswith("/gpumemd-dra"):
    fail("the plugin container does not run gpumemd-dra: %s" % dra["command"])

flags = dict(a[2:].split("=", 1) for a in dra["args"])
daemon_flags = dict(a[2:].split("=", 1) for a in daemon["args"])
help_text = subprocess.run([plugin, "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True).stdout
for flag in flags:
    if "-" + flag + " " not in help_text and "-" + flag + ";" not in help_text:
        fail("gpumemd-dra has no flag --%s" % flag)
for needed in ("driver_name", "gpumemd_socket", "claims_dir", "cdi_dir", "plugin_dir",
               "registration_dir", "container_socket"):
    if needed not in flags:
        fail("the plugin's --%s is not set explicitly" % needed)

env = {e["name"]: e for e in dra.get("env", [])}
if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
    fail("NODE_NAME must come from spec.nodeName")

volumes = {v["name"]: v for v in spec["volumes"]}


def host_dir_of(container, path):
    """The host directory behind `path` in `container`, and the mount path."""
    best = None
    for m in container["volumeMounts"]:
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"]):
                best = m
    if best is None:
        fail("%s is not on any volume of container %s" % (path, container["name"]))
    v = volumes[best["name"]]
    if "hostPath" not in v:
        fail("%s (volume %s) is not a hostPath" % (path, best["name"]))
    rel = os.path.relpath(path, best["mountPath"])
    return os.path.normpath(os.path.join(v["hostPath"]["path"], rel)), best


# The kubelet and the runtime read these on the host: same path in and out.
for flag in ("registration_dir", "plugin_dir", "cdi_dir"):
    host, _ = host_dir_of(dra, flags[flag])
    if host != flags[flag]:
        fail("--%s=%s is %s on the host: the kubelet would not find it" % (flag, flags[flag], host))
if not flags["plugin_dir"].startswith("/var/lib/kubelet/plugins/"):
    fail("--plugin_dir must be under /var/lib/kubelet/plugins/")
if flags["registration_dir"] != "/var/lib/kubelet/plugins_registry":
    fail("--registration_dir must be the kubelet's plugins_registry")

# gpumemd's socket and claims directory: one host dir, one path in both.
if flags["gpumemd_socket"] != daemon_flags["socket"]:
    fail("--gpumemd_socket=%s is not gpumemd's --socket=%s" % (flags["gpumemd_socket"],
                                                              daemon_flags["socket"]))
tenant_dir = daemon_flags.get("tenant_socket_dir", "/run/gpumemd/tenants")
if flags["claims_dir"] != tenant_dir:
    fail("--claims_dir=%s is not gpumemd's tenant_socket_dir %s" % (flags["claims_dir"], tenant_dir))
for path in (flags["gpumemd_socket"], flags["claims_dir"]):
    in_dra, _ = host_dir_of(dra, path)
    in_daemon, _ = host_dir_of(daemon, path)
    if in_dra != in_daemon or in_dra != path:
        fail("%s is %s on the host for the plugin, %s for gpumemd: CDI specs name host paths, "
             "so both must see it at the same path" % (path, in_dra, in_daemon))

# Claims apart from the main socket: no hostPath holds both, so the directory
# client pods mount (the main socket's) reaches no claim.
_, sock_mount = host_dir_of(daemon, flags["gpumemd_socket"])
_, claims_mount = host_dir_of(daemon, flags["claims_dir"])
if sock_mount["name"] == claims_mount["name"]:
    fail("--claims_dir=%s is on the volume of the main socket (%s), which client pods mount" %
         (flags["claims_dir"], sock_mount["name"]))
sock_host = volumes[sock_mount["name"]]["hostPath"]["path"].rstrip("/")
claims_host = volumes[claims_mount["name"]]["hostPath"]["path"].rstrip("/")
if claims_host.startswith(sock_host + "/") or sock_host.startswith(claims_host + "/"):
    fail("the claims' hostPath %s and the main socket's %s nest" % (claims_host, sock_host))
client_pod = load("client-pod.yaml")[0]
for v in client_pod["spec"].get("volumes", []):
    hp = v.get("hostPath", {}).get("path", "").rstrip("/")
    if hp and (claims_host == hp or claims_host.startswith(hp + "/")):
        fail("client-pod.yaml mounts %s, which holds the claims directory %s" % (hp, claims_host))

# RBAC: the pod's service account may apply slices and read claims.
sa = spec.get("serviceAccountName")
if not sa:
    fail("the DaemonSet has no serviceAccountName")
if not any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa and
           d["metadata"]["namespace"] == ds["metadata"]["namespace"] for d in docs):
    fail("no ServiceAccount %s in %s" % (sa, ds["metadata"]["namespace"]))
binding = one("ClusterRoleBinding")
if not any(s["kind"] == "ServiceAccount" and s["name"] == sa and
           s["namespace"] == ds["metadata"]["namespace"] for s in binding["subjects"]):
    fail("the ClusterRoleBinding does not bind %s" % sa)
role = one("ClusterRole")
if binding["roleRef"]["name"] != role["metadata"]["name"]:
    fail("the ClusterRoleBinding binds another role")


def allowed(resource, verb):
    return any("resource.k8s.io" in r["apiGroups"] and resource in r["resources"] and
               verb in r["verbs"] for r in role["rules"])


for resource, verb in (("resourceslices", "patch"), ("resourceslices", "create"),
                       ("resourceslices", "get"), ("resourceclaims", "get")):
    if not allowed(resource, verb):
        fail("the ClusterRole does not allow %s %s" % (verb, resource))

# DeviceClass, claim template, pod.
dc = one("DeviceClass")
if dc["apiVersion"] != "resource.k8s.io/v1":
    fail("DeviceClass is %s, not resource.k8s.io/v1" % dc["apiVersion"])
exprs = [s["cel"]["expression"] for s in dc["spec"]["selectors"]]
if not any(re.search(r'device\.driver\s*==\s*"%s"' % re.escape(flags["driver_name"]), e)
           for e in exprs):
    fail("the DeviceClass does not select driver %s: %s" % (flags["driver_name"], exprs))
tmpl = one("ResourceClaimTemplate")
if tmpl["apiVersion"] != "resource.k8s.io/v1":
    fail("ResourceClaimTemplate is %s" % tmpl["apiVersion"])
(req,) = tmpl["spec"]["spec"]["devices"]["requests"]
if req["exactly"]["deviceClassName"] != dc["metadata"]["name"]:
    fail("the claim template asks class %s" % req["exactly"]["deviceClassName"])
if req["exactly"]["capacity"]["requests"]["memory"] != "8Gi":
    fail("the example must ask for 8Gi of memory")
pod = one("Pod")
(pc,) = pod["spec"]["resourceClaims"]
if pc["resourceClaimTemplateName"] != tmpl["metadata"]["name"]:
    fail("the pod does not use the claim template")
if pod["metadata"]["namespace"] != tmpl["metadata"]["namespace"]:
    fail("the pod and the claim template are in different namespaces")
if not any(c.get("name") == pc["name"] for ct in pod["spec"]["containers"]
           for c in ct.get("resources", {}).get("claims", [])):
    fail("no container of the pod uses claim %s" % pc["name"])
for ct in pod["spec"]["containers"]:
    if any(e["name"] == "GPUMEMD_SOCKET" for e in ct.get("env", [])):
        fail("the pod must not set GPUMEMD_SOCKET: the claim's CDI spec does")
    if ct.get("volumeMounts"):
        fail("the pod must not mount gpumemd's socket directory: the claim's CDI spec does")

dockerfile = open(os.path.join(kdir, "Dockerfile")).read()
if "client/dra/gpumemd-dra" not in dockerfile or "libcurl4" not in dockerfile:
    fail("the image lacks gpumemd-dra or libcurl4")
print("driver %s; plugin dirs, CDI dir, gpumemd socket and claims dir consistent; RBAC, "
      "DeviceClass and the 8Gi example agree" % flags["driver_name"])
print("PASS")
