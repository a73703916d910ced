#!/usr/bin/python3
"""Hostile load against a live gpumemd (issue 33, "Targets").

For each attack: a fresh daemon (sim backend, 2 devices of 4 GiB, a config
with a few tenants, its own socket under a temp dir, metrics on loopback),
ordinary traffic by an unrelated uid first (it holds WARM_BLOCKS blocks of
64 KiB, frees them, then runs as a victim for half a second), so that
"before" is a daemon that has served (its ledger's page cache, its state
table's pages, its heap), then the attack (uid 65534 unless said),
bounded in time (--seconds) and count, while two victims (uid 1001 and root)
keep allocating, querying and freeing, and the daemon's RSS, threads and fds
are read from /proc before, during and after. One table row per attack.

Targets (issue 33), per attack: victims 100% served; victim p99 < 200 ms
during the attack and in the 1 s after it ends; RSS <= before + 256 MiB
during and <= before + 10% after; the daemon alive throughout; for the
oracle probe, another uid's allocation answered exactly as one that does not
exist. Exit status 1 if a target is missed, except for attacks named in
--expect-fail (run and reported as "MISSED (expected)").

Every loop is bounded in count and time; only the daemon's Unix socket and
its loopback metrics port are targets; only processes this script started
are ended, by pid. Needs root (victims and attackers of other uids through
setpriv); prints SKIP and exits 0 otherwise. Under a sanitizer
(ASAN_OPTIONS/TSAN_OPTIONS set) the latency and RSS targets are reported
but not enforced (the sanitizer's own cost and quarantine dominate them).

The same file is also every child: `--role=victim|attack|holder` (run as
another uid from a copy in the work dir, so those uids can read it).
"""
import argparse
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
GiB = 1 << 30
VICTIM_UID = 1001
WARM_UID = 1002
ATTACKER_UID = 65534
SLAB_UIDS = (2001, 2002, 2003, 2004)  # attack a: one tenant each
GREEDY_UID = 2005                     # attack f: the waiter that never fits
ALL_ATTACKS = "abcdefgh"
# Not run unless named: the victims alone, to tell the machine's own noise
# from an attack's effect.
CONTROL = "z"
ATTACK_NAMES = {
    "a": "quota footprint (huge alignment, small holds)",
    "b": "connection flood (silent HTTP/2)",
    "c": "stream flood (zero window, never read)",
    "d": "rapid reset (HEADERS+RST_STREAM)",
    "e": "held reflection streams",
    "f": "waiters (huge placement, long wait, never fits)",
    "g": "slow metrics clients (half requests)",
    "h": "oracle probe (Free of another uid's id)",
    "z": "control: no attack, the victims alone",
}
# Counts per form: every attack loop stops at its count or its time (the
# resets' count is out of reach in its time, so that attack lasts it all:
# the guard ends its connections sooner than it can send 100,000).
SIZES = {
    "short": dict(conn_procs=3, conns=2000, stream_conns=3, streams=8000, resets=2000000,
                  reflect=16, waiters=20, placement=400000, slowloris=8, holds=4000),
    "full": dict(conn_procs=3, conns=7000, stream_conns=3, streams=40000, resets=10000000,
                 reflect=32, waiters=100, placement=400000, slowloris=32, holds=4096),
}
# Ordinary traffic before "before": a tenant holding this many blocks at
# once is an ordinary client (an inference server holds more).
WARM_BLOCKS = 2000
P99_TARGET_S = 0.200
RSS_SLACK = 256 * MiB
AFTER_S = 1.0

# ---------------------------------------------------------------- protobuf


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint((num << 3) | 2) + varint(len(b)) + b


