// Device memory in the fake: physical memory (memfds), the VMM calls
// (create, export, import, reserve, map, access, unmap, release), cuMemAlloc,
// legacy IPC, cuMemGetInfo, and the one way bytes are reached (DeviceIo).
//
// Device addresses are ranges of the fake's own address space (VaSpace),
// never host mappings: the host cannot read or write them, and an address
// stays taken exactly as long as the reservation (or allocation, or IPC
// import) that owns it. A legacy IPC import holds nothing of the exporter's:
// each access reopens the exporter's memfd through /proc, so the memory dies
// with its exporter and opens only where the exporter's pid is visible.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tests/fake_cuda/fake_state.h"

namespace fakecuda {

uint64_t DeviceBytesInUse(const State& s, const FakeDevice& d) {
  const std::string tag = "/memfd:fakecuda:" + s.machine + ":" + d.uuid_hex + ":";
  std::set<std::pair<uint64_t, uint64_t>> seen;  // (dev, inode)
  uint64_t total = d.other_used;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return total;
  while (dirent* p = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(p->d_name[0]))) continue;
    std::string base = std::string("/proc/") + p->d_name + "/fd";
    DIR* fds = opendir(base.c_str());
    if (fds == nullptr) continue;
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      std::string link = base + "/" + f->d_name;
      char target[512];
      ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      const char* at = std::strstr(target, tag.c_str());
      if (at == nullptr) continue;
      struct stat st;
      if (stat(link.c_str(), &st) != 0) continue;
      if (!seen.insert({st.st_dev, st.st_ino}).second) continue;
      total += std::strtoull(at + tag.size(), nullptr, 10);
    }
    closedir(fds);
  }
  closedir(proc);
  return total;
}

std::shared_ptr<Memfd> NewPhysical(const State& s, int ordinal, uint64_t bytes,
                                   const char* kind, CUresult* err) {
  const FakeDevice& d = DeviceOf(s, ordinal);
  if (bytes > d.total || DeviceBytesInUse(s, d) + bytes > d.total) {
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return nullptr;
  }
  std::string name = "fakecuda:" + s.machine + ":" + d.uuid_hex + ":" + std::to_string(bytes) +
                     ":" + kind;
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return nullptr;
  }
  if (s.dirty) {
    std::vector<char> junk(kMiB, static_cast<char>(0xA5));
    for (uint64_t at = 0; at < bytes; at += junk.size()) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(junk.size(), bytes - at));
      if (pwrite(fd, junk.data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) break;
    }
  }
  auto m = std::make_shared<Memfd>();
  m->fd = fd;
  m->size = bytes;
  m->ordinal = ordinal;
  return m;
}

