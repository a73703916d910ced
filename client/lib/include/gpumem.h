/* gpumem.h: the C ABI of the gpumemd client library (libgpumem.so.1).
 * Small requests (up to the cache threshold) are served in-process from
 * leases, blocks the library allocates from the daemon and sub-allocates;
 * larger ones are one allocation at the daemon each. The daemon charges the
 * tenant for whole leases, so quotas stay exact at lease granularity.
 *
 * What it guarantees: every function that can fail returns an int status
 * (GPUMEM_OK or one of the codes below) and sets this thread's last error
 * (code and a message a person can act on, gpumem_last_error() and
 * gpumem_last_error_message(); a successful call sets GPUMEM_OK); bad input
 * never crashes the library nor corrupts its pool, it gets the documented
 * code; a daemon restart loses only what cannot survive it (GPUMEM_E_LOST).
 * All functions are thread-safe on one client, except that gpumem_close()
 * must not race with other calls on the same client.
 */
#ifndef GPUMEMD_CLIENT_GPUMEM_H_
#define GPUMEMD_CLIENT_GPUMEM_H_

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. 1-16 are the daemon's (gRPC/absl) codes, passed through. */
enum {
  GPUMEM_OK = 0,
  GPUMEM_E_INVALID_ARGUMENT = 3,    /* size 0, bad placement text, ... */
  GPUMEM_E_NOT_FOUND = 5,
  GPUMEM_E_PERMISSION_DENIED = 7,
  GPUMEM_E_RESOURCE_EXHAUSTED = 8,  /* nothing allowed can hold it (quota, capacity) */
  GPUMEM_E_FAILED_PRECONDITION = 9,
  GPUMEM_E_INTERNAL = 13,
  GPUMEM_E_UNAVAILABLE = 14,        /* no daemon answers (after the reconnect wait) */
  /* The library's own: */
  GPUMEM_E_FOREIGN_POINTER = 101,   /* not memory of this client (or NULL) */
  GPUMEM_E_DOUBLE_FREE = 102,       /* in this client's memory, but not a live block:
                                       freed already, or not the start of a block */
  /* A block that did not survive a daemon restart. A restart (crash, kill -9,
   * upgrade): the library reconnects in the background and re-presents its
   * leases and large blocks, and those the new daemon keeps carry on as they
   * were (same pointers, freed normally); calls made meanwhile wait for it
   * (GPUMEM_RECONNECT_MS). A block that did not survive (legacy CUDA IPC
   * memory, one the daemon could not take back, everything after a daemon
   * that stopped for good) is lost: its pointer is invalid, its memory stays
   * mapped, orphaned, until the program frees it (so a thread still writing
   * it does not crash; legacy IPC memory excepted, which died with the
   * daemon), its addresses stay reserved, and gpumem_free() of it answers
   * this code. */
  GPUMEM_E_LOST = 103,
  GPUMEM_E_CLOSED = 104,            /* the client was closed */
  GPUMEM_E_FORKED = 105,            /* called in a fork() child on the parent's client */
};

typedef struct gpumem_client gpumem_client;

/* Where memory may come from; every field may be NULL/0 (any device, the
 * daemon's default policy). Lists are the CLI's: "0,1", "all", "GPU-<uuid>". */
typedef struct gpumem_placement {
  const char* gpus;                 /* allowed devices */
  const char* exclude;              /* never used */
  const char* const* fallback;      /* further sets, tried in order */
  size_t fallback_count;
  const char* policy;               /* "least-loaded", "pack", "near:<dev>" */
} gpumem_placement;

/* Connects to `socket_path` (NULL: $GPUMEMD_SOCKET, then the default). NULL
 * on failure, with the last error set. The handle stays valid after
 * gpumem_close() (only to answer GPUMEM_E_CLOSED): its few bytes are kept.
 * A bad pointer (a double free, a pointer this client did not hand out), a
 * size of 0 or beyond any device, a call after gpumem_close() and a call
 * from a fork() child on the parent's client each get their code.
 *
 * Environment (read here and by the PyTorch entry points):
 *   GPUMEMD_SOCKET            the daemon's socket (default /run/gpumemd/gpumemd.sock)
 *   GPUMEM_PLACEMENT          default placement, CLI form: "--gpus=0,1 --policy=pack"
 *   GPUMEM_LEASE_SIZE         bytes per lease, e.g. "64MiB" (default 64 MiB)
 *   GPUMEM_CACHE_MAX          largest request served from leases (default 1/4 lease)
 *   GPUMEM_IDLE_RELEASE_MS    an empty lease goes back after this idle time (default 10000)
 *   GPUMEM_RECONNECT_MS       how long a call waits for a restarting daemon (default 30000)
 */
gpumem_client* gpumem_connect(const char* socket_path);

/* Frees everything the client holds (its leases and large blocks) and
 * disconnects. Pointers from it become invalid. */
int gpumem_close(gpumem_client* client);

/* `size` bytes placed by `where` (NULL: $GPUMEM_PLACEMENT, else any device).
 * Blocks are 256-byte aligned. */
int gpumem_malloc(gpumem_client* client, size_t size, const gpumem_placement* where,
                  void** out);