def pb_fields(buf):
    """{field number: [values]} of one message (varints and byte strings)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(buf, i)
        elif wt == 2:
            n, i = _read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def _read_varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def allocate_req(size, devices=(), alignment=0, wait_ms=0):
    placement = b"".join(f_bytes(1, d) for d in devices)
    msg = f_varint(1, size)
    if devices:
        msg += f_bytes(2, placement)
    if alignment:
        msg += f_varint(3, alignment)
    if wait_ms:
        msg += f_varint(7, wait_ms)
    return msg


def allocation_ids(resp):
    return [pb_fields(a)[1][0] for a in pb_fields(resp).get(1, [])]


def grpc_frame(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


SVC = "/gpumem.v1.GpuMemory/"
REFLECT = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
LIST_SERVICES = f_bytes(7, "*")

# ------------------------------------------------- a well-behaved client (h2)


class CallError(Exception):
    pass


class H2Client:
    """A blocking gRPC client over one HTTP/2 connection (python3-h2), with
    a deadline per call. Any transport failure raises; the caller reconnects."""

    def __init__(self, path, timeout):
        import h2.config
        import h2.connection
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self._streams = {}

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def start(self, method, msg, end_stream=True, deadline=None):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [
            (":method", "POST"), (":scheme", "http"), (":path", method),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers")])
        self._send_data(sid, grpc_frame(msg), end_stream, deadline)
        return sid

    def _send_data(self, sid, data, end_stream, deadline):
        import h2.events
        while True:
            window = min(self.conn.local_flow_control_window(sid),
                         self.conn.max_outbound_frame_size)
            n = min(window, len(data))
            if n > 0 or not data:
                last = n == len(data)
                self.conn.send_data(sid, data[:n], end_stream=end_stream and last)
                self.sock.sendall(self.conn.data_to_send())
                data = data[n:]
                if last:
                    return
            else:
                self._pump(deadline, until=lambda ev: isinstance(ev, h2.events.WindowUpdated))

    def _pump(self, deadline, until):
        """Reads and handles events until `until(event)` is true for one."""
        import h2.events
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallError("deadline exceeded")
                self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise CallError("connection closed by the daemon")
            hit = False
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    self._streams.setdefault(ev.stream_id, {}).setdefault("data", bytearray()).extend(ev.data)
                elif isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    self._streams.setdefault(ev.stream_id, {}).setdefault("headers", {}).update(
                        dict(ev.headers))
                elif isinstance(ev, h2.events.StreamEnded):
                    self._streams.setdefault(ev.stream_id, {})["ended"] = True
                elif isinstance(ev, h2.events.StreamReset):
                    self._streams.setdefault(ev.stream_id, {})["reset"] = ev.error_code
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self._streams["goaway"] = ev.error_code
                if until(ev):
                    hit = True
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
            if hit:
                return

    def call(self, method, msg, timeout):
        """(grpc status, message, response bytes) of one unary call."""
        deadline = time.monotonic() + timeout
        sid = self.start(method, msg, True, deadline)

        def done(_ev):
            s = self._streams.get(sid, {})
            return s.get("ended") or "reset" in s or "goaway" in self._streams
        if not done(None):
            self._pump(deadline, done)
        s = self._streams.pop(sid, {})
        if "reset" in s:
            raise CallError("stream reset by the daemon (error %s)" % s["reset"])
        if not s.get("ended"):
            raise CallError("GOAWAY from the daemon (error %s)" % self._streams.get("goaway"))
        h = s.get("headers", {})
        data = bytes(s.get("data", b""))
        msg_bytes = data[5:5 + struct.unpack(">I", data[1:5])[0]] if len(data) >= 5 else b""
        return int(h.get("grpc-status", "-1")), h.get("grpc-message", ""), msg_bytes


# --------------------------------------------------- raw HTTP/2 (attackers)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def h2_frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def h2_settings(pairs):
    return h2_frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def _hpack_int(n, prefix_bits=7):
    limit = (1 << prefix_bits) - 1
    if n < limit:
        return bytes([n])
    out, n = bytearray([limit]), n - limit
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def hpack_block(path):
    """A literal (never indexed, no Huffman) request header block."""
    out = b""
    for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path),
                 (":authority", "localhost"), ("content-type", "application/grpc"),
                 ("te", "trailers")):
        out += b"\x00" + _hpack_int(len(k)) + k.encode() + _hpack_int(len(v)) + v.encode()
    return out


class RawConn:
    """A hand-written HTTP/2 client connection: sends what it is told, never
    a WINDOW_UPDATE; drains what the daemon sends, answering SETTINGS and
    PING (so the connection is not closed for that) and noting GOAWAY."""

    def __init__(self, path, settings=()):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(2.0)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.buf = b""
        self.closed = False
        self.out = bytearray(PREFACE + h2_settings(settings))
        self.flush(time.monotonic() + 2.0)

    def queue(self, data):
        self.out += data

    def flush(self, deadline):
        """Sends what is queued, draining meanwhile, until done or deadline."""
        while self.out and not self.closed and time.monotonic() < deadline:
            try:
                n = self.sock.send(self.out)
                del self.out[:n]
            except BlockingIOError:
                self.drain()
                time.sleep(0.002)
            except OSError:
                self.closed = True
        return not self.out

    def drain(self):
        while not self.closed:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError:
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            self.buf += data
        while len(self.buf) >= 9:
            n = struct.unpack(">I", b"\x00" + self.buf[:3])[0]
            if len(self.buf) < 9 + n:
                break
            ftype, flags = self.buf[3], self.buf[4]
            payload = self.buf[9:9 + n]
            self.buf = self.buf[9 + n:]
            if ftype == SETTINGS and not flags & ACK:
                self.out += h2_frame(SETTINGS, ACK, 0)
            elif ftype == PING and not flags & ACK:
                self.out += h2_frame(PING, ACK, 0, payload)
            elif ftype == GOAWAY:
                self.closed = True

    def pending(self):
        return len(self.out)

    def close(self):
        self.sock.close()


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# ---------------------------------------------------------------- attacks
# Each runs in a child process of the attacker's uid until `deadline`
# (time.monotonic(), system-wide) and returns a small summary dict.


def connect_retry(path, deadline, settings=()):
    while time.monotonic() < deadline:
        try:
            return RawConn(path, settings)
        except OSError:
            time.sleep(0.05)
    return None


def attack_a_align(o, deadline):
    """uid 65534 (quota 1 MiB): 256-byte blocks with 1 GiB alignment (each
    may land at offset 0 of a fresh 1 GiB slab), then many small holds."""
    c = H2Client(o.socket, 5.0)
    held, refused, last = 0, 0, ""
    for i in range(16):
        if time.monotonic() >= deadline:
            break
        st, msg, _ = c.call(SVC + "Allocate", allocate_req(256, alignment=GiB), 5.0)
        held, refused, last = (held + 1, refused, last) if st == 0 else (held, refused + 1, msg)
    for i in range(o.sizes["holds"]):
        if time.monotonic() >= deadline:
            break
        st, msg, _ = c.call(SVC + "Allocate", allocate_req(256, devices=[str(i % 2)]), 5.0)
        if st == 0:
            held += 1
        else:
            refused += 1
            last = msg
            break
    hold_until(deadline)
    return dict(held=held, refused=refused, last_refusal=last[:120])


def attack_a_slab(o, deadline):
    """One of uids 2001-2004 (quota 1 MiB each): 256 B held on each device."""
    c = H2Client(o.socket, 5.0)
    held = 0
    for dev in ("0", "1"):
        st, _, _ = c.call(SVC + "Allocate", allocate_req(256, devices=[dev]), 5.0)
        held += st == 0
    hold_until(deadline)
    return dict(held=held)


def hold_until(deadline):
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def attack_b(o, deadline):
    """Silent HTTP/2 connections (preface + SETTINGS), as many as allowed."""
    raise_nofile()
    conns, failed, err = [], 0, ""
    while len(conns) < o.sizes["conns"] and time.monotonic() < deadline:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:  # our own fd limit
            err = str(e)
            break
        try:
            s.settimeout(0.5)
            s.connect(o.socket)
            s.sendall(PREFACE + h2_settings(()))
            conns.append(s)
        except OSError as e:
            s.close()
            failed += 1
            err = str(e)
            if failed > 200:
                break
            time.sleep(0.01)
    opened = len(conns)
    hold_until(deadline)
    alive = 0
    for s in conns:  # how many the daemon kept open
        try:
            s.setblocking(False)
            alive += s.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        s.close()
    return dict(opened=opened, failed=failed, kept_open_at_end=alive, last_error=err[:80])


def attack_c(o, deadline):
    """Unary calls with a zero receive window, never read, on one connection
    (several of these processes run); a connection the daemon closes is
    opened again until the attack's time is up."""
    block = hpack_block(SVC + "GetStats")
    req = grpc_frame(b"")
    sent = connections = closed_by_daemon = 0
    while time.monotonic() < deadline and sent < 20 * o.sizes["streams"]:
        c = connect_retry(o.socket, deadline, settings=[(0x4, 0)])  # INITIAL_WINDOW_SIZE 0
        if c is None:
            break
        connections += 1
        on_this, sid = 0, 1
        while on_this < o.sizes["streams"] and not c.closed and time.monotonic() < deadline:
            for _ in range(200):
                c.queue(h2_frame(HEADERS, END_HEADERS, sid, block) +
                        h2_frame(DATA, END_STREAM, sid, req))
                sid += 2
                on_this += 1
            c.flush(deadline)
            c.drain()
        while time.monotonic() < deadline and not c.closed:
            c.drain()
            c.flush(deadline)
            time.sleep(0.05)
        sent += on_this
        closed_by_daemon += 1 if c.closed else 0
        c.close()
    return dict(streams_sent=sent, connections=connections, closed_by_daemon=closed_by_daemon)


