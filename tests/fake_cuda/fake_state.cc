// The fake's configuration (read from the environment at cuInit), its error
// codes, injected failures, violations, per-thread context stacks and its
// device address space. See fake_cuda.cc for the environment it reads.
#include "tests/fake_cuda/fake_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace fakecuda {

std::atomic<bool> g_forked{false};

State& S() {
  static State* s = new State;  // never destroyed: workers may outlive main
  return *s;
}

Memfd::~Memfd() {
  if (fd >= 0) close(fd);
}

namespace {

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
  if (end == s.c_str() || v < 0) *ok = false;
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

// "GPU-xxxxxxxx-xxxx-...", "MIG-..." -> 32 hex digits.
std::string UuidDigits(const std::string& s) {
  std::string rest = s;
  if (rest.rfind("GPU-", 0) == 0 || rest.rfind("MIG-", 0) == 0) rest = rest.substr(4);
  std::string out;
  for (char c : rest) {
    if (c != '-') out.push_back(static_cast<char>(std::tolower(c)));
  }
  return out;
}

bool ParseUuid(const std::string& text, unsigned char out[16]) {
  std::string hex = UuidDigits(text);
  if (hex.size() != 32) return false;
  for (char c : hex) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  for (int b = 0; b < 16; ++b) {
    out[b] = static_cast<unsigned char>(std::strtoul(hex.substr(2 * b, 2).c_str(), nullptr, 16));
  }
  return true;
}

// Global device indices from "1,2" (every one valid), or false.
bool ParseIndices(const std::string& text, size_t count, std::vector<int>* out) {
  for (const std::string& item : Split(text, ',')) {
    char* end = nullptr;
    long i = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || i < 0 || i >= static_cast<long>(count)) {
      return false;
    }
    out->push_back(static_cast<int>(i));
  }
  return true;
}

}  // namespace

