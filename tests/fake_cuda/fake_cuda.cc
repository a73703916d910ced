// A fake CUDA driver (libcuda.so.1) for tests on machines without a GPU.
//
// It implements the subset of the driver API that gpumemd and its client
// library call, over host memory, so that the daemon's cuda backend, the
// client's CUDA mappers and two real processes sharing a slab all run through
// the same code paths as on a GPU:
//  - Physical memory (cuMemCreate, cuMemAlloc) is a memfd named
//    "fakecuda:<uuid>:<bytes>". A device pointer is a host address: device
//    memory is readable by the host in this fake, but callers should go
//    through cuMemcpyHtoD/DtoH/cuMemsetD8, which check that every byte they
//    touch is mapped and accessible.
//  - cuMemExportToShareableHandle(POSIX fd) hands out a dup of the memfd;
//    cuMemImportFromShareableHandle recognises the device from the memfd's
//    name, so an import in another process finds the device by UUID in that
//    process's own numbering (CUDA_VISIBLE_DEVICES is honoured).
//  - cuIpcGetMemHandle writes the owner's pid, the memfd's fd number and
//    inode into the 64 handle bytes; cuIpcOpenMemHandle opens
//    /proc/<pid>/fd/<n> and checks the inode, so like the real thing a handle
//    only opens while its exporter keeps the memory, and only where the
//    exporter's pid is visible.
//  - cuMemGetInfo counts every fake allocation of the device held by any
//    process of this user (fds and mappings found under /proc), so memory
//    held outside a daemon is visible and a killed process gives its memory
//    back, as with the real driver.
//
// Misuse fails with the CUresult the driver documents: calls before cuInit
// (CUDA_ERROR_NOT_INITIALIZED), sizes, addresses or offsets that are not
// multiples of the granularity, a mapping outside a reservation or over an
// existing mapping, a released handle, copies through memory that is not
// mapped or not accessible (CUDA_ERROR_INVALID_VALUE), a device index out of
// range (CUDA_ERROR_INVALID_DEVICE), access set for a device that cannot
// reach the memory (CUDA_ERROR_INVALID_DEVICE).
//
// Environment (read at cuInit):
//   FAKE_CUDA_DEVICES      "2x1GiB" (default), "1GiB,512MiB"
//   FAKE_CUDA_UUIDS        comma list of 32 hex digits, one per device
//   FAKE_CUDA_PEERS        groups of devices with peer access, "0-1,2-3"
//   FAKE_CUDA_GRANULARITY  allocation granularity in bytes (default 2 MiB)
//   FAKE_CUDA_NO_POSIX_FD  "1": POSIX fd handles are not supported
//   FAKE_CUDA_DIRTY        "1": new memory reads 0xA5, not zeros (the real
//                          driver does not zero what it hands out)
//   FAKE_CUDA_FAIL         injected failures, comma separated:
//                          "cuMemCreate@3=CUDA_ERROR_OUT_OF_MEMORY" (3rd call),
//                          "cuMemsetD8_v2@2+=46" (2nd call on), "cuMemMap=1"
//   FAKE_CUDA_LOST_FILE    while this file exists, every call that touches a
//                          device fails with CUDA_ERROR_DEVICE_UNAVAILABLE
//   CUDA_VISIBLE_DEVICES   indices or GPU-<uuid> (prefixes), as the driver
#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

struct CUctx_st {
  int ordinal;
};

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct FakeDevice {
  std::string uuid_hex;  // 32 hex digits
  unsigned char uuid[16];
  std::string name;
  uint64_t total = 0;
  int global_index = 0;
};

struct Failure {
  std::string fn;
  long nth = 0;        // 0: every call
  bool onward = false; // nth and every later call
  CUresult code = CUDA_SUCCESS;
  long calls = 0;
};

// Physical memory known to this process: made by cuMemCreate or imported.
struct Physical {
  int fd = -1;
  uint64_t size = 0;
  int ordinal = 0;  // this process's device ordinal
  bool exportable_fd = false;
  bool released = false;
  int mappings = 0;
};

struct Reservation {
  uint64_t size = 0;
};

struct Mapping {
  uint64_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  int ordinal = 0;
  bool accessible = false;
};

