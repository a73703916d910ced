#!/usr/bin/env python3
"""tests/gpu/torch_bench.py: one PyTorch CUDA allocator, measured, for
tests/gpu/run's torchbench check, which runs it once per allocator, each in
a fresh process, and puts the allocators side by side. What gpumemd costs a
PyTorch program, and whether it keeps PyTorch's promises, only shows beside
PyTorch's own allocators on the same GPU:

  first_alloc_us       the process's first CUDA allocation (1 MiB), timed
                       after CUDA is initialised (context creation excluded)
  alloc_free_idle_us   p50/p99 of a warm `torch.empty(n); del` pair, n = 4 KiB,
  alloc_free_busy_us   1 MiB, 64 MiB, 1 GiB; "busy": 8192^3 bf16 matmuls are
                       queued on the stream first (and topped up between
                       batches of pairs), so the frees happen while work on
                       the stream is pending ("pending_fraction": the share
                       of batches after which the stream still had work)
  copy_gbps            dst.copy_(src) of 1 GiB, GB/s copied (1e9 bytes/s; the
                       memory traffic is twice that), best of 5 rounds timed
                       with CUDA events (copy_gbps_rounds: each round)
  matmul_tflops        8192^3 bf16 torch.mm, timed with CUDA events
  graph                a torch.cuda.graph capture (warmed up on a side
                       stream, as PyTorch's docs do) replayed 3 times with new
                       inputs: each replay allclose to eager
  record_stream        a tensor read on a side stream (held up by a sleep
                       kernel), t.record_stream(side), del t, the next tensor
                       filled on the current stream: the side stream's result
                       must be the old values'
  mem_get_info         torch.cuda.mem_get_info() at the start (and _end: at the
                       end) as this allocator answers it
  train_ms_per_iter    4 Linear layers 4096 wide, AdamW, bf16 autocast:
                       ms per training step, 20 steps after 5 of warm-up

  python3 torch_bench.py --allocator=NAME [--device=N] [--quick]
                         [--progress=FILE] [--oom=mem_pool|enable]

NAME: native (PyTorch's caching allocator), expandable (the same with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), async
(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), gpumem
(gpumem.torch.enable() before any CUDA allocation: every tensor comes from
gpumemd at $GPUMEMD_SOCKET, through $GPUMEM_LIBRARY or the package's own
library). This script sets PYTORCH_CUDA_ALLOC_CONF itself before it
imports torch (run sets it in the environment too). --quick divides the
iteration counts by 10. --progress: the JSON so far, rewritten after each
measurement, so a process that dies or hangs still leaves what it measured.

--oom (gpumem only; run sets the tenant's quota to 1 GiB first) measures
only this, in its own process, because the two routes exclude each other:
mem_pool: inside gpumem.torch.use_mem_pool(gpumem.torch.mem_pool()), 1 MiB
is served and 2 GiB raises torch.OutOfMemoryError carrying gpumemd's reason
("oom": {"ok", "message", "reason", ...}); enable: 2 GiB through
gpumem.torch.enable() reports what happened ("oom_enable": the data pointer,
or the exception), and no kernel ever touches that tensor.

Prints one JSON object on stdout: {"allocator", "torch", "device_name", ...,
measurement: figure or {"error": "..."}}. Each measurement is guarded: an
error is recorded under its key and the next one runs. Exit status 0 when
the measurements ran (whatever they found), 2 when nothing could run (no
torch, no CUDA device, gpumem not installable): then the JSON is
{"allocator", "error"}.
"""
import argparse
import gc
import json
import math
import os
import sys
import time

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

ALLOC_CONF = {
    "native": None,
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
    "gpumem": None,
}
# (label, bytes, pairs timed): fewer for 1 GiB.
PAIR_SIZES = (("4KiB", 4 * KiB, 2000), ("1MiB", MiB, 2000), ("64MiB", 64 * MiB, 1000),
              ("1GiB", GiB, 200))