std::string UuidHex(const unsigned char* u) {
  char buf[33];
  for (int i = 0; i < 16; ++i) std::snprintf(buf + 2 * i, 3, "%02x", u[i]);
  return std::string(buf, 32);
}

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
    if (!ok || bytes == 0) {
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
    if (i < uuids.size() && !uuids[i].empty()) {
      if (!ParseUuid(uuids[i], d.uuid)) {
        ConfigError("bad FAKE_CUDA_UUIDS entry '" + uuids[i] + "'");
        return false;
      }
      d.mig = uuids[i].rfind("MIG-", 0) == 0;
    } else {
      const unsigned char fixed[16] = {0xfa, 0xce, 0xc0, 0xda, 0, 0, 0x40, 0,
                                       0x80, 0,    0,    0,    0, 0, 0,    0};
      std::memcpy(d.uuid, fixed, 16);
      d.uuid[15] = static_cast<unsigned char>(i);
      d.uuid[14] = static_cast<unsigned char>(i >> 8);
    }
    std::memcpy(d.parent, d.uuid, 16);
    if (d.mig) {
      // The GPU the instance lives on: another UUID (what the first
      // cuDeviceGetUuid reports for a MIG device).
      d.parent[0] ^= 0x5a;
      d.name = "Fake CUDA Device " + std::to_string(i) + " MIG 1g.10gb";
    }
    d.uuid_hex = UuidHex(d.uuid);
    s.all.push_back(d);
  }
  for (std::string group : Split(Env("FAKE_CUDA_PEERS"), ',')) {
    // "pcie:0-1": peer access over PCIe (no native atomics over the link).
    const bool pcie = group.rfind("pcie:", 0) == 0;
    if (pcie) group = group.substr(5);
    std::vector<int> members;
    for (const std::string& m : Split(group, '-')) members.push_back(std::atoi(m.c_str()));
    for (int a : members) {
      for (int b : members) {
        if (a == b) continue;
        s.peers.insert({a, b});
        if (pcie) s.pcie_peers.insert({a, b});
      }
    }
  }
  if (*Env("FAKE_CUDA_GRANULARITY") != '\0') {
    bool ok = true;
    s.granularity = ParseBytes(Env("FAKE_CUDA_GRANULARITY"), &ok);
    if (!ok || s.granularity == 0 || (s.granularity & (s.granularity - 1)) != 0) {
      ConfigError("FAKE_CUDA_GRANULARITY must be a power of two");
      return false;
    }
  }
  {
    bool ok = true;
    s.context_bytes = ParseBytes(*Env("FAKE_CUDA_CONTEXT_BYTES") != '\0'
                                     ? Env("FAKE_CUDA_CONTEXT_BYTES") : "4MiB", &ok);
    if (!ok) {
      ConfigError("bad FAKE_CUDA_CONTEXT_BYTES");
      return false;
    }
  }
  // "0=100MiB,1=1GiB": memory other users' processes hold.
  for (const std::string& item : Split(Env("FAKE_CUDA_OTHER_USED"), ',')) {
    size_t eq = item.find('=');
    bool ok = eq != std::string::npos;
    int index = ok ? std::atoi(item.substr(0, eq).c_str()) : -1;
    uint64_t bytes = ok ? ParseBytes(item.substr(eq + 1), &ok) : 0;
    if (!ok || index < 0 || index >= static_cast<int>(s.all.size())) {
      ConfigError("bad FAKE_CUDA_OTHER_USED entry '" + item + "'");
      return false;
    }
    s.all[index].other_used = bytes;
  }
  // "0=exclusive_process,1=prohibited".
  for (const std::string& item : Split(Env("FAKE_CUDA_COMPUTE_MODE"), ',')) {
    size_t eq = item.find('=');
    int index = eq != std::string::npos ? std::atoi(item.substr(0, eq).c_str()) : -1;
    std::string mode = eq != std::string::npos ? item.substr(eq + 1) : "";
    int value = -1;
    if (mode == "default") value = CU_COMPUTEMODE_DEFAULT;
    if (mode == "exclusive_process") value = CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
    if (mode == "prohibited") value = CU_COMPUTEMODE_PROHIBITED;
    if (value < 0 || index < 0 || index >= static_cast<int>(s.all.size())) {
      ConfigError("bad FAKE_CUDA_COMPUTE_MODE entry '" + item + "'");
      return false;
    }
    s.all[index].compute_mode = value;
  }
  s.delay_ms = std::atoi(Env("FAKE_CUDA_DELAY_MS"));
  s.no_posix_fd = std::string(Env("FAKE_CUDA_NO_POSIX_FD")) == "1";
  s.rdma = std::string(Env("FAKE_CUDA_RDMA")) == "1";
  s.no_dma_buf = std::string(Env("FAKE_CUDA_NO_DMA_BUF")) == "1";
  s.no_uuid_v1 = std::string(Env("FAKE_CUDA_NO_UUID_V1")) == "1";
  s.dirty = std::string(Env("FAKE_CUDA_DIRTY")) == "1";
  s.lost_file = Env("FAKE_CUDA_LOST_FILE");
  s.violations_file = Env("FAKE_CUDA_VIOLATIONS");
  s.state_dir = Env("FAKE_CUDA_STATE_DIR");
  if (s.state_dir.empty()) s.state_dir = Env("TEST_TMPDIR");
  if (s.state_dir.empty()) s.state_dir = "/tmp";
  // One fake machine per test: processes that share TEST_TMPDIR (or
  // FAKE_CUDA_MACHINE) see each other's memory, other tests' they do not.
  s.machine = Env("FAKE_CUDA_MACHINE");
  if (s.machine.empty()) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%08zx",
                  std::hash<std::string>()(s.state_dir) & 0xffffffffu);
    s.machine = buf;
  }
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
  // What this process may see: the container's devices (FAKE_CUDA_SUBSET,
  // like NVIDIA_VISIBLE_DEVICES), in the order CUDA_DEVICE_ORDER says
  // (FASTEST_FIRST, the default, is FAKE_CUDA_FASTEST's order; PCI_BUS_ID is
  // the order of the devices' bus ids), then CUDA_VISIBLE_DEVICES applied to
  // that list: indices into it or GPU-/MIG- UUIDs (GPU- prefixes allowed);
  // an invalid entry ends the list, as with the real driver.
  std::vector<int> present;
  if (*Env("FAKE_CUDA_SUBSET") != '\0') {
    if (!ParseIndices(Env("FAKE_CUDA_SUBSET"), s.all.size(), &present)) {
      ConfigError("bad FAKE_CUDA_SUBSET");
      return false;
    }
  } else {
    for (size_t i = 0; i < s.all.size(); ++i) present.push_back(static_cast<int>(i));
  }
  std::vector<int> fastest;
  if (*Env("FAKE_CUDA_FASTEST") != '\0') {
    if (!ParseIndices(Env("FAKE_CUDA_FASTEST"), s.all.size(), &fastest)) {
      ConfigError("bad FAKE_CUDA_FASTEST");
      return false;
    }
  }
  std::vector<int> ordered = present;
  if (std::string(Env("CUDA_DEVICE_ORDER")) == "PCI_BUS_ID") {
    std::sort(ordered.begin(), ordered.end());
  } else if (!fastest.empty()) {
    auto rank = [&](int g) {
      auto it = std::find(fastest.begin(), fastest.end(), g);
      return it == fastest.end() ? static_cast<long>(fastest.size()) + g
                                 : static_cast<long>(it - fastest.begin());
    };
    std::stable_sort(ordered.begin(), ordered.end(),
                     [&](int a, int b) { return rank(a) < rank(b); });
  }
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  if (cvd == nullptr) {
    s.visible = ordered;
  } else {
    for (const std::string& raw : Split(cvd, ',')) {
      int found = -1;
      if (raw.rfind("GPU-", 0) == 0 || raw.rfind("MIG-", 0) == 0) {
        const bool mig = raw[0] == 'M';
        std::string prefix = UuidDigits(raw);
        int matches = 0;
        for (int g : ordered) {
          const FakeDevice& d = s.all[g];
          if (d.mig != mig || prefix.empty()) continue;
          if (mig ? d.uuid_hex == prefix : d.uuid_hex.rfind(prefix, 0) == 0) {
            found = g;
            ++matches;
          }
        }
        if (matches > 1) found = -1;  // ambiguous prefix
      } else if (!raw.empty() && std::isdigit(static_cast<unsigned char>(raw[0]))) {
        long i = std::strtol(raw.c_str(), nullptr, 10);
        if (i >= 0 && i < static_cast<long>(ordered.size())) found = ordered[i];
      }
      if (found < 0 || std::count(s.visible.begin(), s.visible.end(), found) > 0) break;
      s.visible.push_back(found);
    }
  }
  s.contexts.resize(s.visible.size());
  for (size_t i = 0; i < s.visible.size(); ++i) s.contexts[i].ordinal = static_cast<int>(i);
  uint64_t va_bytes = uint64_t{64} << 30;
  if (*Env("FAKE_CUDA_VA_SIZE") != '\0') {
    bool ok = true;
    va_bytes = ParseBytes(Env("FAKE_CUDA_VA_SIZE"), &ok);
    if (!ok) {
      ConfigError("bad FAKE_CUDA_VA_SIZE");
      return false;
    }
  }
  if (!s.va.Init(va_bytes)) {
    ConfigError("cannot reserve the fake device address space");
    return false;
  }
  return true;
}