/* The same with the placement in CLI form: "--gpus=0,1 --exclude=2
 * --fallback=3 --policy=pack" (flags may also be written without "--"). */
int gpumem_malloc_str(gpumem_client* client, size_t size, const char* placement,
                      void** out);
/* One block per shard on `shards` distinct devices, all or nothing; shard i
 * gets total/shards bytes (the last one the remainder), its pointer in
 * ptrs[i], its size in sizes[i] and its daemon device index in devices[i]
 * (sizes and devices may be NULL). Each shard is freed with gpumem_free(). */
int gpumem_malloc_sharded(gpumem_client* client, size_t total, unsigned shards,
                          const gpumem_placement* where, void** ptrs, size_t* sizes,
                          int* devices);

/* Returns a block. See the codes above for what bad pointers get; NULL is a
 * no-op (GPUMEM_OK), as with free(). A large block (or shard) freed twice is
 * GPUMEM_E_FOREIGN_POINTER: its memory went back to the daemon.
 *
 * Device memory (a CUDA daemon): gpumem_free returns at once, and the block
 * is reused (by this process, or by the daemon for another) only after all
 * the work this process queued on the block's device before the call has
 * completed, as cudaFree's implicit synchronization would ensure, but
 * without waiting in the call: freed blocks wait, and one cuCtxSynchronize
 * of the device (on the device's primary context) gives them back: run by
 * the library's thread when those waiting exceed two leases' worth (the
 * freeing thread never waits for it), and by the caller when the daemon has
 * no memory left for an allocation, and in gpumem_trim and gpumem_close.
 * Work queued in other contexts than the device's primary one is not waited
 * for: synchronize it before freeing. Host memory (the sim backend) is
 * reused at once. */
int gpumem_free(gpumem_client* client, void* ptr);

/* How many devices the daemon has (-1 on error, last error set). */
int gpumem_device_count(gpumem_client* client);
/* How many of them this process can see (its CUDA devices, after
 * CUDA_VISIBLE_DEVICES and the container's GPUs): the devices a malloc with
 * no placement, and each shard of gpumem_malloc_sharded, may land on. All of
 * them where this process has no CUDA driver or sees none of the daemon's
 * devices (the sim backend). -1 on error, last error set. */
int gpumem_visible_device_count(gpumem_client* client);

/* [ptr, ptr + size) of a live block as a dma-buf for a NIC
 * (ibv_reg_dmabuf_mr(pd, *offset, size, iova, *fd, access)): *fd covers the
 * range widened to whole host pages and is the caller's to close; *offset
 * is where ptr is in it. The range must lie in the block's lease (or
 * whole block), and the block must stay allocated while the NIC uses it.
 * GPUMEM_E_FAILED_PRECONDITION for host memory (the sim backend) or a
 * device without dma-buf support; GPUMEM_E_INVALID_ARGUMENT for a size of
 * 0 or past the block's memory. Slabs are made GPUDirect RDMA capable where
 * the device supports it. */
int gpumem_export_dmabuf(gpumem_client* client, const void* ptr, size_t size, int* fd,
                         size_t* offset);

/* The daemon's device index of a live block, or -1 (last error set). */
int gpumem_device_of(gpumem_client* client, const void* ptr);

/* Where a live block is in this process's own terms: *ordinal is the CUDA
 * device ordinal of its device in this process (cuDeviceGet's numbering,
 * after CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and the container's GPUs;
 * with a single GPU offload target, also the OpenMP device number), or -1
 * when the block is host memory the program may dereference (the sim
 * backend). GPUMEM_E_FAILED_PRECONDITION when its device is not visible to
 * this process. */
int gpumem_device_ordinal(gpumem_client* client, const void* ptr, int* ordinal);

/* Gives every empty lease back to the daemon now (also blocks cached by
 * threads, and freed blocks once the device work queued before their free
 * has completed: it may wait for that). `released` (may be NULL) receives
 * the bytes given back. */
int gpumem_trim(gpumem_client* client, size_t* released);

/* The library's figures (leased, in use, cached, large) and the daemon's
 * GetStats, as a JSON object. *json is malloc()ed: release with
 * gpumem_string_free(). */
int gpumem_stats_json(gpumem_client* client, char** json);
void gpumem_string_free(char* s);

/* A read-only call to the daemon, as JSON (proto field names, every field
 * printed; 64-bit integers are JSON strings, as in proto3's JSON mapping).
 * `method` is "GetStats", "GetSession", "GetUsage" or "GetLedger";
 * `request_json` is its request message as JSON (NULL or "": the empty
 * request), e.g. {"tenant": "ml", "limit": 10, "newest": true} for GetLedger.
 * The daemon's visibility rules apply (a non-admin sees its own tenant).
 * Another method, or a request that does not parse, is
 * GPUMEM_E_INVALID_ARGUMENT. *response_json is malloc()ed: release with
 * gpumem_string_free(). */
int gpumem_call_json(gpumem_client* client, const char* method, const char* request_json,
                     char** response_json);

