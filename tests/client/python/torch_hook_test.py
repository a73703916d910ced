"""gpumem.torch with a stand-in torch module (tests/client/python/fake_torch)
that records what the package calls, against a real daemon whose tenant has
a 2 GiB quota on 16 GiB devices:

  * enable() hands PyTorch the package's own libgpumem.so.1 (its absolute
    path inside the installed package) and the two entry points, changes the
    allocator once, and replaces torch.cuda.mem_get_info; again: no new call.
  * CUDA tensors then come from the daemon (its figures show them).
  * vLLM-style sizing sees the tenant's budget: total is the quota, and the
    KV cache it sizes really fits (every block is allocated), while one more
    gigabyte does not. Before enable(), the same code would size the cache
    from the whole pretend 80 GiB GPU.
  * memory_stats and the functions read from it (which PyTorch cannot
    answer under a pluggable allocator) answer from the library: bytes in
    tensors and their peak, bytes held from the daemon, refusals; a
    refusal is a tensor with data pointer 0, as PyTorch does not check the
    pluggable allocator's NULL; empty_cache gives idle memory back.
  * mem_get_info takes PyTorch's device forms, maps ordinals under
    CUDA_VISIBLE_DEVICES, and refuses what is not a CUDA device.
  * enable() after PyTorch allocated CUDA memory fails with a clear
    message and changes nothing (in a child process).

argv: the gpumemctl path. GPUMEMD_SOCKET names the daemon.
"""
import os
import subprocess
import sys

import torch  # the stand-in (PYTHONPATH)
import gpumem
import gpumem.torch

from torch_test_support import CTL, GiB, MiB, check, daemon_used
from vllm_sizing import determine_num_gpu_blocks


check(os.path.basename(torch.__file__) == "__init__.py" and "fake_torch" in torch.__file__,
      "the stand-in torch is the one imported: %s" % torch.__file__)

# What vLLM would size without gpumem: the whole pretend GPU.
n_native, total_native = determine_num_gpu_blocks(torch, 2 * MiB, 0.9, lambda: None)
check(total_native == 80 * GiB and n_native * 2 * MiB > 2 * GiB,
      "the native view is the whole GPU (%d, %d)" % (n_native, total_native))
del torch.calls[:]
torch.cuda.memory._initialized = False  # the native probe allocated nothing

native_stats = torch.cuda.memory_stats
alloc = gpumem.torch.enable()
lib = gpumem.library_path()
want_lib = os.path.join(os.path.dirname(os.path.abspath(gpumem.__file__)), "libgpumem.so.1")
check(lib == want_lib and os.path.isabs(lib), "library path %s, want %s" % (lib, want_lib))
calls = [c for c in torch.calls if c[0].startswith("cuda.memory.")]
check(calls == [("cuda.memory.CUDAPluggableAllocator",
                 (lib, "gpumem_torch_malloc", "gpumem_torch_free")),
                ("cuda.memory.change_current_allocator", (alloc,))], "calls: %r" % calls)
