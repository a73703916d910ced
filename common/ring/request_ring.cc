// See request_ring.h. Create builds the memfd, seals it and writes the
// identity before anyone else can see it; Attach checks seals before size
// (a size is only worth checking once it cannot change) and reads the
// identity with pread before mapping anything.
#include "common/ring/request_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <new>

#include "absl/strings/str_cat.h"

namespace gpumem {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;

absl::Status Errno(const char* what) {
  const int e = errno;
  return absl::InternalError(absl::StrCat("request ring: ", what, ": ", strerror(e)));
}

void CloseIfOpen(int fd) {
  if (fd >= 0) close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingRegion>> RingRegion::Create(uint32_t slot_count) {
  if (slot_count == 0 || slot_count > kRingMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("request ring: ", slot_count,
                                                   " slots asked; 1 to ", kRingMaxSlots,
                                                   " allowed"));
  }
  const size_t bytes = RingLayoutBytes(slot_count);
  const int memfd = memfd_create("gpumemd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0) return Errno("memfd_create");
  // Sealed at its size before the client sees it: a client can neither
  // shrink it (the daemon would fault on the pages cut off) nor grow it,
  // nor add a seal of its own.
  if (ftruncate(memfd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status s = Errno("sizing and sealing the memfd");
    close(memfd);
    return s;
  }
  const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) {
    absl::Status s = Errno("eventfd");
    close(memfd);
    return s;
  }
  // DrainDoorbell's read must not block even if the client clears the
  // shared O_NONBLOCK: the kernel has to honour RWF_NOWAIT on an eventfd.
  uint64_t count;
  struct iovec probe = {&count, sizeof(count)};
  if (preadv2(efd, &probe, 1, -1, RWF_NOWAIT) >= 0 || errno != EAGAIN) {
    const int e = errno;
    close(memfd);
    close(efd);
    return absl::FailedPreconditionError(absl::StrCat(
        "request ring: this kernel cannot read an eventfd without waiting (RWF_NOWAIT, "
        "Linux 5.12 and later): ",
        strerror(e)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) {
    absl::Status s = Errno("mmap");
    close(memfd);
    close(efd);
    return s;
  }
  // A fresh memfd reads as zeros: every word 0, every slot kSlotFree. The
  // objects are begun here; the client's Attach finds them made.
  RingHeader* header = new (base) RingHeader();
  header->magic = kRingMagic;
  header->version = kRingVersion;
  header->slot_count = slot_count;
  header->slot_bytes = kRingSlotBytes;
  unsigned char* slots = static_cast<unsigned char*>(base) + sizeof(RingHeader);
  for (uint32_t i = 0; i < slot_count; ++i) new (slots + size_t{i} * kRingSlotBytes) RingSlot();
  return std::unique_ptr<RingRegion>(new RingRegion(base, bytes, slot_count, memfd, efd));
}

absl::StatusOr<std::unique_ptr<RingRegion>> RingRegion::Attach(int memfd, int eventfd) {
  auto refuse = [memfd, eventfd](absl::Status s) {
    CloseIfOpen(memfd);
    CloseIfOpen(eventfd);
    return s;
  };
  if (eventfd < 0 || fcntl(eventfd, F_GETFD) < 0) {
    return refuse(absl::InvalidArgumentError("request ring: the eventfd is not an open fd"));
  }
  const int seals = memfd < 0 ? -1 : fcntl(memfd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    return refuse(absl::FailedPreconditionError(
        "request ring: the memfd is not sealed against shrinking and growing "
        "(F_SEAL_SHRINK | F_SEAL_GROW), as the daemon's rings are"));
  }
  struct stat st;
  if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return refuse(absl::InvalidArgumentError("request ring: the memfd is not a regular file"));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  // The first four words of RingHeader, read as plain words.
  struct {
    uint32_t magic, version, slot_count, slot_bytes;
  } identity;
  if (file_bytes < sizeof(RingHeader) ||
      pread(memfd, &identity, sizeof(identity), 0) != static_cast<ssize_t>(sizeof(identity))) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "request ring: the memfd is ", file_bytes, " bytes, smaller than the ring's header")));
  }
  if (identity.magic != kRingMagic || identity.version != kRingVersion) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "request ring: not a version ", kRingVersion, " ring (magic ", identity.magic,
        ", version ", identity.version, ")")));
  }
  if (identity.slot_bytes != kRingSlotBytes) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "request ring: slots of ", identity.slot_bytes, " bytes; ", kRingSlotBytes,
        " expected")));
  }
  if (identity.slot_count == 0 || identity.slot_count > kRingMaxSlots) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "request ring: ", identity.slot_count, " slots; 1 to ", kRingMaxSlots, " allowed")));
  }
  const size_t bytes = RingLayoutBytes(identity.slot_count);
  if (file_bytes != bytes) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "request ring: the memfd is ", file_bytes, " bytes; ", identity.slot_count,
        " slots take ", bytes)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) return refuse(Errno("mmap"));
  return std::unique_ptr<RingRegion>(
      new RingRegion(base, bytes, identity.slot_count, memfd, eventfd));
}

RingRegion::~RingRegion() {
  munmap(base_, size_);
  close(memfd_);
  close(eventfd_);
}

void RingRegion::RingDoorbell() {
  const uint64_t one = 1;
  // EAGAIN: the counter is full, the daemon has been rung already.
  while (write(eventfd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void RingRegion::DrainDoorbell() {
  uint64_t count;
  struct iovec iov = {&count, sizeof(count)};
  while (preadv2(eventfd_, &iov, 1, -1, RWF_NOWAIT) < 0 && errno == EINTR) {
  }
}

}  // namespace gpumem