/* What the client's tenant may still take on the daemon's device `device`,
 * as torch.cuda.mem_get_info() answers: *total_bytes is the device's size
 * capped by the tenant's quotas (total and for the device), *free_bytes the
 * room left under all of them and on the device, plus this client's idle
 * lease bytes there (client/lib/tenant_budget.h has the rule). Either pointer
 * may be NULL. */
int gpumem_mem_get_info(gpumem_client* client, int device, size_t* free_bytes,
                        size_t* total_bytes);

/* This thread's last error: its code and message (the message stays valid
 * until this thread's next gpumem_* call). */
int gpumem_last_error(void);
const char* gpumem_last_error_message(void);
/* "GPUMEM_E_DOUBLE_FREE", ... for a code. */
const char* gpumem_status_name(int code);

/* PyTorch's pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator):
 * one process-wide client configured from the environment. `device` is the
 * process's own CUDA ordinal, as the driver numbers it (cuDeviceGet, after
 * CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and the container's GPUs; "MIG-"
 * instances included); it is mapped to the daemon's device by UUID. Returns
 * NULL when the memory cannot be had (last error set). PyTorch's pluggable
 * allocator does not check for NULL: the tensor it makes has data pointer
 * 0, and the first kernel on it faults. Size the work from mem_get_info
 * (below) so that it fits, and check refusals in gpumem_torch_memory_stats;
 * or serve a torch.cuda.MemPool with these two (gpumem.torch.mem_pool()):
 * PyTorch's caching allocator turns a NULL segment into
 * torch.OutOfMemoryError, and gpumem_torch_last_refusal says why.
 *
 * gpumem_torch_free follows PyTorch's contract for its allocator: it returns
 * at once, and the block is reused only after the work queued on `stream`
 * (the cudaStream_t the block was allocated on) before the free has
 * completed: an event is recorded on `stream` at the free, and the block
 * waits for it. On a stream that is capturing a CUDA graph, the block is
 * held until the graph and its executables are destroyed (every replay
 * uses it). */
void* gpumem_torch_malloc(ssize_t size, int device, void* stream);
void gpumem_torch_free(void* ptr, ssize_t size, int device, void* stream);
/* gpumem_mem_get_info for the PyTorch entry points' client, `device` being
 * this process's ordinal as gpumem_torch_malloc maps it (what
 * gpumem.torch.enable() makes torch.cuda.mem_get_info() answer). */
int gpumem_torch_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);

/* What the PyTorch entry points did on this process's ordinal `device`, as
 * torch.cuda.memory_stats() reports it (gpumem.torch.enable() makes it, and
 * memory_allocated(), max_memory_allocated(), memory_reserved(),
 * max_memory_reserved(), answer from here):
 *   allocated_bytes: bytes PyTorch asked for in blocks it has not freed;
 *   reserved_bytes: bytes this process holds from gpumemd on the device
 *     (leases and whole blocks, idle and awaiting their stream included);
 *   the peaks: since the process began or the last reset (reserved's peak
 *     is the largest figure learnt, at a stats call, a reset, or a malloc
 *     that took the process past what it held);
 *   allocations, frees: successful ones; refusals: mallocs answered NULL;
 *   graph_held_bytes: over every device, blocks freed on a stream that was
 *     capturing a CUDA graph, held until that graph and its executables
 *     are destroyed (every replay uses them).
 * INVALID_ARGUMENT for an ordinal outside 0..63. */
typedef struct gpumem_torch_stats {
  unsigned long long allocated_bytes, allocated_bytes_peak;
  unsigned long long reserved_bytes, reserved_bytes_peak;
  unsigned long long allocations, frees, refusals;
  unsigned long long graph_held_bytes;
} gpumem_torch_stats;
int gpumem_torch_memory_stats(int device, gpumem_torch_stats* out);
/* The peaks of `device` start again from the current figures. */
int gpumem_torch_reset_peak_memory_stats(int device);
/* Gives what the PyTorch entry points' client holds unused back to gpumemd
 * (gpumem_trim; torch.cuda.empty_cache() under gpumem.torch). */
int gpumem_torch_empty_cache(void);
/* PyTorch's Tensor.record_stream, which its pluggable allocator drops (it
 * has no hook for it from Python; gpumem.torch.enable() routes it here):
 * the block starting at `ptr` (a live gpumem_torch_malloc block) is used on
 * `stream` too, so its gpumem_torch_free waits for all the work this
 * process queued on the block's device before the free, as gpumem_free
 * does, instead of only its own stream's. GPUMEM_E_FOREIGN_POINTER (or
 * DOUBLE_FREE) for a pointer that is not a live block's start. */
int gpumem_torch_record_stream(void* ptr, void* stream);
/* Why the calling thread's last gpumem_torch_malloc answered NULL (gpumemd's
 * words, e.g. the tenant's quota), "" if none did; kept until the next NULL
 * answer on this thread (other calls leave it), so it survives what PyTorch
 * calls between a NULL segment and the torch.OutOfMemoryError it raises.
 * Valid until this thread's next gpumem_torch_malloc. */
const char* gpumem_torch_last_refusal(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* GPUMEMD_CLIENT_GPUMEM_H_ */
