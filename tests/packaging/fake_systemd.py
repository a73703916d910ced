#!/usr/bin/python3
"""A stand-in for systemd as PID 1 on a machine without it: runs the installed
gpumemd.service and gpumemd.socket as systemd 252 does the parts gpumemd
relies on, and answers fake_systemctl.py. Played: the socket unit's
ListenStream= with its owner and mode, passed with the fd store as
LISTEN_FDS/LISTEN_FDNAMES; NOTIFY_SOCKET (READY, STOPPING, STATUS, FDSTORE,
FDSTOREREMOVE) and WATCHDOG_USEC; User=, Group=, UMask=, RuntimeDirectory=,
StateDirectory=; KillSignal= then SIGKILL after TimeoutStopSec=; a restart
keeps the fd store, a stop drops it; Restart=on-failure,
RestartForceExitStatus=, SuccessExitStatus=, the start limit; start/restart
return once ready or failed; is-enabled from the enablement links. Not
played: activation on a first connection, the watchdog's kill, sandboxing,
cgroups, journald (output goes to LOG_DIR/UNIT.log).

Usage: fake_systemd.py CONTROL_SOCKET LOG_DIR; SIGTERM kills the service.
"""
import array
import grp
import json
import os
import pwd
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time

UNIT_DIRS = ["/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system"]


def parse_unit(path):
    """{(section, key): [values]} of a unit file."""
    out = {}
    section = None
    with open(path) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def find_unit(name):
    """(path, masked) of a unit, as systemd looks it up."""
    for d in UNIT_DIRS:
        p = os.path.join(d, name)
        if os.path.lexists(p):
            if os.path.realpath(p) == "/dev/null":
                return None, True
            return p, False
    return None, False