// cuMemAlloc and cuIpcOpenMemHandle regions.
struct LinearAlloc {
  int fd = -1;  // cuMemAlloc: kept open so the IPC handle can be opened
  uint64_t size = 0;
  int ordinal = 0;
  bool ipc_opened = false;
  std::string ipc_key;
  int refs = 0;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  std::vector<FakeDevice> all;       // every fake device
  std::vector<int> visible;          // ordinal -> index into all
  std::set<std::pair<int, int>> peers;  // global index pairs
  uint64_t granularity = 2 * kMiB;
  bool no_posix_fd = false;
  bool dirty = false;
  std::string lost_file;
  std::vector<Failure> failures;
  std::vector<CUctx_st> contexts;
  uint64_t next_handle = 1;
  std::map<CUmemGenericAllocationHandle, Physical> handles;
  std::map<uint64_t, Reservation> reservations;
  std::map<uint64_t, Mapping> mappings;
  std::map<uint64_t, LinearAlloc> linear;
};

State& S() {
  static State* s = new State;
  return *s;
}

thread_local int current_ordinal = -1;

uint64_t ParseBytes(const std::string& s, bool* ok) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  uint64_t mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = uint64_t{1} << 10;
  else if (unit == "MiB" || unit == "M") mult = uint64_t{1} << 20;
  else if (unit == "GiB" || unit == "G") mult = uint64_t{1} << 30;
  else if (unit == "TiB" || unit == "T") mult = uint64_t{1} << 40;
  else *ok = false;
  if (end == s.c_str() || v <= 0) *ok = false;
  return static_cast<uint64_t>(v * static_cast<double>(mult));
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

void ConfigError(const std::string& what) {
  std::fprintf(stderr, "fake libcuda: %s\n", what.c_str());
}

CUresult CodeByName(const std::string& s, bool* ok);

std::string UuidHex(const unsigned char* u) {
  char buf[33];
  for (int i = 0; i < 16; ++i) std::snprintf(buf + 2 * i, 3, "%02x", u[i]);
  return std::string(buf, 32);
}

// "GPU-xxxxxxxx-xxxx-..." -> 32 hex digits.
std::string UuidDigits(const std::string& s) {
  std::string out;
  for (char c : s.substr(s.rfind("GPU-", 0) == 0 ? 4 : 0)) {
    if (c != '-') out.push_back(static_cast<char>(std::tolower(c)));
  }
  return out;
}