def attack_d(o, deadline):
    """HEADERS + RST_STREAM(CANCEL) pairs, as fast as the socket takes them."""
    c = connect_retry(o.socket, deadline)
    if c is None:
        return dict(error="no connection")
    block = hpack_block(SVC + "GetStats")
    req = grpc_frame(b"")
    sent, sid, conns = 0, 1, 1
    while sent < o.sizes["resets"] and time.monotonic() < deadline:
        if c.closed:  # the daemon may end a resetting connection: come back
            c.close()
            c = connect_retry(o.socket, deadline)
            if c is None:
                break
            sid, conns = 1, conns + 1
        for _ in range(500):
            c.queue(h2_frame(HEADERS, END_HEADERS, sid, block) + h2_frame(DATA, 0, sid, req) +
                    h2_frame(RST_STREAM, 0, sid, struct.pack(">I", 8)))
            sid += 2
            sent += 1
        c.flush(deadline)
        c.drain()
    c.close()
    return dict(pairs_sent=sent, connections=conns)


def attack_e(o, deadline):
    """Reflection streams opened, one request sent, never read, never ended."""
    raise_nofile()
    held, conns = 0, []
    for _ in range(o.sizes["reflect"]):
        if time.monotonic() >= deadline:
            break
        c = connect_retry(o.socket, deadline, settings=[(0x4, 0)])
        if c is None:
            break
        c.queue(h2_frame(HEADERS, END_HEADERS, 1, hpack_block(REFLECT)) +
                h2_frame(DATA, 0, 1, grpc_frame(LIST_SERVICES)))
        c.flush(deadline)
        conns.append(c)
        held += 1
    while time.monotonic() < deadline:
        for c in conns:
            c.drain()
            c.flush(deadline)
        time.sleep(0.05)
    kept = sum(not c.closed for c in conns)
    for c in conns:
        c.close()
    return dict(streams_opened=held, kept_open_at_end=kept)