def seconds(text, default):
    if not text:
        return default
    text = text.strip()
    for suffix, mult in (("ms", 0.001), ("min", 60), ("s", 1), ("m", 60)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * mult
    return float(text)


class Exit(Exception):
    pass


class Socket:
    def __init__(self, name):
        self.name = name
        self.sock = None

    def start(self):
        if self.sock is not None:
            return 0, ""
        path, masked = find_unit(self.name)
        if path is None:
            return 1, "Unit %s %s." % (self.name, "is masked" if masked else "not found")
        u = parse_unit(path)
        listen = u[("Socket", "ListenStream")][0]
        dmode = int(u.get(("Socket", "DirectoryMode"), ["0755"])[0], 8)
        os.makedirs(os.path.dirname(listen), mode=dmode, exist_ok=True)
        if os.path.lexists(listen):
            os.unlink(listen)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(listen)
        os.chmod(listen, int(u.get(("Socket", "SocketMode"), ["0666"])[0], 8))
        user = u.get(("Socket", "SocketUser"), ["root"])[0]
        group = u.get(("Socket", "SocketGroup"), ["root"])[0]
        os.chown(listen, pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid)
        s.listen(socket.SOMAXCONN)
        s.set_inheritable(False)
        self.sock = s
        return 0, ""

    def stop(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        return 0, ""

    def active(self):
        return self.sock is not None


class Service:
    def __init__(self, name, manager):
        self.name = name
        self.manager = manager
        self.proc = None
        self.state = "inactive"
        self.status = ""
        self.store = []  # (name, fd)
        self.expected_exit = False
        self.restart_at = None
        self.starts = []
        self.n_restarts = 0
        self.generation = 0  # spawns so far; a start waits for its own
        self.last_exit = None
        self.unit = {}

    def key(self, k, default=None):
        v = self.unit.get(("Service", k))
        return v[-1] if v else default

    def socket_unit(self):
        for r in self.unit.get(("Unit", "Requires"), []):
            for n in r.split():
                if n.endswith(".socket"):
                    return self.manager.unit(n)
        return None

    def spawn(self):
        path, masked = find_unit(self.name)
        if path is None:
            raise Exit("Unit %s %s." % (self.name, "is masked" if masked else "not found"))
        self.unit = parse_unit(path)
        now = time.monotonic()
        self.starts = [t for t in self.starts if now - t < 10] + [now]
        if len(self.starts) > 5:
            self.state = "failed"
            raise Exit("%s: start request repeated too quickly" % self.name)
        sock = self.socket_unit()
        if sock is not None:
            rc, msg = sock.start()
            if rc:
                raise Exit(msg)
        user = pwd.getpwnam(self.key("User", "root"))
        gid = grp.getgrnam(self.key("Group")).gr_gid if self.key("Group") else user.pw_gid
        groups = os.getgrouplist(user.pw_name, gid)
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG": "C.UTF-8", "USER": user.pw_name, "LOGNAME": user.pw_name,
               "HOME": user.pw_dir, "SHELL": "/usr/sbin/nologin",
               "NOTIFY_SOCKET": self.manager.notify_path}
        for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"):
            if k in os.environ:
                env[k] = os.environ[k]
        if self.key("WatchdogSec"):
            env["WATCHDOG_USEC"] = str(int(seconds(self.key("WatchdogSec"), 0) * 1e6))
        for kind, base, mode_key in (("RuntimeDirectory", "/run", "RuntimeDirectoryMode"),
                                     ("StateDirectory", "/var/lib", "StateDirectoryMode"),
                                     ("ConfigurationDirectory", "/etc", None)):
            name = self.key(kind)
            if not name:
                continue
            d = os.path.join(base, name)
            mode = int(self.key(mode_key, "0755"), 8) if mode_key else 0o755
            os.makedirs(d, exist_ok=True)
            if mode_key:
                os.chmod(d, mode)
                os.chown(d, user.pw_uid, gid)
            env[kind.upper().replace("DIRECTORY", "_DIRECTORY")] = d
        fds, names = [], []
        if sock is not None:
            fds.append(sock.sock.fileno())
            names.append(sock.name)
        for n, fd in self.store:
            fds.append(fd)
            names.append(n)
        if fds:
            env["LISTEN_FDS"] = str(len(fds))
            env["LISTEN_FDNAMES"] = ":".join(names)
        umask = int(self.key("UMask", "0022"), 8)
        argv = shlex.split(self.key("ExecStart"))
        argv[0] = argv[0].lstrip("-@:+!")

        def child():
            # Out of the way of 3..3+n first, then into place (inheritable).
            high = [os.dup2(fd, 200 + i) for i, fd in enumerate(fds)]
            for i, fd in enumerate(high):
                os.dup2(fd, 3 + i)
                os.close(fd)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(user.pw_uid)
            os.umask(umask)

        log = open(os.path.join(self.manager.log_dir, self.name + ".log"), "a")
        log.write("-- %s: starting %s\n" % (time.strftime("%H:%M:%S"), " ".join(argv)))
        log.flush()
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c",
             'LISTEN_PID=$$ WATCHDOG_PID=$$; export LISTEN_PID WATCHDOG_PID; exec "$@"', "sh"]
            + argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            preexec_fn=child, pass_fds=list(range(3, 3 + len(fds))), cwd="/")
        log.close()
        self.generation += 1
        self.state = "activating"
        self.expected_exit = False
        self.restart_at = None

    def signal(self, sig):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def reap(self):
        """Handles an exit of the service; what Restart= says happens next."""
        if self.proc is None or self.proc.poll() is None:
            if self.restart_at is not None and time.monotonic() >= self.restart_at:
                self.restart_at = None
                self.n_restarts += 1
                try:
                    self.spawn()
                except Exit:
                    pass
            return
        rc = self.proc.returncode
        self.proc = None
        self.last_exit = rc
        with open(os.path.join(self.manager.log_dir, self.name + ".log"), "a") as log:
            log.write("-- %s: exited %s\n" % (time.strftime("%H:%M:%S"), rc))
        if self.expected_exit:
            self.state = "inactive"
            return
        success = rc == 0 or str(rc) in (self.key("SuccessExitStatus", "") or "").split()
        force = str(rc) in (self.key("RestartForceExitStatus", "") or "").split()
        restart = self.key("Restart", "no")
        self.state = "inactive" if success else "failed"
        if force or (restart == "on-failure" and not success) or restart == "always":
            self.restart_at = time.monotonic() + seconds(self.key("RestartSec"), 0.1)

    def wait_start(self, generation):
        deadline = time.monotonic() + seconds(self.key("TimeoutStartSec"), 90)
        while time.monotonic() < deadline:
            if self.generation == generation and self.state == "active":
                return 0, ""
            if self.generation == generation and self.state in ("failed", "inactive"):
                return 1, ("Job for %s failed: the process exited with %s (see %s)."
                           % (self.name, self.last_exit,
                              os.path.join(self.manager.log_dir, self.name + ".log")))
            self.manager.pump(0.05)
        self.signal(signal.SIGKILL)
        return 1, "Job for %s timed out." % self.name

    def start(self):
        if self.proc is not None:
            return 0, ""
        self.starts = []
        try:
            self.spawn()
        except Exit as e:
            return 1, str(e)
        return self.wait_start(self.generation)

    def stop_process(self):
        if self.proc is None:
            self.restart_at = None
            return
        self.expected_exit = True
        self.restart_at = None
        sig = getattr(signal, self.key("KillSignal", "SIGTERM"))
        self.signal(sig)
        deadline = time.monotonic() + seconds(self.key("TimeoutStopSec"), 90)
        while self.proc is not None and time.monotonic() < deadline:
            self.manager.pump(0.05)
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            while self.proc is not None:
                self.manager.pump(0.05)

    def stop(self):
        self.stop_process()
        self.state = "inactive"
        for _, fd in self.store:  # a stop drops the fd store (systemd 252)
            os.close(fd)
        self.store = []
        return 0, ""

    def restart(self):
        self.stop_process()  # the fd store is kept over a restart
        self.starts = []
        try:
            self.spawn()
        except Exit as e:
            return 1, str(e)
        return self.wait_start(self.generation)

    def active(self):
        return self.state == "active" or (self.proc is not None and self.state != "failed")

    def notify(self, text, fds):
        fields = dict(l.split("=", 1) for l in text.splitlines() if "=" in l)
        if fields.get("READY") == "1":
            self.state = "active"
        if fields.get("STOPPING") == "1":
            self.state = "deactivating"
        if "STATUS" in fields:
            self.status = fields["STATUS"]
        if fields.get("FDSTORE") == "1":
            for fd in fds:
                self.store.append((fields.get("FDNAME", "stored"), fd))
            fds = []
        if fields.get("FDSTOREREMOVE") == "1":
            keep = []
            for n, fd in self.store:
                if n == fields.get("FDNAME"):
                    os.close(fd)
                else:
                    keep.append((n, fd))
            self.store = keep
        for fd in fds:
            os.close(fd)


