"""gpumem.torch's pool route (mem_pool, use_mem_pool) with the stand-in
torch, against a real daemon whose tenant has a 2 GiB quota on 16 GiB
devices: a refusal is torch.OutOfMemoryError carrying gpumemd's reason,
never a tensor with data pointer 0, and the program goes on.

  * Inside use_mem_pool, tensors come from the daemon (through the
    MemPool's allocator: gpumem_torch_malloc/free); outside, from PyTorch.
  * A tensor past the quota raises torch.OutOfMemoryError (a RuntimeError)
    as it leaves the block, its message ending in gpumemd's reason; code
    that catches it inside reads the reason from last_refusal().
  * PyTorch's retry after a NULL segment (its cached segments given back,
    then once more) is served from what they held: with 512 MiB in use and
    a freed 1 GiB segment cached by PyTorch, 1.25 GiB fits the 2 GiB quota.
  * PyTorch's memory_stats stay PyTorch's (they count the pool);
    mem_get_info is the tenant's budget; empty_cache gives memory back to
    the daemon.
  * The two routes exclude each other (enable() after mem_pool(), and
    mem_pool() after enable() in a child).

argv: the gpumemctl path. GPUMEMD_SOCKET names the daemon.
"""
import subprocess
import sys

import torch  # the stand-in (PYTHONPATH)
import gpumem
import gpumem.torch

from torch_test_support import CTL, GiB, MiB, check, daemon_used


check("fake_torch" in torch.__file__, "the stand-in torch is the one imported")
native_stats = torch.cuda.memory_stats
pool = gpumem.torch.mem_pool()
check(isinstance(pool, torch.cuda.MemPool), "mem_pool() is a torch.cuda.MemPool")
check(torch.cuda.memory_stats is native_stats, "PyTorch's memory_stats are kept")
free, total = torch.cuda.mem_get_info()
check(total == 2 * GiB, "mem_get_info is the tenant's budget: total %d" % total)

base = daemon_used(0)
outside = torch.empty(256 * MiB)
check(daemon_used(0) == base, "a tensor outside the pool is PyTorch's own")
with gpumem.torch.use_mem_pool(pool):
    weights = torch.empty(512 * MiB)
check(weights.data_ptr() != 0 and daemon_used(0) >= base + 512 * MiB,
      "512 MiB in the pool are the daemon's (%d -> %d)" % (base, daemon_used(0)))
check(torch.cuda.memory_stats()["allocated_bytes.all.current"] == 768 * MiB,
      "PyTorch counts its own and the pool's tensors: %r" % torch.cuda.memory_stats())
del outside

# Past the quota: an exception with gpumemd's reason, as it leaves the block.
try:
    with gpumem.torch.use_mem_pool(pool):
        over = torch.empty(2 * GiB)
        check(False, "2 GiB beside 512 MiB fit a 2 GiB quota (data_ptr %#x)" % over.data_ptr())
except torch.OutOfMemoryError as e:
    msg = str(e)
    check(isinstance(e, RuntimeError), "torch.OutOfMemoryError is a RuntimeError")
    check(msg.startswith("CUDA out of memory") and "\ngpumemd: " in msg and "quota" in msg,
          "the message carries gpumemd's reason: %r" % msg)
check(torch.cuda.memory_stats()["num_ooms"] == 1, "PyTorch counted the refusal")

# Caught inside the block: the reason from last_refusal(); the program goes on.
with gpumem.torch.use_mem_pool(pool):
    try:
        torch.empty(3 * GiB)
        check(False, "3 GiB fit a 2 GiB quota")
    except torch.OutOfMemoryError as e:
        check("gpumemd" not in str(e), "inside the block the message is PyTorch's")
        check("quota" in gpumem.torch.last_refusal(), "last_refusal(): %r"
              % gpumem.torch.last_refusal())
    big = torch.empty(1536 * MiB - 512 * MiB)
    check(big.data_ptr() != 0, "1 GiB beside the weights fits")
    del big
    # PyTorch keeps the freed 1 GiB segment cached; 1.25 GiB needs it back:
    # its retry after the NULL answer hands the segment to the library,
    # which must serve the retry from it.
    more = torch.empty(1280 * MiB)
    check(more.data_ptr() != 0, "the retry after PyTorch gave its cache back is served")
    del more
del weights
torch.cuda.empty_cache()
check(daemon_used(0) == base, "empty_cache gave the pool's memory back to the daemon "
      "(%d, was %d)" % (daemon_used(0), base))

try:
    gpumem.torch.enable()
    check(False, "enable() after mem_pool() should be refused")
except RuntimeError as e:
    check("one route per process" in str(e), str(e))
out = subprocess.run([sys.executable, "-c", r'''
import gpumem.torch
gpumem.torch.enable()
try:
    gpumem.torch.mem_pool()
    print("made")
except RuntimeError as e:
    print("refused: %s" % e)
'''], capture_output=True, text=True)
check(out.returncode == 0 and out.stdout.startswith("refused: gpumem.torch.mem_pool() after") and
      "one route per process" in out.stdout, "mem_pool() after enable(): %r %r"
      % (out.stdout, out.stderr))
print("torch pool: ok")