def waiter_pump(conns, deadline):
    """Keeps the waiters' connections read; counts what the daemon answered."""
    answered = []
    while time.monotonic() < deadline:
        for c in conns:
            try:
                c.sock.settimeout(0.02)
                c._pump(None, lambda ev: True)
            except socket.timeout:
                pass
            except (OSError, CallError):
                continue
            for sid, s in list(c._streams.items()):
                if sid != "goaway" and (s.get("ended") or "reset" in s):
                    answered.append(s.get("headers", {}).get("grpc-message", "reset")[:100])
                    del c._streams[sid]
    return answered


def attack_f_big(o, deadline):
    """uid 65534 (quota 1 MiB): waiters over quota, each with a placement of
    400,000 one-byte device names (1.2 MB), wait_ms 60 s; one waiter with
    wait_ms = 2^32-1 (49.7 days)."""
    conns, started = [], 0
    placement = [str(i % 2) for i in range(o.sizes["placement"])]
    big = allocate_req(2 * MiB, devices=placement, wait_ms=60000)
    for i in range(o.sizes["waiters"]):
        if time.monotonic() >= deadline:
            break
        if i % 25 == 0:
            c = H2Client(o.socket, 5.0)
            conns.append(c)
        try:
            c.start(SVC + "Allocate", big, True, deadline)
            started += 1
        except (OSError, CallError):
            break
    try:
        conns[0].start(SVC + "Allocate", allocate_req(2 * MiB, wait_ms=0xFFFFFFFF), True, deadline)
        started += 1
    except (OSError, CallError, IndexError):
        pass
    answered = waiter_pump(conns, deadline)
    for c in conns:
        c.close()
    return dict(waiters_sent=started, answered_during=len(answered),
                first_answer=(answered[0] if answered else ""))


def attack_f_never(o, deadline):
    """uid 2005 (no quota): 4 GiB on device 0 and on device 1, wait_ms 60 s,
    where the victims hold 64 MiB anchors: these can never fit. Started
    once both victims' anchors are in place (before that, 4 GiB would
    fit: a tenant without a quota may take a free device)."""
    c = H2Client(o.socket, 5.0)
    anchored = time.monotonic() + 5.0
    while time.monotonic() < min(anchored, deadline):
        st, _, resp = c.call(SVC + "GetStats", b"", 5.0)
        used = [pb_fields(d).get(6, [0])[0] for d in pb_fields(resp).get(2, [])] if st == 0 else []
        if len(used) >= 2 and min(used) >= 128 * MiB:
            break
        time.sleep(0.02)
    for dev in ("0", "1"):
        c.start(SVC + "Allocate", allocate_req(4 * GiB, devices=[dev], wait_ms=60000), True, deadline)
    answered = waiter_pump([c], deadline)
    c.close()
    return dict(never_fit_waiters=2, answered_during=len(answered),
                first_answer=(answered[0] if answered else ""))


def attack_g(o, deadline):
    """TCP connections to the metrics port that send half a request, a byte
    every 0.5 s, reconnecting when dropped."""
    host, port = o.metrics.rsplit(":", 1)
    req = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: slow"
    socks, sent_at, opened, dropped = [], [], 0, 0
    while time.monotonic() < deadline:
        while len(socks) < o.sizes["slowloris"] and opened < 10 * o.sizes["slowloris"]:
            try:
                s = socket.create_connection((host, int(port)), timeout=0.5)
                s.setblocking(False)
                socks.append([s, 0])
                opened += 1
            except OSError:
                break
        for entry in list(socks):
            s, pos = entry
            try:
                if pos < len(req):
                    s.send(req[pos:pos + 1])
                    entry[1] += 1
                try:
                    if s.recv(4096) == b"":
                        raise OSError("closed")
                except BlockingIOError:
                    pass
            except OSError:
                s.close()
                socks.remove(entry)
                dropped += 1
        time.sleep(0.5)
    for s, _ in socks:
        s.close()
    return dict(connections_opened=opened, dropped_by_daemon=dropped)


def attack_h(o, deadline):
    """Free of another uid's live allocation vs of an id that never existed,
    in pairs: the answers (status, message with the id masked) must match."""
    c = H2Client(o.socket, 5.0)
    other, bogus = o.victim_id, o.victim_id + 1000003
    pairs, differ, sample = 0, 0, None
    while pairs < 200 and time.monotonic() < deadline:
        a = c.call(SVC + "Free", f_varint(1, other), 5.0)
        b = c.call(SVC + "Free", f_varint(1, bogus), 5.0)
        ma = (a[0], a[1].replace(str(other), "<id>"))
        mb = (b[0], b[1].replace(str(bogus), "<id>"))
        pairs += 1
        if ma != mb:
            differ += 1
            sample = sample or [list(ma), list(mb)]
        time.sleep(0.01)
    return dict(pairs=pairs, differing=differ, other_uid_answer=sample[0] if sample else None,
                no_such_id_answer=sample[1] if sample else None)


# attack letter -> [(uid, function)] run as separate processes.
def attack_plan(name, sizes):
    if name == "a":
        return [(ATTACKER_UID, "a_align")] + [(u, "a_slab") for u in SLAB_UIDS]
    if name == "b":
        return [(ATTACKER_UID, "b")] * sizes["conn_procs"]
    if name == "c":
        return [(ATTACKER_UID, "c")] * sizes["stream_conns"]
    if name == "d":
        return [(ATTACKER_UID, "d")] * 2
    if name == "e":
        return [(ATTACKER_UID, "e")]
    if name == "f":
        return [(ATTACKER_UID, "f_big"), (GREEDY_UID, "f_never")]
    if name == "g":
        return [(ATTACKER_UID, "g")]
    if name == "h":
        return [(ATTACKER_UID, "h")]
    if name == CONTROL:
        return [(ATTACKER_UID, "none")]
    raise ValueError(name)