// Returns false on a configuration error (cuInit then fails).
bool Configure(State& s) {
  std::string devices = Env("FAKE_CUDA_DEVICES");
  if (devices.empty()) devices = "2x1GiB";
  std::vector<uint64_t> sizes;
  for (const std::string& item : Split(devices, ',')) {
    size_t x = item.find('x');
    long count = 1;
    std::string size = item;
    if (x != std::string::npos) {
      count = std::strtol(item.substr(0, x).c_str(), nullptr, 10);
      size = item.substr(x + 1);
    }
    bool ok = count > 0;
    uint64_t bytes = ParseBytes(size, &ok);
    if (!ok) {
      ConfigError("bad FAKE_CUDA_DEVICES entry '" + item + "'");
      return false;
    }
    for (long i = 0; i < count; ++i) sizes.push_back(bytes);
  }
  std::vector<std::string> uuids = Split(Env("FAKE_CUDA_UUIDS"), ',');
  for (size_t i = 0; i < sizes.size(); ++i) {
    FakeDevice d;
    d.global_index = static_cast<int>(i);
    d.total = sizes[i];
    d.name = "Fake CUDA Device " + std::to_string(i);
    if (i < uuids.size()) {
      std::string hex = UuidDigits(uuids[i]);
      if (hex.size() != 32) {
        ConfigError("bad FAKE_CUDA_UUIDS entry '" + uuids[i] + "'");
        return false;
      }
      for (int b = 0; b < 16; ++b) {
        d.uuid[b] = static_cast<unsigned char>(
            std::strtoul(hex.substr(2 * b, 2).c_str(), nullptr, 16));
      }
    } else {
      const unsigned char fixed[16] = {0xfa, 0xce, 0xc0, 0xda, 0, 0, 0x40, 0,
                                       0x80, 0,    0,    0,    0, 0, 0,    0};
      std::memcpy(d.uuid, fixed, 16);
      d.uuid[15] = static_cast<unsigned char>(i);
      d.uuid[14] = static_cast<unsigned char>(i >> 8);
    }
    d.uuid_hex = UuidHex(d.uuid);
    s.all.push_back(d);
  }
  for (const std::string& group : Split(Env("FAKE_CUDA_PEERS"), ',')) {
    std::vector<int> members;
    for (const std::string& m : Split(group, '-')) members.push_back(std::atoi(m.c_str()));
    for (int a : members) {
      for (int b : members) {
        if (a != b) s.peers.insert({a, b});
      }
    }
  }
  if (*Env("FAKE_CUDA_GRANULARITY") != '\0') {
    bool ok = true;
    s.granularity = ParseBytes(Env("FAKE_CUDA_GRANULARITY"), &ok);
    if (!ok || (s.granularity & (s.granularity - 1)) != 0) {
      ConfigError("FAKE_CUDA_GRANULARITY must be a power of two");
      return false;
    }
  }
  s.no_posix_fd = std::string(Env("FAKE_CUDA_NO_POSIX_FD")) == "1";
  s.dirty = std::string(Env("FAKE_CUDA_DIRTY")) == "1";
  s.lost_file = Env("FAKE_CUDA_LOST_FILE");
  for (const std::string& item : Split(Env("FAKE_CUDA_FAIL"), ',')) {
    Failure f;
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      ConfigError("bad FAKE_CUDA_FAIL entry '" + item + "' (want fn[@N[+]]=CODE)");
      return false;
    }
    std::string lhs = item.substr(0, eq);
    size_t at = lhs.find('@');
    f.fn = lhs.substr(0, at);
    if (at != std::string::npos) {
      std::string n = lhs.substr(at + 1);
      if (!n.empty() && n.back() == '+') {
        f.onward = true;
        n.pop_back();
      }
      f.nth = std::strtol(n.c_str(), nullptr, 10);
    }
    bool ok = true;
    f.code = CodeByName(item.substr(eq + 1), &ok);
    if (!ok) {
      ConfigError("bad error code in FAKE_CUDA_FAIL entry '" + item + "'");
      return false;
    }
    s.failures.push_back(f);
  }
  // CUDA_VISIBLE_DEVICES: indices or UUID prefixes; an invalid entry ends
  // the list, as with the real driver.
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  if (cvd == nullptr) {
    for (size_t i = 0; i < s.all.size(); ++i) s.visible.push_back(static_cast<int>(i));
  } else {
    for (const std::string& raw : Split(cvd, ',')) {
      int found = -1;
      if (raw.rfind("GPU-", 0) == 0) {
        std::string prefix = UuidDigits(raw);
        for (const FakeDevice& d : s.all) {
          if (!prefix.empty() && d.uuid_hex.rfind(prefix, 0) == 0) found = d.global_index;
        }
      } else if (!raw.empty() && std::isdigit(static_cast<unsigned char>(raw[0]))) {
        long i = std::strtol(raw.c_str(), nullptr, 10);
        if (i >= 0 && i < static_cast<long>(s.all.size())) found = static_cast<int>(i);
      }
      if (found < 0) break;
      s.visible.push_back(found);
    }
  }
  s.contexts.resize(s.visible.size());
  for (size_t i = 0; i < s.visible.size(); ++i) s.contexts[i].ordinal = static_cast<int>(i);
  return true;
}

struct NamedCode {
  const char* name;
  CUresult code;
  const char* text;
};

