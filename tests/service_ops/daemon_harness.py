"""Shared by the service_ops tests: run gpumemd as a child process with a
private socket and environment, talk to it with gpumemctl, read its log.

Every wait here has a generous deadline (this machine is loaded); no test
asserts that something happens faster than the issue demands.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def fail(msg, daemon=None):
    print("FAIL: " + msg, file=sys.stderr)
    if daemon is not None:
        print("--- daemon log:\n" + daemon.log(), file=sys.stderr)
    sys.exit(1)


def wait_for(predicate, what, timeout=20.0, daemon=None, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    fail("timed out after %.0f s waiting for %s" % (timeout, what), daemon)


class Daemon:
    """gpumemd with --socket in a fresh directory; stderr goes to a log file.

    `inherit_socket`: a listening socket object handed over as fd 3 with
    LISTEN_FDS=1 and LISTEN_PID set to the daemon's own pid, as systemd does.
    """

    def __init__(self, gpumemd, ctl, args=(), env=None, inherit_socket=None,
                 listen_fds=1, workdir=None):
        self.gpumemd = gpumemd
        self.ctl_path = ctl
        self.workdir = workdir or tempfile.mkdtemp(prefix="/tmp/gpumemd-ops-")
        self.sock = os.path.join(self.workdir, "gpumemd.sock")
        self.log_path = os.path.join(self.workdir, "daemon.log")
        full_env = dict(os.environ)
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
                  "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            full_env.pop(k, None)
        full_env.update(env or {})
        argv = [gpumemd] + list(args)
        if not any(a.startswith("--socket=") for a in args):
            argv.insert(1, "--socket=" + self.sock)
        if not any(a.startswith("--ledger=") for a in args):
            # A private ledger: one daemon per ledger file, and not the
            # system's /var/lib/gpumemd.
            argv.insert(1, "--ledger=" + os.path.join(
                tempfile.mkdtemp(prefix="/tmp/gpumemd-ledger-"), "ledger.db"))
        self._log = open(self.log_path, "w")
        if inherit_socket is None:
            self.proc = subprocess.Popen(argv, stderr=self._log, stdout=self._log,
                                         env=full_env)
        else:
            # LISTEN_PID must be the daemon's pid: a shell exports its own $$
            # and execs gpumemd, which keeps that pid.
            full_env["LISTEN_FDS"] = str(listen_fds)
            fd = inherit_socket.fileno()

            def to_fd3():
                # dup2 onto itself keeps close-on-exec: clear it explicitly.
                for target in range(3, 3 + listen_fds):
                    if target != fd:
                        os.dup2(fd, target)
                    os.set_inheritable(target, True)

            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"',
                 "sh"] + argv,
                stderr=self._log, stdout=self._log, env=full_env,
                preexec_fn=to_fd3, close_fds=False)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_serving(self, timeout=30.0):
        wait_for(lambda: "gpumemd: serving" in self.log() or self.proc.poll() is not None,
                 "the daemon to start", timeout, self)
        if self.proc.poll() is not None:
            fail("daemon exited with %s at start" % self.proc.returncode, self)

    def ctl(self, *args, check=True):
        r = subprocess.run([self.ctl_path, "--socket=" + self.sock] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=60)
        if check and r.returncode != 0:
            fail("gpumemctl %s exited %d: %s%s" % (" ".join(args), r.returncode,
                                                   r.stdout, r.stderr), self)
        return r

    def stats(self, counters=False):
        """GetStats as JSON; without its counters (what was done so far,
        the uptime) unless asked: the state, for before/after compares."""
        out = json.loads(self.ctl("stats", "--json").stdout)
        if not counters:
            out.pop("counters", None)
        return out

    def hold(self, *alloc_args):
        """gpumemctl alloc ... --hold --json in the background; returns
        (process, allocation list) once it has printed its allocation."""
        p = subprocess.Popen([self.ctl_path, "--socket=" + self.sock, "alloc"] +
                             list(alloc_args) + ["--hold", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        text = ""
        while True:
            line = p.stdout.readline()
            if not line:
                fail("gpumemctl alloc --hold ended without output", self)
            text += line
            try:
                return p, json.loads(text)
            except ValueError:
                continue

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout=60.0):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            fail("daemon did not exit within %.0f s" % timeout, self)

    def stop(self, timeout=60.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.wait_exit(timeout)
        if rc != 0:
            fail("daemon exited with %d" % rc, self)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def scrape(url, timeout=10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def parse_metrics(text):
    """{(name, frozenset(labels.items())): value} from the text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        labels = {}
        if "{" in head:
            name, rest = head.split("{", 1)
            for part in rest.rstrip("}").split(","):
                if part:
                    k, v = part.split("=", 1)
                    labels[k] = v.strip('"')
        else:
            name = head
        out[(name, frozenset(labels.items()))] = float(value)
    return out