ATTACK_FUNCS = {"none": lambda o, deadline: hold_until(deadline), "a_align": attack_a_align, "a_slab": attack_a_slab, "b": attack_b,
                "c": attack_c, "d": attack_d, "e": attack_e, "f_big": attack_f_big,
                "f_never": attack_f_never, "g": attack_g, "h": attack_h}

# ----------------------------------------------------------------- victim


def victim_main(o):
    """Allocates (1 MiB, alternating devices), queries (GetStats on its own
    connection and on a fresh one), frees, until o.until; with --reflect a
    reflection ListServices, with --metrics a scrape. Prints its ops as
    JSON: [start, latency, op, ok, detail]."""
    ops = []
    conn = None
    timeout = o.call_timeout

    broken = [False]  # the persistent connection failed: reconnect

    def op(name, fn, own_conn=True):
        t0 = time.monotonic()
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 (h2 protocol errors included)
            ok, detail = False, "%s: %s" % (type(e).__name__, e)
            broken[0] = broken[0] or own_conn
        ops.append([t0, time.monotonic() - t0, name, ok, detail[:160] if not ok else ""])
        return ok

    def unary(c, method, msg):
        st, m, resp = c.call(method, msg, timeout)
        return st, m, resp

    anchors = []
    ids = {}

    def alloc(size, dev, keep):
        def fn():
            st, m, resp = unary(conn, SVC + "Allocate", allocate_req(size, devices=[dev]))
            if st != 0:
                return False, "status %d: %s" % (st, m)
            keep.extend(allocation_ids(resp))
            return True, ""
        return fn

    def fresh_stats():
        c = H2Client(o.socket, timeout)
        try:
            st, m, _ = unary(c, SVC + "GetStats", b"")
            return st == 0, "status %d: %s" % (st, m)
        finally:
            c.close()

    def reflect():
        c = H2Client(o.socket, timeout)
        try:
            st, m, resp = unary(c, REFLECT, LIST_SERVICES)
            return st == 0 and b"gpumem.v1.GpuMemory" in resp, "status %d: %s" % (st, m)
        finally:
            c.close()

    def scrape():
        host, port = o.metrics.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=timeout)
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"HTTP/1.1 200"), data[:60].decode(errors="replace")
        finally:
            s.close()

    i = 0
    while time.monotonic() < o.until and i < 100000:
        if conn is None:
            def connect():
                nonlocal conn
                conn = H2Client(o.socket, timeout)
                return True, ""
            if not op("connect", connect, own_conn=False):
                conn = None
                time.sleep(0.05)
                continue
        if o.anchor and i == 0:
            for dev in ("0", "1"):
                op("anchor", alloc(64 * MiB, dev, anchors))
        got = []
        op("alloc", alloc(1 * MiB, str(i % 2), got))
        op("stats", lambda: (lambda r: (r[0] == 0, "status %d: %s" % r[:2]))(
            unary(conn, SVC + "GetStats", b"")))
        op("stats_new_conn", fresh_stats, own_conn=False)
        if o.reflect:
            op("reflect", reflect, own_conn=False)
        if o.scrape:
            op("scrape", scrape, own_conn=False)
        for aid in got:
            op("free", lambda aid=aid: (lambda r: (r[0] == 0, "status %d: %s" % r[:2]))(
                unary(conn, SVC + "Free", f_varint(1, aid))))
        if broken[0]:
            conn.close()
            conn = None
            broken[0] = False
        i += 1
        time.sleep(o.pause)
    json.dump(ops, sys.stdout)


def warm_main(o):
    """Ordinary traffic before the measurement: holds o.hold blocks of 64 KiB
    (alternating devices), frees them, then runs as a victim until o.until
    (which starts counting once the blocks are freed)."""
    c = H2Client(o.socket, o.call_timeout)
    ids = []
    for i in range(o.hold):
        st, _, resp = c.call(SVC + "Allocate", allocate_req(64 << 10, devices=[str(i % 2)]),
                             o.call_timeout)
        if st != 0:
            break
        ids.extend(allocation_ids(resp))
    for aid in ids:
        c.call(SVC + "Free", f_varint(1, aid), o.call_timeout)
    c.close()
    o.until = time.monotonic() + o.until
    return victim_main(o)


def holder_main(o):
    """Allocates 1 MiB, prints its id, holds it until stdin closes, then
    frees it and prints whether that worked (it must: nobody else may)."""
    c = H2Client(o.socket, 10.0)
    st, m, resp = c.call(SVC + "Allocate", allocate_req(MiB), 10.0)
    if st != 0:
        print(json.dumps({"error": m}), flush=True)
        return
    aid = allocation_ids(resp)[0]
    print(json.dumps({"id": aid}), flush=True)
    sys.stdin.read()
    st, m, _ = c.call(SVC + "Free", f_varint(1, aid), 10.0)
    print(json.dumps({"freed": st == 0, "message": m}), flush=True)


# ------------------------------------------------------------ the harness


