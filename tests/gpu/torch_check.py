"""PyTorch on a GPU through gpumemd's pluggable-allocator hook, for
tests/gpu/run: torch.cuda.memory.CUDAPluggableAllocator over
libgpumem.so.1's gpumem_torch_malloc/gpumem_torch_free, then work shaped to
catch a free that is not stream-ordered: on a side stream a long kernel
(torch.cuda._sleep) is queued before the tensor it then writes is freed; the
next tensor of that size, filled on the default stream, must keep its
values. Then a matmul checked against the CPU, and a CUDA graph captured
with torch.cuda.graph (global mode) whose tensors come from gpumemd during
the capture: the capture must end valid and three replays must match eager
results. Prints one JSON line.

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

# A same-stream reuse (informational): the next tensor of a freed one's size
# on the same stream gets its block at once.
t = torch.empty(1 << 18, device=dev)
freed_ptr = t.data_ptr()
del t
t = torch.empty(1 << 18, device=dev)
same_stream_reuse = t.data_ptr() == freed_ptr
del t

try:
    static_in = torch.zeros(1 << 20, device=dev)
    warm = torch.cuda.Stream(device=dev)
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        (static_in * 2 + 1).sum()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tmp = static_in * 2 + 1  # allocated through gpumemd during the capture
        static_out = tmp.sum()
        del tmp  # freed inside the capture: must not be handed out while the graph lives
    for v in (1.0, 2.0, 3.0):
        static_in.fill_(v)
        graph.replay()
        torch.cuda.synchronize()
        want = (v * 2 + 1) * static_in.numel()
        if abs(float(static_out.item()) - want) > 1e-3 * want:
            report("fail", "graph replay with input %g gave %g, eager gives %g" %
                   (v, float(static_out.item()), want))
    del graph
except Exception as e:  # noqa: BLE001 - reported
    report("fail", "graph capture through gpumem: %r" % e)
report("pass", "torch %s on %s: stream-ordered frees kept the next owner's values; matmul "
       "matches the CPU (max error %g); a graph captured through gpumemd replayed 3 times "
       "as eager" % (torch.__version__, torch.cuda.get_device_name(dev), err),
       same_stream_reuse=same_stream_reuse)