PAIR_WARMUP = 20
BUSY_BATCH = 16          # pairs timed between two top-ups of the matmul queue
BUSY_TOPUP = 2           # 8192^3 bf16 matmuls queued before each batch
BUSY_START = 8           # ... and before the first
MATMUL_N = 8192
SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep: ~0.1 s of GPU time


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = {"allocator": args.allocator, "quick": args.quick}
        self.torch = None
        self.dev = None

    # --- plumbing ------------------------------------------------------
    def iters(self, n, least=1):
        return max(least, n // 10) if self.args.quick else n

    def save_progress(self):
        if not self.args.progress:
            return
        tmp = self.args.progress + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.out, f)
            os.replace(tmp, self.args.progress)
        except OSError:
            pass

    def sync(self):
        try:
            self.torch.cuda.synchronize(self.dev)
        except Exception:  # noqa: BLE001 - a sticky CUDA error shows in the next measurement
            pass

    def measure(self, key, fn):
        """out[key] = fn(), or {"error": ...}; then everything fn made is
        freed and the GPU is idle again."""
        t0 = time.time()
        try:
            self.out[key] = fn()
        except Exception as e:  # noqa: BLE001 - recorded under its key
            self.out[key] = {"error": describe(e)}
        gc.collect()
        self.sync()
        self.out.setdefault("seconds", {})[key] = round(time.time() - t0, 2)
        self.save_progress()

    def fail(self, why):
        """Nothing could run: one JSON object saying why, exit status 2."""
        self.out["error"] = why
        self.save_progress()
        print(json.dumps(self.out), flush=True)
        sys.exit(2)

    # --- setup -----------------------------------------------------------
    def setup(self):
        """Imports torch (after PYTORCH_CUDA_ALLOC_CONF is set) and, for
        gpumem, installs the route asked for before any CUDA allocation."""
        a = self.args
        conf = ALLOC_CONF[a.allocator]
        # PYTORCH_ALLOC_CONF is the newer name (2.9+); one of them only.
        os.environ.pop("PYTORCH_ALLOC_CONF", None)
        if conf is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
        self.out["alloc_conf"] = conf
        try:
            import torch
        except ImportError as e:
            self.fail("torch is not installed: %s" % e)
        self.torch = torch
        self.out["torch"] = torch.__version__
        self.out["torch_cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            self.fail("torch %s sees no CUDA device" % torch.__version__)
        if a.device >= torch.cuda.device_count():
            self.fail("no CUDA device %d (torch sees %d)" % (a.device, torch.cuda.device_count()))
        self.dev = torch.device("cuda", a.device)
        if a.allocator == "gpumem":
            try:
                gpumem_torch = import_gpumem_torch()
            except Exception as e:  # noqa: BLE001 - ImportError, or the library's load error
                self.fail("import gpumem.torch: %s" % describe(e))
            self.gpumem_torch = gpumem_torch
            self.out["gpumemd_socket"] = os.environ.get("GPUMEMD_SOCKET", "")
            if a.oom != "mem_pool":
                try:
                    gpumem_torch.enable()
                except Exception as e:  # noqa: BLE001 - the allocator could not be installed
                    self.fail("gpumem.torch.enable(): %s" % describe(e))
        try:
            self.out["device_name"] = torch.cuda.get_device_name(self.dev)
        except Exception as e:  # noqa: BLE001 - informational
            self.out["device_name"] = {"error": describe(e)}

    # --- measurements ------------------------------------------------------
    def first_alloc_us(self):
        torch = self.torch
        torch.cuda.init()
        torch.cuda.set_device(self.dev)
        torch.cuda.synchronize(self.dev)  # the context exists from here on
        t0 = time.perf_counter_ns()
        x = torch.empty(MiB, dtype=torch.uint8, device=self.dev)
        t1 = time.perf_counter_ns()
        ptr = x.data_ptr()
        del x
        if ptr == 0:
            raise RuntimeError("the first 1 MiB tensor got data pointer 0 (a refused allocation)")
        return round((t1 - t0) / 1e3, 1)

    def allocator_backend(self):
        torch = self.torch
        info = {"backend": torch.cuda.get_allocator_backend()}
        if self.args.allocator == "gpumem":
            # PyTorch names its configured backend; the allocator in use is
            # the pluggable one enable() installed.
            info["in_use"] = "CUDAPluggableAllocator (gpumem.torch.enable())"
        if self.args.allocator in ("native", "expandable"):
            try:
                settings = torch.cuda.memory._snapshot().get("allocator_settings", {})
                if "expandable_segments" in settings:
                    info["expandable_segments"] = bool(settings["expandable_segments"])
            except Exception as e:  # noqa: BLE001 - private API, informational
                info["snapshot_error"] = describe(e)
        return info

    def mem_get_info(self):
        free, total = self.torch.cuda.mem_get_info(self.dev)
        return {"free_bytes": int(free), "total_bytes": int(total)}

    def matmul_operands(self):
        torch = self.torch
        a = torch.randn(MATMUL_N, MATMUL_N, device=self.dev, dtype=torch.bfloat16)
        b = torch.randn(MATMUL_N, MATMUL_N, device=self.dev, dtype=torch.bfloat16)
        c = torch.empty(MATMUL_N, MATMUL_N, device=self.dev, dtype=torch.bfloat16)
        return a, b, c

    def alloc_free(self, busy):
        """{label: {"p50", "p99", "pairs"[, "pending_fraction"]}} of warm
        malloc+free pairs, each size guarded on its own."""
        torch = self.torch
        dev = self.dev
        stream = torch.cuda.current_stream(dev)
        operands = self.matmul_operands() if busy else None
        res = {}
        for label, n, count in PAIR_SIZES:
            try:
                for _ in range(self.iters(PAIR_WARMUP, 2)):
                    x = torch.empty(n, dtype=torch.uint8, device=dev)
                    ptr = x.data_ptr()
                    del x
                    if ptr == 0:
                        raise RuntimeError("a %s tensor got data pointer 0 (a refused "
                                           "allocation)" % label)
                pairs = self.iters(count, 5)
                times = []
                batches = pending = 0
                if busy:
                    a, b, c = operands
                    for _ in range(BUSY_START):
                        torch.mm(a, b, out=c)
                for i in range(pairs):
                    if busy and i % BUSY_BATCH == 0:
                        if i:
                            batches += 1
                            pending += 0 if stream.query() else 1
                        for _ in range(BUSY_TOPUP):
                            torch.mm(a, b, out=c)
                    t0 = time.perf_counter_ns()
                    x = torch.empty(n, dtype=torch.uint8, device=dev)
                    del x
                    times.append(time.perf_counter_ns() - t0)
                if busy:
                    batches += 1
                    pending += 0 if stream.query() else 1
                torch.cuda.synchronize(dev)
                row = {"p50": percentile_us(times, 50), "p99": percentile_us(times, 99),
                       "pairs": pairs}
                if busy:
                    row["pending_fraction"] = round(pending / batches, 3)
                res[label] = row
            except Exception as e:  # noqa: BLE001 - this size only
                res[label] = {"error": describe(e)}
                self.sync()
        return res

    def copy_gbps(self):
        torch = self.torch
        src = torch.empty(GiB, dtype=torch.uint8, device=self.dev)
        dst = torch.empty(GiB, dtype=torch.uint8, device=self.dev)
        if src.data_ptr() == 0 or dst.data_ptr() == 0:
            raise RuntimeError("a 1 GiB tensor got data pointer 0 (a refused allocation)")
        src.fill_(7)
        for _ in range(3):
            dst.copy_(src)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        copies = self.iters(20, 4)
        rounds = []
        for _ in range(5):
            start.record()
            for _ in range(copies):
                dst.copy_(src)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            rounds.append(round(GiB * copies / (ms / 1e3) / 1e9, 1))
        if not bool((dst[:MiB] == 7).all().item()):
            raise RuntimeError("the copy's destination does not hold the source's bytes")
        self.out["copy_gbps_rounds"] = rounds
        return max(rounds)

    def matmul_tflops(self):
        torch = self.torch
        a, b, c = self.matmul_operands()
        for _ in range(5):
            torch.mm(a, b, out=c)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        iters = self.iters(20, 5)
        start.record()
        for _ in range(iters):
            torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        return round(2.0 * MATMUL_N ** 3 * iters / (ms / 1e3) / 1e12, 1)

    def graph(self):
        torch = self.torch
        dev = self.dev
        w = torch.randn(1024, 1024, device=dev) / 32
        static_x = torch.zeros(256, 1024, device=dev)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                static_y = (static_x @ w).relu() + 1
        torch.cuda.current_stream(dev).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = (static_x @ w).relu() + 1
        diffs = []
        ok = True
        for _ in range(3):
            new_x = torch.randn(256, 1024, device=dev)
            static_x.copy_(new_x)
            g.replay()
            eager = (new_x @ w).relu() + 1
            torch.cuda.synchronize(dev)
            ok = ok and bool(torch.allclose(static_y, eager, rtol=1e-3, atol=1e-3))
            diffs.append(float((static_y - eager).abs().max().item()))
        del g
        return {"ok": ok, "detail": "3 replays with new inputs vs eager: max |diff| %s" %
                ", ".join("%.3g" % d for d in diffs)}

    def record_stream(self):
        torch = self.torch
        dev = self.dev
        n = 16 * MiB  # floats: 64 MiB
        current = torch.cuda.current_stream(dev)
        side = torch.cuda.Stream(device=dev)
        t = torch.empty(n, dtype=torch.float32, device=dev)
        t.fill_(1.0)
        result = torch.empty(n, dtype=torch.float32, device=dev)  # kept until checked
        side.wait_stream(current)
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)  # the read below waits ~0.1 s
            torch.mul(t, 2.0, out=result)
        t.record_stream(side)
        t_ptr = t.data_ptr()
        del t  # the side stream's read is still queued
        u = torch.empty(n, dtype=torch.float32, device=dev)  # on the current stream
        reused = u.data_ptr() == t_ptr
        u.fill_(-5.0)
        torch.cuda.synchronize(dev)
        wrong = int((result != 2.0).sum().item())
        del u, result
        return {"ok": wrong == 0,
                "reused_block": reused,
                "detail": "side stream's result intact; the next tensor %s the freed block" %
                ("got" if reused else "did not get") if wrong == 0 else
                "%d of %d values of the side stream's result were overwritten by the next "
                "tensor (it %s the freed block)" % (wrong, n, "got" if reused else "did not get")}

    def train_ms_per_iter(self):
        torch = self.torch
        dev = self.dev
        width, batch = 4096, 2048
        layers = []
        for i in range(4):
            layers.append(torch.nn.Linear(width, width, device=dev))
            if i < 3:
                layers.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*layers)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(batch, width, device=dev)
        y = torch.randn(batch, width, device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(5):
            step()
        torch.cuda.synchronize(dev)
        steps = self.iters(20, 5)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize(dev)
        return round((time.perf_counter() - t0) * 1e3 / steps, 2)

    # --- gpumem under a 1 GiB quota (run sets it) ---------------------------
    def oom_mem_pool(self):
        """2 GiB inside use_mem_pool(mem_pool()) under a 1 GiB quota must
        raise torch.OutOfMemoryError, with gpumemd's reason appended."""
        torch = self.torch
        gt = self.gpumem_torch
        missing = [f for f in ("mem_pool", "use_mem_pool") if not hasattr(gt, f)]
        if missing:
            return {"ok": False, "error": "gpumem.torch has no %s" % " or ".join(missing)}
        oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
        torch.cuda.init()
        torch.cuda.set_device(self.dev)
        pool = gt.mem_pool()
        res = {"ok": False}
        asked = "1 MiB"
        try:
            # Caught outside the block: use_mem_pool appends gpumemd's
            # reason as the error leaves it.
            with gt.use_mem_pool(pool):
                small = torch.empty(MiB, dtype=torch.uint8, device=self.dev)
                res["small_served"] = small.data_ptr() != 0
                del small
                asked = "2 GiB"
                big = torch.empty(2 * GiB, dtype=torch.uint8, device=self.dev)
                ptr = big.data_ptr()
                del big
            res["detail"] = ("2 GiB under a 1 GiB quota was served (data pointer %#x), not "
                             "refused" % ptr)
        except oom_type as e:
            text = str(e)
            res["ok"] = asked == "2 GiB"
            res["exception"] = type(e).__module__ + "." + type(e).__name__
            res["message"] = text[:300]
            reason = text.rpartition("gpumemd:")
            res["reason"] = reason[2].strip()[:300] if reason[1] else ""
            if asked != "2 GiB":
                res["detail"] = "refused already at 1 MiB, which fits the quota"
        except Exception as e:  # noqa: BLE001 - the wrong kind of failure
            res["detail"] = "%s: not an OutOfMemoryError: %s" % (asked, describe(e))
        # The pool still serves what fits.
        try:
            with gt.use_mem_pool(pool):
                again = torch.empty(MiB, dtype=torch.uint8, device=self.dev)
                res["small_after"] = again.data_ptr() != 0
                del again
        except Exception as e:  # noqa: BLE001 - recorded
            res["small_after"] = {"error": describe(e)}
        self.sync()
        del pool
        return res

    def oom_enable(self):
        """2 GiB through enable() under a 1 GiB quota: what PyTorch's
        pluggable allocator made of the refusal. No kernel touches it."""
        torch = self.torch
        torch.cuda.init()
        torch.cuda.set_device(self.dev)
        res = {}
        try:
            big = torch.empty(2 * GiB, dtype=torch.uint8, device=self.dev)
            res["data_ptr"] = big.data_ptr()
            res["detail"] = ("refused as data pointer 0 (PyTorch's pluggable allocator does not "
                             "check a NULL answer)" if big.data_ptr() == 0 else
                             "2 GiB under a 1 GiB quota was served")
            self.out["oom_enable"] = dict(res)
            self.save_progress()  # in case freeing it goes wrong
            del big
            res["freed"] = True
        except Exception as e:  # noqa: BLE001 - recorded
            res["exception"] = type(e).__module__ + "." + type(e).__name__
            res["message"] = str(e)[:300]
        try:
            res["num_ooms"] = int(torch.cuda.memory_stats(self.dev).get("num_ooms", -1))
        except Exception as e:  # noqa: BLE001 - informational
            res["num_ooms"] = {"error": describe(e)}
        return res

    # --- the whole run -----------------------------------------------------
    def main(self):
        t0 = time.time()
        self.setup()
        if self.args.oom == "mem_pool":
            self.measure("oom", self.oom_mem_pool)
        elif self.args.oom == "enable":
            self.measure("oom_enable", self.oom_enable)
        else:
            self.measure("first_alloc_us", self.first_alloc_us)
            self.measure("allocator_backend", self.allocator_backend)
            self.measure("mem_get_info", self.mem_get_info)
            self.measure("alloc_free_idle_us", lambda: self.alloc_free(busy=False))
            self.measure("alloc_free_busy_us", lambda: self.alloc_free(busy=True))
            self.measure("copy_gbps", self.copy_gbps)
            self.measure("matmul_tflops", self.matmul_tflops)
            self.measure("graph", self.graph)
            self.measure("record_stream", self.record_stream)
            self.measure("train_ms_per_iter", self.train_ms_per_iter)
            self.measure("mem_get_info_end", self.mem_get_info)
        self.out["total_seconds"] = round(time.time() - t0, 1)
        self.save_progress()
        print(json.dumps(self.out), flush=True)
        return 0


def import_gpumem_torch():
    """gpumem.torch, from the installed package or this checkout's
    client/python."""
    try:
        import gpumem.torch as gt
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.normpath(os.path.join(here, "..", "..", "client", "python")))
        import gpumem.torch as gt
    return gt


def percentile_us(times_ns, q):
    """The q-th percentile (nearest rank) of times in ns, in microseconds."""
    s = sorted(times_ns)
    rank = max(1, int(math.ceil(q / 100.0 * len(s))))
    return round(s[rank - 1] / 1e3, 2)


def describe(e):
    return ("%s: %s" % (type(e).__name__, e))[:600]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocator", required=True, choices=sorted(ALLOC_CONF))
    ap.add_argument("--device", type=int, default=0, help="this process's CUDA ordinal")
    ap.add_argument("--quick", action="store_true", help="a tenth of the iterations")
    ap.add_argument("--progress", default="", help="rewrite this file with the JSON so far")
    ap.add_argument("--oom", choices=("mem_pool", "enable"), default=None,
                    help="gpumem only: the quota refusal through this route, nothing else")
    args = ap.parse_args()
    if args.oom and args.allocator != "gpumem":
        ap.error("--oom is for --allocator=gpumem")
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