namespace {

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
    {"CUDA_ERROR_NOT_READY", CUDA_ERROR_NOT_READY, "device not ready"},
    {"CUDA_ERROR_ILLEGAL_ADDRESS", CUDA_ERROR_ILLEGAL_ADDRESS,
     "an illegal memory access was encountered"},
    {"CUDA_ERROR_LAUNCH_FAILED", CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"},
    {"CUDA_ERROR_NOT_PERMITTED", CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
    {"CUDA_ERROR_NOT_SUPPORTED", CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    {"CUDA_ERROR_UNKNOWN", CUDA_ERROR_UNKNOWN, "unknown error"},
};

}  // namespace

const char* CodeName(CUresult r) {
  for (const NamedCode& c : kCodes) {
    if (c.code == r) return c.name;
  }
  return nullptr;
}

const char* CodeText(CUresult r) {
  for (const NamedCode& c : kCodes) {
    if (c.code == r) return c.text;
  }
  return nullptr;
}

CUresult CodeByName(const std::string& s, bool* ok) {
  for (const NamedCode& c : kCodes) {
    if (s == c.name) return c.code;
  }
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') *ok = false;
  return static_cast<CUresult>(v);
}

CUresult Injected(State& s, const char* fn) {
  ++s.calls;  // every entry point passes here once
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

bool ValidOrdinal(const State& s, int ordinal) {
  return ordinal >= 0 && ordinal < static_cast<int>(s.visible.size());
}

const FakeDevice& DeviceOf(const State& s, int ordinal) { return s.all[s.visible[ordinal]]; }

bool CanAccess(const State& s, int from_ordinal, int memory_ordinal) {
  if (from_ordinal == memory_ordinal) return true;
  return s.peers.count({s.visible[from_ordinal], s.visible[memory_ordinal]}) > 0;
}

void Violation(State& s, const std::string& what) {
  std::string line = "fake libcuda violation (pid " + std::to_string(getpid()) + "): " + what;
  s.violations.push_back(line);
  std::fprintf(stderr, "%s\n", line.c_str());
  if (!s.violations_file.empty()) {
    int fd = open(s.violations_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      line += "\n";
      (void)!write(fd, line.data(), line.size());
      close(fd);
    }
  }
}

std::vector<CUctx_st*>& ContextStack() {
  static thread_local std::vector<CUctx_st*> stack;
  return stack;
}

CUctx_st* Current() {
  std::vector<CUctx_st*>& stack = ContextStack();
  return stack.empty() ? nullptr : stack.back();
}

CUresult NeedContext(State& s, int* ordinal) {
  (void)s;
  CUctx_st* c = Current();
  if (c == nullptr || c->retains <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  *ordinal = c->ordinal;
  return CUDA_SUCCESS;
}

bool VaSpace::Init(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  base_ = reinterpret_cast<uint64_t>(p);
  size_ = bytes;
  free_[base_] = size_;
  return true;
}

uint64_t VaSpace::Allocate(uint64_t size, uint64_t align) {
  if (align == 0) align = 1;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t start = it->first, len = it->second;
    const uint64_t aligned = (start + align - 1) / align * align;
    if (aligned < start || aligned - start > len || len - (aligned - start) < size) continue;
    free_.erase(it);
    if (aligned > start) free_[start] = aligned - start;
    const uint64_t end = aligned + size, free_end = start + len;
    if (free_end > end) free_[end] = free_end - end;
    return aligned;
  }
  return 0;
}

void VaSpace::Free(uint64_t start, uint64_t size) {
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return;
    }
  }
  free_[start] = size;
}

}  // namespace fakecuda