namespace {

// The device (ordinal here, -1 if not visible) and size a fake memfd was
// made for, from its name "fakecuda:<machine>:<uuid>:<bytes>:<kind>".
bool DescribeMemfd(const State& s, int fd, int* ordinal, uint64_t* bytes, bool* rdma) {
  char link[64], target[512];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  const char* tag = std::strstr(target, "/memfd:fakecuda:");
  if (tag == nullptr) return false;
  std::string rest = tag + std::strlen("/memfd:fakecuda:");
  size_t c1 = rest.find(':');
  if (c1 == std::string::npos) return false;
  rest = rest.substr(c1 + 1);  // after the machine
  if (rest.size() < 34 || rest[32] != ':') return false;
  const std::string hex = rest.substr(0, 32);
  *bytes = std::strtoull(rest.c_str() + 33, nullptr, 10);
  if (rdma != nullptr) *rdma = rest.find(":vmm-rdma") != std::string::npos;
  for (size_t i = 0; i < s.visible.size(); ++i) {
    if (DeviceOf(s, static_cast<int>(i)).uuid_hex == hex) {
      *ordinal = static_cast<int>(i);
      return true;
    }
  }
  *ordinal = -1;
  return true;
}

// One contiguous part of a device range and where its bytes are.
struct Piece {
  uint64_t ptr = 0, n = 0;
  const Mapping* mapping = nullptr;  // VMM: mapping->mem at mapping->offset + ...
  uint64_t mapping_start = 0;
  const Linear* linear = nullptr;
  uint64_t linear_start = 0;
};

// The pieces of [ptr, ptr + n), or false where a byte is not device memory
// of this process.
bool Resolve(const State& s, uint64_t ptr, uint64_t n, std::vector<Piece>* out) {
  uint64_t cur = ptr, left = n;
  while (left > 0) {
    Piece p;
    p.ptr = cur;
    auto m = s.mappings.upper_bound(cur);
    if (m != s.mappings.begin() && cur - std::prev(m)->first < std::prev(m)->second.size) {
      --m;
      p.mapping = &m->second;
      p.mapping_start = m->first;
      p.n = std::min<uint64_t>(left, m->second.size - (cur - m->first));
    } else {
      auto l = s.linear.upper_bound(cur);
      if (l == s.linear.begin()) return false;
      --l;
      if (cur - l->first >= l->second.size) return false;
      p.linear = &l->second;
      p.linear_start = l->first;
      p.n = std::min<uint64_t>(left, l->second.size - (cur - l->first));
    }
    out->push_back(p);
    cur += p.n;
    left -= p.n;
  }
  return true;
}

// pread/pwrite (or memset) of n bytes at `off` of fd.
bool FdIo(int fd, uint64_t off, uint64_t n, bool write, const char* src, char* dst,
          int memset_value) {
  std::vector<char> fill;
  if (memset_value >= 0) fill.assign(std::min<uint64_t>(n, 4 * kMiB), static_cast<char>(memset_value));
  uint64_t done = 0;
  while (done < n) {
    ssize_t r;
    if (!write) {
      r = pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
    } else if (memset_value >= 0) {
      r = pwrite(fd, fill.data(), std::min<uint64_t>(fill.size(), n - done),
                 static_cast<off_t>(off + done));
    } else {
      r = pwrite(fd, src + done, n - done, static_cast<off_t>(off + done));
    }
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<uint64_t>(r);
  }
  return true;
}

// The exporter's memfd of a legacy IPC import, opened anew, or -1 when the
// exporter has exited or freed it.
int OpenIpcSource(const Linear& l) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", l.ipc_pid, l.ipc_fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_ino != l.ipc_inode) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

namespace {

// Mapped memory: as cuMemSetAccess set it for `from`. cuMemAlloc memory
// and legacy IPC imports: their own device, and its peers (this fake does
// not model cuCtxEnablePeerAccess: it is taken as done).
bool Allows(const State& s, const Piece& p, bool write, int from) {
  if (p.mapping == nullptr) return CanAccess(s, from, p.linear->ordinal);
  auto it = p.mapping->access.find(from);
  if (it == p.mapping->access.end()) return false;
  return write ? it->second == CU_MEM_ACCESS_FLAGS_PROT_READWRITE
               : it->second != CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

}  // namespace

bool Accessible(const State& s, uint64_t ptr, uint64_t n, bool write, int from) {
  if (n == 0) return true;
  std::vector<Piece> pieces;
  if (!Resolve(s, ptr, n, &pieces)) return false;
  for (const Piece& p : pieces) {
    if (!Allows(s, p, write, from)) return false;
  }
  return true;
}

CUresult DeviceIo(State& s, uint64_t ptr, uint64_t n, bool write, const void* src, void* dst,
                  int memset_value, int by) {
  if (n == 0) return CUDA_SUCCESS;
  std::vector<Piece> pieces;
  if (!Resolve(s, ptr, n, &pieces)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  for (const Piece& p : pieces) {
    const uint64_t at = p.ptr - ptr;
    const char* from = src != nullptr ? static_cast<const char*>(src) + at : nullptr;
    char* to = dst != nullptr ? static_cast<char*>(dst) + at : nullptr;
    if (!Allows(s, p, write, by)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (p.mapping != nullptr) {
      const uint64_t off = p.mapping->offset + (p.ptr - p.mapping_start);
      if (!FdIo(p.mapping->mem->fd, off, p.n, write, from, to, memset_value)) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
    } else if (p.linear->ipc_opened) {
      int fd = OpenIpcSource(*p.linear);
      if (fd < 0) {
        Violation(s, "access to legacy IPC memory at " + std::to_string(p.ptr) +
                         " after its exporter (pid " + std::to_string(p.linear->ipc_pid) +
                         ") freed it or exited: legacy IPC memory dies with its exporter");
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
      const bool ok = FdIo(fd, p.ptr - p.linear_start, p.n, write, from, to, memset_value);
      close(fd);
      if (!ok) return CUDA_ERROR_ILLEGAL_ADDRESS;
    } else {
      if (!FdIo(p.linear->mem->fd, p.ptr - p.linear_start, p.n, write, from, to,
                memset_value)) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
    }
  }
  return CUDA_SUCCESS;
}

void CheckNoPendingWork(State& s, uint64_t ptr, uint64_t n, const char* call) {
  for (CUstream_st* st : s.streams) {
    for (const Op& op : st->queue) {
      if (op.n == 0 || op.dptr >= ptr + n || ptr >= op.dptr + op.n) continue;
      char buf[320];
      std::snprintf(buf, sizeof(buf),
                    "%s of [0x%llx, +%llu) while %s queued on stream %d (device %d) still "
                    "uses [0x%llx, +%llu): free or unmap memory only after the work queued "
                    "on it has completed (an event or a synchronize)",
                    call, static_cast<unsigned long long>(ptr),
                    static_cast<unsigned long long>(n), op.what, st->id, st->ordinal,
                    static_cast<unsigned long long>(op.dptr),
                    static_cast<unsigned long long>(op.n));
      Violation(s, buf);
      return;
    }
  }
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the entry points below are the C API

namespace {

// Handle bytes: "FAKEIPC2", pid, fd, inode, size, device UUID.
struct IpcHandleBytes {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t inode;
  uint64_t size;
  unsigned char uuid[16];
  char pad[CU_IPC_HANDLE_SIZE - 8 - 4 - 4 - 8 - 8 - 16];
};
static_assert(sizeof(IpcHandleBytes) == CU_IPC_HANDLE_SIZE, "handle layout");

bool Overlaps(const std::map<uint64_t, Mapping>& m, uint64_t ptr, uint64_t size) {
  auto next = m.lower_bound(ptr);
  if (next != m.end() && next->first < ptr + size) return true;
  if (next != m.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return true;
  }
  return false;
}

}  // namespace

extern "C" {

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  FAKE_ENTER("cuMemGetInfo_v2", true);
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(ordinal);
  const FakeDevice& d = DeviceOf(s, ordinal);
  uint64_t used = DeviceBytesInUse(s, d);
  *total_bytes = d.total;
  *free_bytes = used >= d.total ? 0 : d.total - used;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  FAKE_ENTER("cuMemGetAllocationGranularity", false);
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = s.granularity;
  return CUDA_SUCCESS;
}

// The fake asks for a current context in every call that works on device
// memory (allocation, mapping, export and import, copies): stricter than the
// documentation of some VMM calls, since a call made on a thread without the
// context the caller meant works in whatever context the thread has.
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  FAKE_ENTER("cuMemCreate", true);
  if (CUresult c = CaptureCheck(s, "cuMemCreate"); c != CUDA_SUCCESS) return c;
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FAKE_NEED_CONTEXT(current);
  (void)current;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidOrdinal(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if (size % s.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const unsigned types = prop->requestedHandleTypes;
  if (types & ~static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    return CUDA_ERROR_NOT_SUPPORTED;  // fabric, win32: not in this fake
  }
  if ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && s.no_posix_fd) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // Only a device with CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED.
  const bool rdma = prop->allocFlags.gpuDirectRDMACapable != 0;
  if (rdma && !s.rdma) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Memfd> mem =
      NewPhysical(s, prop->location.id, size, rdma ? "vmm-rdma" : "vmm", &err);
  if (mem == nullptr) return err;
  Physical p;
  p.mem = std::move(mem);
  p.exportable_fd = (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  p.rdma = rdma;
  *handle = s.next_handle++;
  s.handles[*handle] = p;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemRelease", false);
  if (CUresult c = CaptureCheck(s, "cuMemRelease"); c != CUDA_SUCCESS) return c;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  // The memory lives while mapped; the handle is gone now.
  it->second.released = true;
  if (it->second.mappings == 0) s.handles.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type,
                                      unsigned long long flags) {
  FAKE_ENTER("cuMemExportToShareableHandle", true);
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (!it->second.exportable_fd) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(it->second.mem->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemGetAllocationPropertiesFromHandle", true);
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = it->second.mem->ordinal;
  prop->requestedHandleTypes =
      it->second.exportable_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  prop->allocFlags.gpuDirectRDMACapable = it->second.rdma ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                        void* os_handle,
                                        CUmemAllocationHandleType type) {
  FAKE_ENTER("cuMemImportFromShareableHandle", true);
  if (CUresult c = CaptureCheck(s, "cuMemImportFromShareableHandle"); c != CUDA_SUCCESS) return c;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (s.no_posix_fd) return CUDA_ERROR_NOT_SUPPORTED;
  int shared = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  int ordinal = -1;
  uint64_t bytes = 0;
  bool rdma = false;
  if (shared < 0 || !DescribeMemfd(s, shared, &ordinal, &bytes, &rdma)) {
    return CUDA_ERROR_INVALID_VALUE;  // not an fd this driver exported
  }
  if (ordinal < 0) return CUDA_ERROR_NOT_SUPPORTED;  // its device is not visible here
  int fd = fcntl(shared, F_DUPFD_CLOEXEC, 0);  // the caller keeps its fd
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Physical p;
  p.mem = std::make_shared<Memfd>();
  p.mem->fd = fd;
  p.mem->size = bytes;
  p.mem->ordinal = ordinal;
  p.exportable_fd = true;
  p.rdma = rdma;
  *handle = s.next_handle++;
  s.handles[*handle] = p;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  FAKE_ENTER("cuMemAddressReserve", false);
  if (ptr == nullptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  if (size % s.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  (void)addr;  // a hint only
  const uint64_t at = s.va.Allocate(size, std::max<uint64_t>(alignment, s.granularity));
  if (at == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  s.reservations[at] = size;
  *ptr = at;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemAddressFree", false);
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // Mappings inside must be unmapped first.
  if (Overlaps(s.mappings, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  s.reservations.erase(it);
  s.va.Free(ptr, size);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  FAKE_ENTER("cuMemMap", true);
  if (CUresult c = CaptureCheck(s, "cuMemMap"); c != CUDA_SUCCESS) return c;
  if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto h = s.handles.find(handle);
  if (h == s.handles.end() || h->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (ptr % s.granularity != 0 || size % s.granularity != 0 || offset % s.granularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (offset > h->second.mem->size || size > h->second.mem->size - offset) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Inside one reservation.
  auto r = s.reservations.upper_bound(ptr);
  if (r == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr - r->first >= r->second || size > r->second - (ptr - r->first)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (Overlaps(s.mappings, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  ++h->second.mappings;
  Mapping m;
  m.size = size;
  m.mem = h->second.mem;
  m.offset = offset;
  m.handle = handle;
  m.ordinal = h->second.mem->ordinal;
  s.mappings[ptr] = m;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemUnmap", false);
  if (CUresult c = CaptureCheck(s, "cuMemUnmap"); c != CUDA_SUCCESS) return c;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto m = s.mappings.find(ptr);
  if (m == s.mappings.end() || m->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  CheckNoPendingWork(s, ptr, size, "cuMemUnmap");
  auto h = s.handles.find(m->second.handle);
  if (h != s.handles.end() && --h->second.mappings == 0 && h->second.released) {
    s.handles.erase(h);
  }
  s.mappings.erase(m);
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                        size_t count) {
  FAKE_ENTER("cuMemSetAccess", true);
  if (CUresult c = CaptureCheck(s, "cuMemSetAccess"); c != CUDA_SUCCESS) return c;
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  // The range must be fully mapped, by whole mappings.
  std::vector<Mapping*> covered;
  uint64_t cur = ptr;
  while (cur < ptr + size) {
    auto m = s.mappings.find(cur);
    if (m == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    covered.push_back(&m->second);
    cur += m->second.size;
  }
  if (cur != ptr + size) return CUDA_ERROR_INVALID_VALUE;
  // Each location's flags are its own; locations not named keep theirs.
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    int dev = desc[i].location.id;
    if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    for (Mapping* m : covered) {
      if (!CanAccess(s, dev, m->ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    for (Mapping* m : covered) {
      if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        m->access.erase(desc[i].location.id);
      } else {
        m->access[desc[i].location.id] = desc[i].flags;
      }
    }
  }
  return CUDA_SUCCESS;
}

// A dma-buf of [dptr, dptr + size): page-aligned, in one mapping or one
// cuMemAlloc allocation of a device with dma-buf support. This fake's
// dma-buf is a copy of the bytes when exported (a memfd), where the
// driver's aliases the memory: enough to check what range a caller
// exported.
CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size,
                                       CUmemRangeHandleType type, unsigned long long flags) {
  FAKE_ENTER("cuMemGetHandleForAddressRange", true);
  FAKE_NEED_CONTEXT(current);
  (void)current;
  if (handle == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) return CUDA_ERROR_INVALID_VALUE;
  if (flags == CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) return CUDA_ERROR_NOT_SUPPORTED;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (dptr % page != 0 || size % page != 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Piece> pieces;
  if (!Resolve(s, dptr, size, &pieces) || pieces.size() != 1) return CUDA_ERROR_INVALID_VALUE;
  const int ordinal =
      pieces[0].mapping != nullptr ? pieces[0].mapping->ordinal : pieces[0].linear->ordinal;
  if (s.no_dma_buf || ordinal < 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (pieces[0].mapping == nullptr && pieces[0].linear->ipc_opened) {
    return CUDA_ERROR_NOT_SUPPORTED;  // another process's memory (legacy IPC)
  }
  int fd = memfd_create("fakecuda-dmabuf", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::vector<char> bytes(size);
  const Piece& p = pieces[0];
  const int src = p.mapping != nullptr ? p.mapping->mem->fd : p.linear->mem->fd;
  const uint64_t at = p.mapping != nullptr ? p.mapping->offset + (dptr - p.mapping_start)
                                           : dptr - p.linear_start;
  if (src < 0 || !FdIo(src, at, size, false, nullptr, bytes.data(), -1) ||
      pwrite(fd, bytes.data(), size, 0) != static_cast<ssize_t>(size)) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  *static_cast<int*>(handle) = fd;
  return CUDA_SUCCESS;
}

// The flags cuMemSetAccess gave `location` on the mapping holding `ptr`.
CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                        CUdeviceptr ptr) {
  FAKE_ENTER("cuMemGetAccess", false);
  if (flags == nullptr || location == nullptr ||
      location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidOrdinal(s, location->id)) return CUDA_ERROR_INVALID_DEVICE;
  auto m = s.mappings.upper_bound(ptr);
  if (m == s.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --m;
  if (ptr >= m->first + m->second.size) return CUDA_ERROR_INVALID_VALUE;
  auto a = m->second.access.find(location->id);
  *flags = a == m->second.access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : a->second;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  FAKE_ENTER("cuMemAlloc_v2", true);
  if (CUresult c = CaptureCheck(s, "cuMemAlloc_v2"); c != CUDA_SUCCESS) return c;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(ordinal);
  CUresult err = CUDA_SUCCESS;
  // Physical pages are whole granules, as with the real allocator.
  uint64_t rounded = (bytes + s.granularity - 1) / s.granularity * s.granularity;
  std::shared_ptr<Memfd> mem = NewPhysical(s, ordinal, rounded, "alloc", &err);
  if (mem == nullptr) return err;
  const uint64_t at = s.va.Allocate(rounded, s.granularity);
  if (at == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Linear a;
  a.mem = std::move(mem);
  a.size = rounded;
  a.ordinal = ordinal;
  s.linear[at] = a;
  *dptr = at;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKE_ENTER("cuMemFree_v2", false);
  if (CUresult c = CaptureCheck(s, "cuMemFree_v2"); c != CUDA_SUCCESS) return c;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.linear.find(dptr);
  if (it == s.linear.end() || it->second.ipc_opened) return CUDA_ERROR_INVALID_VALUE;
  CheckNoPendingWork(s, dptr, it->second.size, "cuMemFree");
  s.va.Free(dptr, it->second.size);
  s.linear.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcGetMemHandle", true);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.linear.find(dptr);  // the base of a cuMemAlloc, nothing else
  if (it == s.linear.end() || it->second.ipc_opened) return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  if (fstat(it->second.mem->fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  IpcHandleBytes b = {};
  std::memcpy(b.magic, "FAKEIPC2", 8);
  b.pid = getpid();
  b.fd = it->second.mem->fd;
  b.inode = st.st_ino;
  b.size = it->second.size;
  std::memcpy(b.uuid, DeviceOf(s, it->second.ordinal).uuid, 16);
  static_assert(sizeof(handle->reserved) == sizeof(b), "handle size");
  std::memcpy(handle->reserved, &b, sizeof(b));
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  FAKE_ENTER("cuIpcOpenMemHandle_v2", true);
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FAKE_NEED_CONTEXT(current);
  IpcHandleBytes b;
  std::memcpy(&b, handle.reserved, sizeof(b));
  if (std::memcmp(b.magic, "FAKEIPC2", 8) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (b.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // own memory
  std::string key(handle.reserved, sizeof(handle.reserved));
  // Opened before in this context: the same pointer, one more reference.
  for (auto& [ptr, a] : s.linear) {
    if (a.ipc_opened && a.ipc_key == key) {
      ++a.refs;
      *dptr = ptr;
      return CUDA_SUCCESS;
    }
  }
  Linear a;
  a.ipc_opened = true;
  a.ipc_pid = b.pid;
  a.ipc_fd = b.fd;
  a.ipc_inode = b.inode;
  a.size = b.size;
  a.ipc_key = key;
  a.refs = 1;
  int fd = OpenIpcSource(a);  // the exporter still holds it, and is visible here
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  close(fd);
  a.ordinal = -1;
  for (size_t i = 0; i < s.visible.size(); ++i) {
    if (std::memcmp(DeviceOf(s, static_cast<int>(i)).uuid, b.uuid, 16) == 0) {
      a.ordinal = static_cast<int>(i);
    }
  }
  if (a.ordinal < 0 || !CanAccess(s, current, a.ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  const uint64_t at = s.va.Allocate(b.size, s.granularity);
  if (at == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  s.linear[at] = a;
  *dptr = at;
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcCloseMemHandle", false);
  FAKE_NEED_CONTEXT(current);
  (void)current;
  auto it = s.linear.find(dptr);
  if (it == s.linear.end() || !it->second.ipc_opened) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  CheckNoPendingWork(s, dptr, it->second.size, "cuIpcCloseMemHandle");
  s.va.Free(dptr, it->second.size);
  s.linear.erase(it);
  return CUDA_SUCCESS;
}

}  // extern "C"
