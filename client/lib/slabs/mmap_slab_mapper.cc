// The mmap mapper: a memfd slab (sim backend) mapped shared, read-write.
// Retire replaces the mapping with an inaccessible one in one mmap call
// (MAP_FIXED over it), so the addresses stay taken and a stale pointer
// faults.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/lib/slabs/slab_mapper.h"

namespace gpumem {
namespace client {
namespace {

class MmapSlab : public OpenedSlab {
 public:
  MmapSlab(char* base, uint64_t size, int fd) : base_(base), size_(size), fd_(fd) {}
  ~MmapSlab() override {
    munmap(base_, size_);
    if (fd_ >= 0) close(fd_);
  }
  int handle_fd() const override { return fd_; }
  char* base() const override { return base_; }
  uint64_t size() const override { return size_; }
  void Retire() override {
    if (retired_) return;
    retired_ = true;
    mmap(base_, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    close(fd_);  // the memory goes; nothing left to give back
    fd_ = -1;
  }
  absl::Status Write(uint64_t offset, const void* src, uint64_t n) override {
    if (retired_) return absl::FailedPreconditionError("the slab was retired");
    if (offset > size_ || n > size_ - offset) return absl::OutOfRangeError("outside the slab");
    std::memcpy(base_ + offset, src, n);
    return absl::OkStatus();
  }
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) override {
    if (retired_) return absl::FailedPreconditionError("the slab was retired");
    if (offset > size_ || n > size_ - offset) return absl::OutOfRangeError("outside the slab");
    std::memcpy(dst, base_ + offset, n);
    return absl::OkStatus();
  }

 private:
  char* base_;
  uint64_t size_;
  int fd_;
  bool retired_ = false;
};

class MmapSlabMapper : public SlabMapper {
 public:
  v1::HandleKind kind() const override { return v1::HANDLE_KIND_MEMFD; }
  absl::StatusOr<std::unique_ptr<OpenedSlab>> Open(const v1::Allocation& a,
                                                   const SlabFdSource& fetch_fd) override {
    absl::StatusOr<SlabFd> slab = fetch_fd();
    if (!slab.ok()) return slab.status();
    void* base = mmap(nullptr, slab->size, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd, 0);
    int err = errno;
    if (base == MAP_FAILED) {
      close(slab->fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of slab ", a.slab_id(), " failed: ", std::strerror(err)));
    }
    return std::unique_ptr<OpenedSlab>(
        new MmapSlab(static_cast<char*>(base), slab->size, slab->fd));
  }
};

}  // namespace

std::unique_ptr<SlabMapper> NewMmapSlabMapper() { return std::make_unique<MmapSlabMapper>(); }

}  // namespace client
}  // namespace gpumem
