"""PyTorch on a GPU through gpumemd's pluggable-allocator hook, for
tests/gpu/run: torch.cuda.memory.CUDAPluggableAllocator over
libgpumem.so.1's gpumem_torch_malloc/gpumem_torch_free, then work shaped to
catch a free that is not stream-ordered: on a side stream a long kernel
(torch.cuda._sleep) is queued before the tensor it then writes is freed; the
next tensor of that size, filled on the default stream, must keep its
values. Then a matmul checked against the CPU. Prints one JSON line.

argv: LIB DEVICE. GPUMEMD_SOCKET names the daemon.
"""
import json
import sys


def report(result, detail, **extra):
    print(json.dumps(dict(result=result, detail=detail, **extra)))
    sys.exit(0)


lib, device = sys.argv[1], int(sys.argv[2])
try:
    import ctypes
    ctypes.CDLL(lib)
except OSError as e:
    # Carried libraries built against a newer C library than this python's.
    report("skip" if "GLIBC" in str(e) else "fail", "loading %s: %s" % (lib, e))
try:
    import torch
except ImportError:
    report("skip", "torch is not installed")
if not torch.cuda.is_available():
    report("skip", "torch sees no CUDA device")
try:
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "gpumem_torch_malloc",
                                                     "gpumem_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
except Exception as e:  # noqa: BLE001 - reported
    report("fail", "installing the allocator: %r" % e)

dev = torch.device("cuda", device)
torch.cuda.set_device(dev)
n = 64 << 20  # floats: 256 MiB
bad = 0
side = torch.cuda.Stream(device=dev)
for _ in range(3):
    with torch.cuda.stream(side):
        a = torch.empty(n, device=dev)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        a.fill_(7.0)
        del a  # freed while the kernels are queued on `side`
    b = torch.empty(n, device=dev)  # the next owner, on the default stream
    b.fill_(3.0)
    torch.cuda.synchronize()
    bad += int((b != 3.0).sum().item())
    del b
x = torch.randn(1024, 1024)
y = (x.to(dev) @ x.to(dev)).cpu()
err = float((y - x @ x).abs().max())
if bad:
    report("fail", "%d values of the next owner were overwritten by a freed tensor's kernel" % bad)
if err > 1e-2:
    report("fail", "matmul differs from the CPU's by %g" % err)
report("pass", "torch %s on %s: stream-ordered frees kept the next owner's values; matmul "
       "matches the CPU (max error %g)" % (torch.__version__, torch.cuda.get_device_name(dev), err))