const NamedCode kCodes[] = {
    {"CUDA_SUCCESS", CUDA_SUCCESS, "no error"},
    {"CUDA_ERROR_INVALID_VALUE", CUDA_ERROR_INVALID_VALUE, "invalid argument"},
    {"CUDA_ERROR_OUT_OF_MEMORY", CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
    {"CUDA_ERROR_NOT_INITIALIZED", CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
    {"CUDA_ERROR_DEINITIALIZED", CUDA_ERROR_DEINITIALIZED, "driver shutting down"},
    {"CUDA_ERROR_DEVICE_UNAVAILABLE", CUDA_ERROR_DEVICE_UNAVAILABLE,
     "CUDA-capable device(s) is/are busy or unavailable"},
    {"CUDA_ERROR_NO_DEVICE", CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
    {"CUDA_ERROR_INVALID_DEVICE", CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
    {"CUDA_ERROR_INVALID_CONTEXT", CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
    {"CUDA_ERROR_ALREADY_MAPPED", CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"},
    {"CUDA_ERROR_NOT_MAPPED", CUDA_ERROR_NOT_MAPPED, "resource not mapped"},
    {"CUDA_ERROR_ECC_UNCORRECTABLE", CUDA_ERROR_ECC_UNCORRECTABLE,
     "uncorrectable ECC error encountered"},
    {"CUDA_ERROR_INVALID_HANDLE", CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
    {"CUDA_ERROR_ILLEGAL_ADDRESS", CUDA_ERROR_ILLEGAL_ADDRESS,
     "an illegal memory access was encountered"},
    {"CUDA_ERROR_LAUNCH_FAILED", CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"},
    {"CUDA_ERROR_NOT_PERMITTED", CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
    {"CUDA_ERROR_NOT_SUPPORTED", CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    {"CUDA_ERROR_UNKNOWN", CUDA_ERROR_UNKNOWN, "unknown error"},
};

CUresult CodeByName(const std::string& s, bool* ok) {
  for (const NamedCode& c : kCodes) {
    if (s == c.name) return c.code;
  }
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') *ok = false;
  return static_cast<CUresult>(v);
}

// Counts the call and returns an injected failure, if any. Caller holds mu.
CUresult Injected(State& s, const char* fn) {
  for (Failure& f : s.failures) {
    if (f.fn != fn) continue;
    long n = ++f.calls;
    if (f.nth == 0 || n == f.nth || (f.onward && n >= f.nth)) return f.code;
  }
  return CUDA_SUCCESS;
}

bool Lost(const State& s) {
  return !s.lost_file.empty() && access(s.lost_file.c_str(), F_OK) == 0;
}

// The common prologue: initialized, injected failure, device lost.
#define FAKE_ENTER(fn, touches_device)                          \
  State& s = S();                                               \
  std::lock_guard<std::mutex> lock(s.mu);                       \
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;        \
  if (CUresult inj = Injected(s, fn); inj != CUDA_SUCCESS) {    \
    return inj;                                                 \
  }                                                             \
  if ((touches_device) && Lost(s)) return CUDA_ERROR_DEVICE_UNAVAILABLE;

bool ValidOrdinal(const State& s, int ordinal) {
  return ordinal >= 0 && ordinal < static_cast<int>(s.visible.size());
}

const FakeDevice& DeviceOf(const State& s, int ordinal) { return s.all[s.visible[ordinal]]; }

bool CanAccess(const State& s, int from_ordinal, int memory_ordinal) {
  if (from_ordinal == memory_ordinal) return true;
  return s.peers.count({s.visible[from_ordinal], s.visible[memory_ordinal]}) > 0;
}

// Bytes of fake device memory held by any process of this user, found as fds
// and mappings of "fakecuda:<uuid>:" memfds under /proc, each memfd once.
uint64_t DeviceBytesInUse(const std::string& uuid_hex) {
  const std::string tag = "/memfd:fakecuda:" + uuid_hex + ":";
  std::set<std::pair<uint64_t, uint64_t>> seen;  // (dev, inode)
  uint64_t total = 0;
  auto count = [&](const std::string& path, uint64_t dev, uint64_t ino) {
    size_t at = path.find(tag);
    if (at == std::string::npos) return;
    if (!seen.insert({dev, ino}).second) return;
    total += std::strtoull(path.c_str() + at + tag.size(), nullptr, 10);
  };
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* p = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(p->d_name[0]))) continue;
    std::string base = std::string("/proc/") + p->d_name;
    if (DIR* fds = opendir((base + "/fd").c_str())) {
      while (dirent* f = readdir(fds)) {
        if (f->d_name[0] == '.') continue;
        std::string link = base + "/fd/" + f->d_name;
        char target[512];
        ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (std::strstr(target, "fakecuda:") == nullptr) continue;
        struct stat st;
        if (stat(link.c_str(), &st) != 0) continue;
        count(target, st.st_dev, st.st_ino);
      }
      closedir(fds);
    }
    if (FILE* maps = std::fopen((base + "/maps").c_str(), "r")) {
      char line[1024];
      while (std::fgets(line, sizeof(line), maps)) {
        if (std::strstr(line, "fakecuda:") == nullptr) continue;
        unsigned long long ino = 0;
        unsigned major = 0, minor = 0;
        if (std::sscanf(line, "%*s %*s %*s %x:%x %llu", &major, &minor, &ino) != 3) continue;
        // stat() of a memfd reports st_dev of the shmem mount; maps shows the
        // same device in major:minor form.
        count(line, makedev(major, minor), ino);
      }
      std::fclose(maps);
    }
  }
  closedir(proc);
  return total;
}

// A new memfd of `bytes` for device `ordinal`, or -1 with *err set.
int NewPhysical(const State& s, int ordinal, uint64_t bytes, CUresult* err) {
  const FakeDevice& d = DeviceOf(s, ordinal);
  if (bytes > d.total || DeviceBytesInUse(d.uuid_hex) + bytes > d.total) {
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return -1;
  }
  std::string name = "fakecuda:" + d.uuid_hex + ":" + std::to_string(bytes);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    *err = CUDA_ERROR_OUT_OF_MEMORY;
    return -1;
  }
  if (s.dirty) {
    std::vector<char> junk(kMiB, static_cast<char>(0xA5));
    for (uint64_t at = 0; at < bytes; at += junk.size()) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(junk.size(), bytes - at));
      if (pwrite(fd, junk.data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) break;
    }
  }
  return fd;
}

// The device and size a fake memfd was made for, from its name.
bool DescribeMemfd(const State& s, int fd, int* ordinal, uint64_t* bytes) {
  char link[64], target[512];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  const char* tag = std::strstr(target, "/memfd:fakecuda:");
  if (tag == nullptr) return false;
  std::string rest = tag + std::strlen("/memfd:fakecuda:");
  size_t colon = rest.find(':');
  if (colon != 32) return false;
  std::string hex = rest.substr(0, 32);
  *bytes = std::strtoull(rest.c_str() + 33, nullptr, 10);
  for (size_t i = 0; i < s.visible.size(); ++i) {
    if (DeviceOf(s, static_cast<int>(i)).uuid_hex == hex) {
      *ordinal = static_cast<int>(i);
      return true;
    }
  }
  *ordinal = -1;  // a device this process cannot see
  return true;
}

// Is [ptr, ptr + n) inside accessible device memory of this process?
bool Accessible(const State& s, uint64_t ptr, uint64_t n) {
  if (n == 0) return true;
  auto covered = [&](const auto& regions, auto ok) {
    auto it = regions.upper_bound(ptr);
    if (it == regions.begin()) return false;
    --it;
    return ok(it->second) && ptr >= it->first && ptr - it->first < it->second.size &&
           n <= it->second.size - (ptr - it->first);
  };
  // A copy may span adjacent mappings of one reservation; walk them.
  uint64_t cur = ptr, left = n;
  while (left > 0) {
    auto it = s.mappings.upper_bound(cur);
    if (it == s.mappings.begin()) break;
    --it;
    if (!it->second.accessible || cur - it->first >= it->second.size) break;
    uint64_t here = std::min<uint64_t>(left, it->second.size - (cur - it->first));
    cur += here;
    left -= here;
  }
  if (left == 0) return true;
  return covered(s.linear, [](const LinearAlloc&) { return true; });
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int flags) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.initialized) return CUDA_SUCCESS;
  if (CUresult inj = Injected(s, "cuInit"); inj != CUDA_SUCCESS) return inj;
  if (!Configure(s)) return CUDA_ERROR_INVALID_VALUE;
  if (s.visible.empty()) return CUDA_ERROR_NO_DEVICE;
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const NamedCode& c : kCodes) {
    if (c.code == error) {
      *str = c.text;
      return CUDA_SUCCESS;
    }
  }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const NamedCode& c : kCodes) {
    if (c.code == error) {
      *str = c.name;
      return CUDA_SUCCESS;
    }
  }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount", false);
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(s.visible.size());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet", false);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetName", false);
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", DeviceOf(s, dev).name.c_str());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid_v2", false);
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, DeviceOf(s, dev).uuid, 16);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKE_ENTER("cuDeviceTotalMem_v2", false);
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = DeviceOf(s, dev).total;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetPCIBusId", false);
  if (bus == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(bus, static_cast<size_t>(len), "0000:%02x:00.0",
                0x10 + DeviceOf(s, dev).global_index);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute", false);
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = s.no_posix_fd ? 0 : 1;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  FAKE_ENTER("cuDeviceCanAccessPeer", false);
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev) || !ValidOrdinal(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer && CanAccess(s, dev, peer) ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain", true);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = &s.contexts[dev];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease_v2", false);
  if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_ENTER("cuCtxSetCurrent", false);
  if (ctx == nullptr) {
    current_ordinal = -1;
    return CUDA_SUCCESS;
  }
  for (CUctx_st& c : s.contexts) {
    if (&c == ctx) {
      current_ordinal = c.ordinal;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  FAKE_ENTER("cuCtxGetDevice", false);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = current_ordinal;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() {
  FAKE_ENTER("cuCtxSynchronize", true);
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  FAKE_ENTER("cuMemGetInfo_v2", true);
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const FakeDevice& d = DeviceOf(s, current_ordinal);
  uint64_t used = DeviceBytesInUse(d.uuid_hex);
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

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  FAKE_ENTER("cuMemCreate", true);
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
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
  CUresult err = CUDA_SUCCESS;
  int fd = NewPhysical(s, prop->location.id, size, &err);
  if (fd < 0) return err;
  Physical p;
  p.fd = fd;
  p.size = size;
  p.ordinal = prop->location.id;
  p.exportable_fd = (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  *handle = s.next_handle++;
  s.handles[*handle] = p;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemRelease", false);
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  // The memory lives while mapped; the handle is gone now.
  close(it->second.fd);
  it->second.fd = -1;
  it->second.released = true;
  if (it->second.mappings == 0) s.handles.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type,
                                      unsigned long long flags) {
  FAKE_ENTER("cuMemExportToShareableHandle", true);
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (!it->second.exportable_fd) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                        void* os_handle,
                                        CUmemAllocationHandleType type) {
  FAKE_ENTER("cuMemImportFromShareableHandle", true);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (s.no_posix_fd) return CUDA_ERROR_NOT_SUPPORTED;
  int shared = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  int ordinal = -1;
  uint64_t bytes = 0;
  if (shared < 0 || !DescribeMemfd(s, shared, &ordinal, &bytes)) {
    return CUDA_ERROR_INVALID_VALUE;  // not an fd this driver exported
  }
  if (ordinal < 0) return CUDA_ERROR_NOT_SUPPORTED;  // its device is not visible here
  int fd = fcntl(shared, F_DUPFD_CLOEXEC, 0);  // the caller keeps its fd
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Physical p;
  p.fd = fd;
  p.size = bytes;
  p.ordinal = ordinal;
  p.exportable_fd = true;
  *handle = s.next_handle++;
  s.handles[*handle] = p;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  FAKE_ENTER("cuMemAddressReserve", false);
  if (ptr == nullptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size % s.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  (void)addr;  // a hint only
  const uint64_t align = std::max<uint64_t>(alignment, s.granularity);
  // Over-reserve, then trim to the alignment.
  void* raw = mmap(nullptr, size + align, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t start = reinterpret_cast<uint64_t>(raw);
  uint64_t aligned = (start + align - 1) / align * align;
  if (aligned > start) munmap(raw, aligned - start);
  uint64_t tail = start + size + align - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  s.reservations[aligned] = Reservation{size};
  *ptr = aligned;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemAddressFree", false);
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Mappings inside must be unmapped first.
  auto m = s.mappings.lower_bound(ptr);
  if (m != s.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  FAKE_ENTER("cuMemMap", true);
  if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto h = s.handles.find(handle);
  if (h == s.handles.end() || h->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (ptr % s.granularity != 0 || size % s.granularity != 0 || offset % s.granularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (offset > h->second.size || size > h->second.size - offset) return CUDA_ERROR_INVALID_VALUE;
  // Inside one reservation.
  auto r = s.reservations.upper_bound(ptr);
  if (r == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr - r->first >= r->second.size || size > r->second.size - (ptr - r->first)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Not over an existing mapping.
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != s.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  void* at = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                  h->second.fd, static_cast<off_t>(offset));
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++h->second.mappings;
  s.mappings[ptr] = Mapping{size, handle, h->second.ordinal, false};
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemUnmap", false);
  auto m = s.mappings.find(ptr);
  if (m == s.mappings.end() || m->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Back to a bare reservation.
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
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
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
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
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    int dev = desc[i].location.id;
    if (!ValidOrdinal(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    for (Mapping* m : covered) {
      if (!CanAccess(s, dev, m->ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot = PROT_READ | PROT_WRITE;
    else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE) prot = PROT_READ;
    else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) return CUDA_ERROR_INVALID_VALUE;
  }
  if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  for (Mapping* m : covered) m->accessible = prot != PROT_NONE;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  FAKE_ENTER("cuMemAlloc_v2", true);
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult err = CUDA_SUCCESS;
  // Physical pages are whole granules, as with the real allocator.
  uint64_t rounded = (bytes + s.granularity - 1) / s.granularity * s.granularity;
  int fd = NewPhysical(s, current_ordinal, rounded, &err);
  if (fd < 0) return err;
  void* at = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  LinearAlloc a;
  a.fd = fd;
  a.size = rounded;
  a.ordinal = current_ordinal;
  *dptr = reinterpret_cast<CUdeviceptr>(at);
  s.linear[*dptr] = a;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKE_ENTER("cuMemFree_v2", false);
  auto it = s.linear.find(dptr);
  if (it == s.linear.end() || it->second.ipc_opened) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(dptr), it->second.size);
  close(it->second.fd);
  s.linear.erase(it);
  return CUDA_SUCCESS;
}

// Handle bytes: "FAKEIPC1", pid, fd, inode, size, device UUID.
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

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcGetMemHandle", true);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.linear.find(dptr);  // the base of a cuMemAlloc, nothing else
  if (it == s.linear.end() || it->second.ipc_opened) return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  if (fstat(it->second.fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  IpcHandleBytes b = {};
  std::memcpy(b.magic, "FAKEIPC1", 8);
  b.pid = getpid();
  b.fd = it->second.fd;
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
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  IpcHandleBytes b;
  std::memcpy(&b, handle.reserved, sizeof(b));
  if (std::memcmp(b.magic, "FAKEIPC1", 8) != 0) return CUDA_ERROR_INVALID_VALUE;
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
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", b.pid, b.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // exporter gone or memory freed
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_ino != b.inode) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;  // that fd is something else now
  }
  int ordinal = -1;
  for (size_t i = 0; i < s.visible.size(); ++i) {
    if (std::memcmp(DeviceOf(s, static_cast<int>(i)).uuid, b.uuid, 16) == 0) {
      ordinal = static_cast<int>(i);
    }
  }
  if (ordinal < 0 || !CanAccess(s, current_ordinal, ordinal)) {
    close(fd);
    return CUDA_ERROR_INVALID_DEVICE;
  }
  void* at = mmap(nullptr, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  LinearAlloc a;
  a.size = b.size;
  a.ordinal = ordinal;
  a.ipc_opened = true;
  a.ipc_key = key;
  a.refs = 1;
  *dptr = reinterpret_cast<CUdeviceptr>(at);
  s.linear[*dptr] = a;
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcCloseMemHandle", false);
  auto it = s.linear.find(dptr);
  if (it == s.linear.end() || !it->second.ipc_opened) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  munmap(reinterpret_cast<void*>(dptr), it->second.size);
  s.linear.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  FAKE_ENTER("cuMemcpyHtoD_v2", true);
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (src == nullptr || !Accessible(s, dst, n)) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  FAKE_ENTER("cuMemcpyDtoH_v2", true);
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (dst == nullptr || !Accessible(s, src, n)) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  FAKE_ENTER("cuMemsetD8_v2", true);
  if (current_ordinal < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (!Accessible(s, dst, n)) return CUDA_ERROR_INVALID_VALUE;
  std::memset(reinterpret_cast<void*>(dst), value, n);
  return CUDA_SUCCESS;
}

}  // extern "C"