class Manager:
    def __init__(self, control_path, log_dir):
        self.log_dir = log_dir
        self.units = {}
        self.notify_path = os.path.join(os.path.dirname(control_path), "fake-notify")
        for p in (control_path, self.notify_path):
            if os.path.lexists(p):
                os.unlink(p)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        os.chmod(self.notify_path, 0o666)
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control.bind(control_path)
        self.control.listen(16)
        self.sel = selectors.DefaultSelector()  # the notify socket only: pump()
        self.sel.register(self.notify, selectors.EVENT_READ)

    def unit(self, name):
        if name not in self.units:
            self.units[name] = Socket(name) if name.endswith(".socket") else Service(name, self)
        return self.units[name]

    def pump(self, timeout):
        for _ in self.sel.select(timeout):
            fds = array.array("i")
            msg, anc, _, _ = self.notify.recvmsg(4096, socket.CMSG_SPACE(253 * fds.itemsize))
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
            svc = next((u for u in self.units.values() if isinstance(u, Service)), None)
            if svc is not None:
                svc.notify(msg.decode(errors="replace"), list(fds))
            else:
                for fd in fds:
                    os.close(fd)
        for u in list(self.units.values()):
            if isinstance(u, Service):
                u.reap()

    def is_enabled(self, name):
        path, masked = find_unit(name)
        if masked:
            return 1, "masked"
        if path is None:
            return 1, "not-found"
        for d in os.listdir("/etc/systemd/system"):
            if d.endswith(".wants") and os.path.lexists(os.path.join("/etc/systemd/system", d, name)):
                return 0, "enabled"
        return 1, "disabled"

    def command(self, argv):
        """(rc, stdout, stderr) of one systemctl command line."""
        words = [a for a in argv if not a.startswith("-")]
        if "--version" in argv:
            return 0, "systemd 252 (fake_systemd.py)\n", ""
        if not words:
            return 1, "", "fake systemctl: no command\n"
        verb, units = words[0], words[1:]
        if verb == "daemon-reload":
            return 0, "", ""
        out, err, rc = [], [], 0
        for name in units:
            if "." not in name:
                name += ".service"
            u = self.unit(name)
            if verb == "is-enabled":
                r, text = self.is_enabled(name)
                out.append(text)
            elif verb == "is-active":
                r = 0 if u.active() else 3
                out.append("active" if r == 0 else getattr(u, "state", "inactive"))
            elif verb in ("start", "stop", "restart", "try-restart", "reload"):
                if verb == "try-restart":
                    r, text = u.restart() if u.active() else (0, "")
                elif verb == "reload":
                    u.signal(signal.SIGHUP)
                    r, text = 0, ""
                else:
                    r, text = getattr(u, verb)()
                if text:
                    err.append(text)
            elif verb == "show" and isinstance(u, Service):
                pid = u.proc.pid if u.proc is not None else 0
                out.append("MainPID=%d\nActiveState=%s\nNRestarts=%d\nStatusText=%s\n"
                           "ExecMainStatus=%s\nFDStore=%s" % (
                               pid, u.state, u.n_restarts, u.status, u.last_exit,
                               ",".join(n for n, _ in u.store)))
                r = 0
            else:
                r = 1
                err.append("fake systemctl: %s is not played here" % verb)
            rc = rc or r
        return rc, "".join(o + "\n" for o in out), "".join(e + "\n" for e in err)

    def serve(self):
        both = selectors.DefaultSelector()
        both.register(self.notify, selectors.EVENT_READ)
        both.register(self.control, selectors.EVENT_READ)
        while True:
            for key, _ in both.select(0.1):
                if key.fileobj is self.control:
                    conn, _ = self.control.accept()
                    with conn:
                        data = b""
                        while not data.endswith(b"\n"):
                            chunk = conn.recv(65536)
                            if not chunk:
                                break
                            data += chunk
                        try:
                            rc, out, err = self.command(json.loads(data)["argv"])
                        except Exception as e:  # a bug here must not hang apt
                            rc, out, err = 1, "", "fake_systemd: %r\n" % e
                        conn.sendall(json.dumps({"rc": rc, "out": out, "err": err}).encode())
            self.pump(0)


def main():
    manager = Manager(sys.argv[1], sys.argv[2])

    def stop(*_):
        for u in manager.units.values():
            if isinstance(u, Service):
                u.signal(signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    manager.serve()


if __name__ == "__main__":
    main()
