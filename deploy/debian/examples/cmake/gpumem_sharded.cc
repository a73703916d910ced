// gpumem_sharded: a C++ program built with CMake (find_package(gpumem)): one
// sharded allocation, a shard on each device of the daemon, each written and
// read back when it is host memory (the sim backend), then freed.
#include <cstdio>
#include <cstring>
#include <vector>

#include <gpumem.h>

namespace {

int Fail(const char* what) {
  std::fprintf(stderr, "gpumem_sharded: %s: %s\n", what, gpumem_last_error_message());
  return 1;
}

}  // namespace

int main() {
  gpumem_client* c = gpumem_connect(nullptr);
  if (c == nullptr) return Fail("connect");
  const int devices = gpumem_visible_device_count(c);
  if (devices <= 0) return Fail("device_count");
  const size_t total = size_t(devices) << 20;
  std::vector<void*> ptrs(devices);
  std::vector<size_t> sizes(devices);
  std::vector<int> on(devices);
  if (gpumem_malloc_sharded(c, total, unsigned(devices), nullptr, ptrs.data(), sizes.data(),
                            on.data()) != 0) {
    return Fail("malloc_sharded");
  }
  int written = 0;
  for (int i = 0; i < devices; ++i) {
    int ordinal = 0;
    if (gpumem_device_ordinal(c, ptrs[i], &ordinal) != 0) return Fail("device_ordinal");
    if (ordinal != -1) continue;  // device memory: for kernels, not the host
    auto* bytes = static_cast<unsigned char*>(ptrs[i]);
    std::memset(bytes, 0x40 + i, sizes[i]);
    for (size_t b = 0; b < sizes[i]; ++b) {
      if (bytes[b] != 0x40 + i) {
        std::fprintf(stderr, "gpumem_sharded: shard %d reads back wrong\n", i);
        return 1;
      }
    }
    ++written;
  }
  for (void* p : ptrs) {
    if (gpumem_free(c, p) != 0) return Fail("free");
  }
  if (gpumem_close(c) != 0) return Fail("close");
  std::printf("gpumem_sharded: %d shard(s) on %d device(s), %d written and read back, freed: ok\n",
              devices, devices, written);
  return 0;
}
