#!/usr/bin/env bash
# tools/install-service --root=DIR lays out what a host install gets (the
# three binaries, units, sysusers.d/tmpfiles.d entries, a config for the
# backend asked for) and nothing else; the installed daemon starts with the
# installed config and the installed gpumemctl and gpumemd_probe talk to it;
# a second run keeps an edited config.
set -euo pipefail
INSTALL=$1
bins=$(mktemp -d /tmp/gpumemd-inst-XXXXXX)
root="$bins/root"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$bins"' EXIT
fail() { echo "FAIL: $*" >&2; [ -s "$bins/log" ] && cat "$bins/log" >&2; exit 1; }
ln -s "$(realpath "$2")" "$bins/gpumemd"
ln -s "$(realpath "$3")" "$bins/gpumemctl"
ln -s "$(realpath "$4")" "$bins/gpumemd_probe"

GPUMEMD_BIN_DIR=$bins "$INSTALL" --backend=sim --root="$root" >"$bins/out" || fail "install-service failed"
want="etc/gpumemd/gpumemd.textproto
etc/systemd/system/gpumemd.service
etc/systemd/system/gpumemd.socket
etc/sysusers.d/gpumemd.conf
etc/tmpfiles.d/gpumemd.conf
usr/local/bin/gpumemctl
usr/local/bin/gpumemd
usr/local/bin/gpumemd_probe"
got=$(cd "$root" && find . -type f | sed 's|^\./||' | sort)
[ "$got" = "$want" ] || fail "installed files: $got"
grep -q 'backend: "sim"' "$root/etc/gpumemd/gpumemd.textproto" || fail "config backend"

sock="$bins/s.sock"
"$root/usr/local/bin/gpumemd" --config="$root/etc/gpumemd/gpumemd.textproto" \
  --socket="$sock" --ledger="$bins/ledger.db" 2>"$bins/log" &
pid=$!
for _ in $(seq 400); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || fail "the installed daemon did not start"
"$root/usr/local/bin/gpumemd_probe" --socket="$sock" >/dev/null || fail "probe"
n=$("$root/usr/local/bin/gpumemctl" --socket="$sock" stats --json |
    /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)["devices"]))')
[ "$n" = 4 ] || fail "the installed sim config should give 4 devices, got $n"
kill -TERM "$pid"
wait "$pid" || fail "daemon exit status"

echo "# edited" >>"$root/etc/gpumemd/gpumemd.textproto"
GPUMEMD_BIN_DIR=$bins "$INSTALL" --backend=cuda --root="$root" >"$bins/out"
grep -q "kept" "$bins/out" || fail "second run did not keep the config"
grep -q "# edited" "$root/etc/gpumemd/gpumemd.textproto" || fail "config replaced"
grep -q 'backend: "sim"' "$root/etc/gpumemd/gpumemd.textproto" || fail "config replaced"
echo PASS