for name in ("mem_get_info", "memory_stats", "memory_allocated", "max_memory_allocated",
             "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "empty_cache"):
    check(getattr(torch.cuda, name) is getattr(gpumem.torch, name) and
          getattr(torch.cuda.memory, name) is getattr(gpumem.torch, name), name + " replaced")
try:
    native_stats()
    check(False, "PyTorch's own memory_stats answered under a pluggable allocator")
except RuntimeError as e:
    check("does not yet support getDeviceStats" in str(e), str(e))
check(gpumem.torch.enable() is alloc, "enable() again returns the same allocator")
check(sum(1 for c in torch.calls if c[0] == "cuda.memory.change_current_allocator") == 1,
      "the allocator is changed once")

# Tensors come from the daemon.
before = daemon_used(0)
weights = torch.empty(512 * MiB)
check(daemon_used(0) >= before + 512 * MiB, "512 MiB of weights at the daemon")
stats = torch.cuda.memory_stats()
check(stats["allocated_bytes.all.current"] == 512 * MiB and
      stats["allocated_bytes.all.peak"] == 512 * MiB and stats["num_ooms"] == 0 and
      stats["allocation.all.current"] == 1, "stats after the weights: %r" % stats)
check(torch.cuda.memory_reserved() >= 512 * MiB and
      torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved(),
      "reserved %d, peak %d" % (torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()))

free, total = torch.cuda.mem_get_info()
check(total == 2 * GiB, "total is the tenant's 2 GiB quota, not the device: %d" % total)
check(free <= 2 * GiB - 512 * MiB and free > GiB, "free after the weights: %d" % free)


def profile_run():
    activations = [torch.empty(32 * MiB) for _ in range(8)]
    del activations


n, total = determine_num_gpu_blocks(torch, 2 * MiB, 0.9, profile_run)
# What vLLM's profiler reads: the activations' peak on top of the weights.
check(torch.cuda.max_memory_allocated(0) == 512 * MiB + 8 * 32 * MiB and
      torch.cuda.memory_allocated("cuda:0") == 512 * MiB,
      "peak %d, now %d" % (torch.cuda.max_memory_allocated(0), torch.cuda.memory_allocated()))
torch.cuda.reset_peak_memory_stats()
check(torch.cuda.max_memory_allocated() == 512 * MiB, "peak after reset")
check(total == 2 * GiB, "vLLM-style total %d" % total)
check(n > 100 and n * 2 * MiB <= 0.9 * 2 * GiB - 512 * MiB,
      "%d blocks of 2 MiB fit in 90%% of 2 GiB beside 512 MiB of weights" % n)
kv = [torch.empty(2 * MiB) for _ in range(n)]  # every block really fits
check(all(t.data_ptr() != 0 for t in kv), "a KV block with no memory")
# 1 GiB more does not fit the quota. PyTorch does not check the pluggable
# allocator's NULL: the tensor has data pointer 0; the stats count it.
over = torch.empty(GiB)
check(over.data_ptr() == 0, "1 GiB beyond the KV cache should not fit the quota")
check(torch.cuda.memory_stats()["num_ooms"] == 1, "the refusal is counted")
check(torch.cuda.memory_allocated() == 512 * MiB + n * 2 * MiB, "a refusal allocated nothing")
del over
free_now, _ = torch.cuda.mem_get_info(0)
check(free_now < free, "free went down as the cache was allocated (%d -> %d)" % (free, free_now))
held = torch.cuda.memory_reserved()
del kv
torch.cuda.empty_cache()
check(torch.cuda.memory_allocated() == 512 * MiB, "the KV cache freed")
check(torch.cuda.memory_reserved() < held, "empty_cache gave memory back (%d -> %d)" % (
    held, torch.cuda.memory_reserved()))

# Tensor.record_stream reaches the library (PyTorch's own runs first and
# records nothing under a pluggable allocator); a tensor the library did not
# hand out is left alone; PyTorch's argument check still applies.
native_record = [c for c in torch.calls if c[0] == "Tensor.record_stream"]
side = torch.cuda.Stream()
weights.record_stream(side)
check([c for c in torch.calls if c[0] == "Tensor.record_stream"][len(native_record):] ==
      [("Tensor.record_stream", (weights.data_ptr(), side))], "PyTorch's record_stream ran")
foreign = torch.Tensor(64, 0, 0x1234000, None)
foreign.record_stream(side)
try:
    weights.record_stream("not a stream")
    check(False, "record_stream took a string")
except TypeError:
    pass

# Device forms.
class Dev:
    type, index = "cuda", 0


for d in (None, 0, "cuda", "cuda:0", Dev()):
    f, t = torch.cuda.mem_get_info(d)
    check(t == 2 * GiB, "mem_get_info(%r) total %d" % (d, t))
for bad in ("cpu", "cuda:x", True, 3.0):
    try:
        torch.cuda.mem_get_info(bad)
        check(False, "mem_get_info(%r) should fail" % (bad,))
    except gpumem.InvalidArgument as e:
        check("not a CUDA device" in str(e), str(e))
try:
    torch.cuda.mem_get_info(7)
    check(False, "ordinal 7 should not exist")
except gpumem.InvalidArgument as e:
    check("device 7 does not exist" in str(e), str(e))

# Ordinals under CUDA_VISIBLE_DEVICES, and enable() too late: in children.
child = r'''
import os, sys, torch, gpumem, gpumem.torch
mode = sys.argv[1]
if mode == "visible":
    gpumem.torch.enable()
    print(torch.cuda.mem_get_info(0)[1])
else:
    x = torch.empty(1 << 20)          # PyTorch's own allocator is now initialized
    try:
        gpumem.torch.enable()
        print("enabled")
    except RuntimeError as e:
        print("refused: %s" % e)
    print(torch.cuda.mem_get_info is torch.cuda.memory.mem_get_info and
          torch.cuda.mem_get_info is not gpumem.torch.mem_get_info)
'''
subprocess.run([CTL, "quota", "uid-%d" % os.getuid(), "--total=2GiB", "--device=1:1GiB"],
               check=True, capture_output=True)
env = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
out = subprocess.run([sys.executable, "-c", child, "visible"], env=env, capture_output=True,
                     text=True)
check(out.returncode == 0 and out.stdout.strip() == str(GiB),
      "ordinal 0 under CUDA_VISIBLE_DEVICES=1 is the daemon's device 1: %r %r"
      % (out.stdout, out.stderr))
out = subprocess.run([sys.executable, "-c", child, "late"], capture_output=True, text=True)
lines = out.stdout.splitlines()
check(out.returncode == 0 and len(lines) == 2 and lines[0].startswith(
    "refused: gpumem.torch.enable() must run before PyTorch allocates CUDA memory") and
      "already initialized" in lines[0] and lines[1] == "True",
      "enable() too late: %r %r" % (out.stdout, out.stderr))
del weights
print("torch hook: ok")