def proc_sample(pid):
    try:
        rss = shmem = threads = 0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("RssShmem:"):
                    shmem = int(line.split()[1]) * 1024
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir("/proc/%d/fd" % pid))
        return dict(rss=rss, shmem=shmem, threads=threads, fds=fds)
    except (OSError, ValueError):
        return None


CONFIG = """backend: "sim"
sim_devices: "2x4GiB"
tenant { name: "victim" uids: [%(victim)d] quota { total_bytes: "2GiB" } }
tenant { name: "ops" uids: [0] }
tenant { name: "warm" uids: [%(warm)d] quota { total_bytes: "1GiB" } }
tenant { name: "attacker" uids: [%(attacker)d] quota { total_bytes: "1MiB" } }
%(slab)s
tenant { name: "greedy" uids: [%(greedy)d] }
tenant { name: "others" quota { total_bytes: "64MiB" } }
default_tenant: "others"
"""


class Daemon:
    def __init__(self, o, workdir):
        self.workdir = workdir
        self.sock = os.path.join(workdir, "gpumemd.sock")
        self.log_path = os.path.join(workdir, "daemon.log")
        cfg = os.path.join(workdir, "gpumemd.textproto")
        with open(cfg, "w") as f:
            f.write(CONFIG % dict(
                victim=VICTIM_UID, warm=WARM_UID, attacker=ATTACKER_UID, greedy=GREEDY_UID,
                slab="\n".join('tenant { name: "slab%d" uids: [%d] quota { total_bytes: "1MiB" } }'
                               % (u, u) for u in SLAB_UIDS)))
        soft, hard = (int(x) for x in o.daemon_nofile.split(":"))

        # Raising the hard limit needs CAP_SYS_RESOURCE: else ours is kept.
        cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
                finally:
                    os._exit(0 if resource.getrlimit(resource.RLIMIT_NOFILE)[1] == hard else 1)
            hard = hard if os.waitpid(pid, 0)[1] == 0 else min(hard, cur_hard)
        except OSError:
            hard = min(hard, cur_hard)
        self.nofile = (min(soft, hard), hard)

        def limits():
            resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)
        argv = [o.gpumemd, "--config=" + cfg, "--socket=" + self.sock,
                "--ledger=" + os.path.join(workdir, "ledger.db"),
                "--state=" + os.path.join(workdir, "gpumemd.state"),
                "--metrics_listen=127.0.0.1:0", "--drain_seconds=1"] + o.daemon_arg
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "WATCHDOG_USEC")}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=env,
                                     preexec_fn=limits)
        self.metrics = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log_text()
            if "gpumemd: serving" in text:
                for line in text.splitlines():
                    if line.startswith("gpumemd: metrics on http://"):
                        self.metrics = line.split("http://", 1)[1].split("/", 1)[0]
                if self.metrics:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("gpumemd did not start (status %s):\n%s" % (
            self.proc.poll(), self.log_text()[-3000:]))

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class Harness:
    def __init__(self, o):
        self.o = o
        self.top = tempfile.mkdtemp(prefix="/tmp/gpumemd-hostile-")
        os.chmod(self.top, 0o755)
        self.script = os.path.join(self.top, "hostile_load.py")
        shutil.copy(os.path.abspath(__file__), self.script)
        os.chmod(self.script, 0o755)
        self.children = []

    def spawn(self, uid, args, stdin=None):
        cmd = [sys.executable, self.script] + args
        if uid != 0:
            cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups"] + cmd
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=stdin,
                             cwd=self.top, text=True, env=dict(os.environ, HOME=self.top))
        self.children.append(p)
        return p

    def collect(self, p, timeout):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        try:
            return json.loads(out), err
        except ValueError:
            return None, (out or "")[-300:] + (err or "")[-600:]

    def common(self, d):
        return ["--socket=" + d.sock, "--metrics=" + d.metrics, "--form=" + self.o.form]

    def run_victims(self, d, until, name):
        out = []
        for uid in (VICTIM_UID, 0):
            args = self.common(d) + ["--role=victim", "--until=%.6f" % until, "--anchor"]
            if name == "e":
                args.append("--reflect")
            if name == "g" and uid == 0:
                args.append("--scrape")
            out.append(self.spawn(uid, args))
        return out

    def run_attack(self, name):
        o = self.o
        row = dict(attack=name, what=ATTACK_NAMES[name])
        wd = tempfile.mkdtemp(prefix="run-%s-" % name, dir=self.top)
        os.chmod(wd, 0o755)
        d = Daemon(o, wd)
        alive = True
        try:
            # Ordinary traffic by an unrelated uid, so that "before" is a
            # daemon that has served, not one just started: what a tenant
            # holding a few thousand blocks warms (the ledger's page cache,
            # the state table's pages, slab metadata, malloc's heap) is there
            # before the attack, not counted as what it left. --until is
            # relative here: half a second of victim work after the frees.
            w = self.spawn(WARM_UID, self.common(d) + [
                "--role=warm", "--hold=%d" % WARM_BLOCKS, "--until=0.5"])
            self.collect(w, 60)
            extra = []
            holder = None
            if name == "h":
                holder = self.spawn(VICTIM_UID, self.common(d) + ["--role=holder"],
                                    stdin=subprocess.PIPE)
                line = holder.stdout.readline()
                extra = ["--victim_id=%d" % json.loads(line)["id"]]
            before = proc_sample(d.proc.pid)
            t0 = time.monotonic()
            attack_end = t0 + o.seconds
            attackers = [self.spawn(uid, self.common(d) + [
                "--role=attack", "--attack=" + fn, "--until=%.6f" % attack_end] + extra)
                for uid, fn in attack_plan(name, o.sizes)]
            time.sleep(min(0.5, o.seconds / 4))  # the attack takes hold first
            kill_at = attack_end + 0.5
            victims = self.run_victims(d, kill_at + AFTER_S, name)
            during = []
            while time.monotonic() < kill_at and any(p.poll() is None for p in attackers):
                s = proc_sample(d.proc.pid)
                alive = alive and d.alive()
                if s:
                    during.append(s)
                time.sleep(0.1)
            t_end = time.monotonic()
            for p in attackers:  # past their time: ended by pid
                if p.poll() is None:
                    p.kill()
            summaries = [self.collect(p, 10) for p in attackers]
            vic = [self.collect(p, max(5.0, kill_at + AFTER_S - time.monotonic() + 10 * o.call_timeout))
                   for p in victims]
            # After: the first sample within 10% of before (or the last)
            # within 2 s of the victims' end.
            after = None
            settle = time.monotonic() + 2.0
            while True:
                alive = alive and d.alive()
                s = proc_sample(d.proc.pid)
                after = s or after
                if not s or s["rss"] <= before["rss"] * 1.10 or time.monotonic() > settle:
                    break
                time.sleep(0.1)
            if holder is not None:  # its block must still be its own to free
                holder.stdin.close()
                try:
                    holder.wait(15)
                except subprocess.TimeoutExpired:
                    holder.kill()
                    holder.wait()
                line = holder.stdout.read().strip().splitlines()
                res = json.loads(line[-1]) if line else {}
                row["holder_freed_own"] = bool(res.get("freed"))
            alive = alive and d.alive()
        finally:
            rc = d.stop()
        row.update(self.judge(name, before, during, after, alive, vic, summaries, t_end,
                              row.get("holder_freed_own")))
        row["daemon_exit"] = rc
        if not alive:
            row["daemon_log_tail"] = d.log_text()[-1500:]
        shutil.rmtree(wd, ignore_errors=True)
        return row

    def judge(self, name, before, during, after, alive, vic, summaries, t_end, holder_ok):
        o = self.o
        ops, errs = [], []
        for res, err in vic:
            if res is None:
                errs.append(err)
            else:
                ops.extend(res)
        total = len(ops)
        ok = sum(1 for x in ops if x[3])
        lat_during = [x[1] for x in ops if x[0] < t_end]
        lat_after = [x[1] for x in ops if t_end <= x[0] < t_end + AFTER_S]
        peak = {k: max([s[k] for s in during] + [0]) for k in ("rss", "threads", "fds")}
        r = dict(victim_ok=ok, victim_total=total,
                 p99_during_ms=pct_ms(lat_during), p99_after_ms=pct_ms(lat_after),
                 rss_mib=[mib(before and before["rss"]), mib(peak["rss"]), mib(after and after["rss"])],
                 threads=[before and before["threads"], peak["threads"], after and after["threads"]],
                 fds=[before and before["fds"], peak["fds"], after and after["fds"]],
                 # Of the RSS, the state table's tmpfs pages (its records).
                 shmem_mib=[mib(before and before["shmem"]), mib(after and after["shmem"])],
                 alive=alive, attackers=[s for s, _ in summaries],
                 failures=first_failures(ops))
        missed = []
        if errs or total == 0:
            missed.append("victim did not report: %s" % " | ".join(e.strip()[-200:] for e in errs))
        if ok < total:
            missed.append("victims %d/%d" % (ok, total))
        if not o.sanitizer:
            if r["p99_during_ms"] is not None and r["p99_during_ms"] >= P99_TARGET_S * 1000:
                missed.append("p99 during %.0f ms" % r["p99_during_ms"])
            if r["p99_after_ms"] is None or r["p99_after_ms"] >= P99_TARGET_S * 1000:
                missed.append("p99 after %s ms" % r["p99_after_ms"])
            if before and peak["rss"] > before["rss"] + RSS_SLACK:
                missed.append("RSS during +%d MiB" % ((peak["rss"] - before["rss"]) // MiB))
            if before and after and after["rss"] > before["rss"] * 1.10:
                missed.append("RSS after +%.0f%%" % (100.0 * after["rss"] / before["rss"] - 100))
        if not alive:
            missed.append("daemon died")
        if name == "h":
            s = summaries[0][0] or {}
            if s.get("differing", 1) or not s.get("pairs"):
                missed.append("oracle: %s vs %s" % (s.get("other_uid_answer"), s.get("no_such_id_answer")))
            if not holder_ok:
                missed.append("the other uid's block was not its own to free afterwards")
        r["missed"] = missed
        return r

    def cleanup(self):
        for p in self.children:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.top, ignore_errors=True)


def pct_ms(xs, q=0.99):
    if not xs:
        return None
    xs = sorted(xs)
    return round(1000.0 * xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def mib(n):
    return None if n is None else round(n / MiB, 1)


def first_failures(ops, n=3):
    seen = []
    for x in ops:
        if not x[3] and x[2] + ": " + x[4] not in seen:
            seen.append(x[2] + ": " + x[4])
            if len(seen) == n:
                break
    return seen


def trio(v):
    return "/".join("-" if x is None else str(x) for x in v)


def print_row(row, expected):
    verdict = "ok"
    if row["missed"]:
        verdict = ("MISSED (expected): " if expected else "MISSED: ") + "; ".join(row["missed"])
    elif expected:
        verdict = "ok (listed in --expect-fail: passes now)"
    print("%-2s %-48s %9s %8s %8s %17s %11s %14s %-5s %s" % (
        row["attack"], row["what"][:48], "%d/%d" % (row["victim_ok"], row["victim_total"]),
        row["p99_during_ms"], row["p99_after_ms"], trio(row["rss_mib"]), trio(row["threads"]),
        trio(row["fds"]), "yes" if row["alive"] else "NO", verdict), flush=True)
    for a in row["attackers"]:
        if a:
            print("     attacker: %s" % json.dumps(a, sort_keys=True)[:300])
    for f in row["failures"]:
        print("     victim failure: %s" % f)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gpumemd", nargs="?", help="the gpumemd binary")
    p.add_argument("--form", choices=("short", "full"), default="short",
                   help="short: CI (2 s per attack, smaller counts); full: 30 s, the issue's counts")
    p.add_argument("--seconds", type=float, help="attack time (default 2 short, 30 full)")
    p.add_argument("--attacks", default=",".join(ALL_ATTACKS),
                   help="which to run, e.g. a,c (z: a control row, the victims alone)")
    p.add_argument("--expect-fail", default="", dest="expect_fail")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--daemon_nofile", default="1024:524288",
                   help="the daemon's RLIMIT_NOFILE soft:hard (systemd's default)")
    p.add_argument("--daemon_arg", action="append", default=[], help="extra daemon flag")
    p.add_argument("--call_timeout", type=float, default=5.0)
    # Children.
    p.add_argument("--role", choices=("main", "victim", "attack", "holder", "warm"),
                   default="main")
    p.add_argument("--hold", type=int, default=0, help="warm: blocks held first")
    p.add_argument("--socket")
    p.add_argument("--metrics")
    p.add_argument("--until", type=float)
    p.add_argument("--attack")
    p.add_argument("--victim_id", type=int)
    p.add_argument("--anchor", action="store_true")
    p.add_argument("--reflect", action="store_true")
    p.add_argument("--scrape", action="store_true")
    p.add_argument("--pause", type=float, default=0.02)
    o = p.parse_args(argv)
    o.sizes = SIZES[o.form]
    if o.seconds is None:
        o.seconds = 2.0 if o.form == "short" else 30.0
    o.sanitizer = bool(os.environ.get("ASAN_OPTIONS") or os.environ.get("TSAN_OPTIONS"))
    return o


def main(argv):
    o = parse_args(argv)
    if o.role == "victim":
        return victim_main(o)
    if o.role == "holder":
        return holder_main(o)
    if o.role == "warm":
        return warm_main(o)
    if o.role == "attack":
        json.dump(ATTACK_FUNCS[o.attack](o, o.until) or {}, sys.stdout)
        return 0
    if os.getuid() != 0:
        print("SKIP: needs root (victims and attackers run as other uids through setpriv)")
        return 0
    if shutil.which("setpriv") is None:
        print("SKIP: setpriv (util-linux) is not installed")
        return 0
    try:
        import h2  # noqa: F401
    except ImportError:
        print("FAIL: python3-h2 is missing: run tools/install-deps", file=sys.stderr)
        return 1
    if not o.gpumemd:
        print("FAIL: name the gpumemd binary", file=sys.stderr)
        return 2
    o.gpumemd = os.path.abspath(o.gpumemd)
    attacks = [a for a in o.attacks.split(",") if a]
    expect = set(a for a in o.expect_fail.split(",") if a)
    for a in attacks + list(expect):
        if a not in ALL_ATTACKS + CONTROL:
            print("FAIL: unknown attack %r (known: %s)" % (a, ",".join(ALL_ATTACKS + CONTROL)),
                  file=sys.stderr)
            return 2
    h = Harness(o)
    rows, bad = [], []
    print("hostile load: form %s, %.0f s per attack, daemon RLIMIT_NOFILE %s%s" % (
        o.form, o.seconds, o.daemon_nofile,
        ", sanitizer build: latency and RSS targets not enforced" if o.sanitizer else ""))
    print("%-2s %-48s %9s %8s %8s %17s %11s %14s %-5s %s" % (
        "", "attack", "victim ok", "p99 dur", "p99 aft", "RSS MiB b/d/a", "threads", "fds", "alive",
        "verdict"))
    try:
        for a in attacks:
            row = h.run_attack(a)
            row["expected_fail"] = a in expect
            rows.append(row)
            print_row(row, a in expect)
            if row["missed"] and a not in expect:
                bad.append(a)
    finally:
        h.cleanup()
        if o.json:
            with open(o.json, "w") as f:
                json.dump(rows, f, indent=1)
    if bad:
        print("FAIL: targets missed by attack(s) %s" % ",".join(bad))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) or 0)
