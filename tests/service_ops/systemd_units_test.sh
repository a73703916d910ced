#!/usr/bin/env bash
# The units in deploy/ as systemd itself reads them (no running systemd
# needed): `systemd-analyze verify` prints nothing and succeeds for
# gpumemd.service and gpumemd.socket; `systemd-analyze security
# --offline=true` rates the service at an exposure of 2.0 or less; the
# sysusers.d entry parses (systemd-sysusers --dry-run) and the tmpfiles.d
# entry creates its directories with the right modes in a scratch root.
# Skips (passes, saying so) where systemd's tools are not installed.
set -euo pipefail
GPUMEMD=$(realpath "$1")
DEPLOY=$(dirname "$(realpath "$2")")
MAX_EXPOSURE=2.0

if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze is not installed (tools/install-deps installs systemd)"
  exit 0
fi
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d /tmp/gpumemd-units-XXXXXX)
trap 'rm -rf "$dir"' EXIT

# verify checks that ExecStart= exists: point it at the binary under test.
sed "s|/usr/local/bin/gpumemd|$GPUMEMD|" "$DEPLOY/gpumemd.service" >"$dir/gpumemd.service"
grep -q "^ExecStart=$GPUMEMD " "$dir/gpumemd.service" || fail "ExecStart is not /usr/local/bin/gpumemd"
cp "$DEPLOY/gpumemd.socket" "$dir/"
out=$(cd "$dir" && systemd-analyze verify ./gpumemd.service ./gpumemd.socket 2>&1) ||
  fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify is not clean: $out"
echo "verify: clean"

report=$(cd "$dir" && systemd-analyze security --offline=true ./gpumemd.service 2>&1) || true
exposure=$(sed -n 's/.*Overall exposure level for gpumemd.service: \([0-9.]*\).*/\1/p' <<<"$report")
[ -n "$exposure" ] || fail "no exposure level in: $report"
echo "security --offline=true: exposure $exposure (at most $MAX_EXPOSURE)"
awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }' ||
  { echo "$report" | grep '✗' >&2; fail "exposure $exposure > $MAX_EXPOSURE"; }

# The settings the issue names are really there (not just a low score).
for line in Type=notify WatchdogSec= ExecReload= NoNewPrivileges=yes ProtectSystem=strict \
    ProtectHome=yes PrivateTmp=yes RuntimeDirectory=gpumemd StateDirectory=gpumemd \
    DevicePolicy=closed "DeviceAllow=/dev/nvidiactl rw" KillSignal=SIGUSR2 \
    SuccessExitStatus=75 RestartForceExitStatus=75 FileDescriptorStoreMax=4096 \
    Restart=on-failure RuntimeDirectoryPreserve=yes; do
  grep -q "^$line" "$DEPLOY/gpumemd.service" || fail "gpumemd.service lacks $line"
done
for line in ListenStream=/run/gpumemd/gpumemd.sock SocketMode=0660 SocketGroup=gpumem; do
  grep -q "^$line" "$DEPLOY/gpumemd.socket" || fail "gpumemd.socket lacks $line"
done

if command -v systemd-sysusers >/dev/null; then
  systemd-sysusers --dry-run "$DEPLOY/sysusers.d/gpumemd.conf" >"$dir/sysusers.out" 2>&1 ||
    { cat "$dir/sysusers.out"; fail "sysusers.d/gpumemd.conf does not parse"; }
  echo "sysusers.d: parses"
fi
if command -v systemd-tmpfiles >/dev/null; then
  root="$dir/root"
  mkdir -p "$root/etc"
  # Owners resolve in the scratch root to our own ids, so the test needs no
  # privilege to chown (Bazel's sandbox has none).
  u=$(id -u); g=$(id -g)
  echo "gpumemd:x:$u:$g::/var/lib/gpumemd:/usr/sbin/nologin" >"$root/etc/passwd"
  printf 'gpumemd:x:%s:\ngpumem:x:%s:\n' "$g" "$g" >"$root/etc/group"
  systemd-tmpfiles --root="$root" --create "$DEPLOY/tmpfiles.d/gpumemd.conf" ||
    fail "tmpfiles.d/gpumemd.conf failed"
  [ "$(stat -c %a "$root/run/gpumemd")" = 755 ] || fail "/run/gpumemd mode"
  [ "$(stat -c %a "$root/var/lib/gpumemd")" = 750 ] || fail "/var/lib/gpumemd mode"
  echo "tmpfiles.d: creates /run/gpumemd and /var/lib/gpumemd"
fi
echo PASS
