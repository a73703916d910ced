#include "server/backend/sim_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "server/backend/sim_topology.h"

namespace gpumem {

class SimBackend::SimSlab : public Slab {
 public:
  SimSlab(uint32_t device, uint64_t size, int fd, std::atomic<uint64_t>* account)
      : device_(device), size_(size), fd_(fd), account_(account) {}
  ~SimSlab() override {
    close(fd_);
    account_->fetch_sub(size_);
  }
  uint32_t device() const override { return device_; }
  uint64_t size() const override { return size_; }
  HandleKind handle_kind() const override { return HandleKind::kMemfd; }
  absl::StatusOr<int> ExportFd() const override {
    int fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot duplicate slab fd: ", strerror(errno)));
    }
    return fd;
  }
  SlabIdentity Identity() const override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return {};
    return SlabIdentity{static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
  }
  absl::Status Scrub(uint64_t offset, uint64_t length) override {
    if (offset > size_ || length > size_ - offset) {
      return absl::OutOfRangeError("scrub range outside the slab");
    }
    if (length == 0) return absl::OkStatus();
    if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(length)) != 0) {
      return absl::InternalError(absl::StrCat("scrub: ", strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  uint32_t device_;
  uint64_t size_;
  int fd_;
  std::atomic<uint64_t>* account_;
};

SimBackend::SimBackend(const std::vector<uint64_t>& device_bytes,
                       std::vector<PeerLink> links)
    : links_(std::move(links)),
      slab_bytes_(new std::atomic<uint64_t>[device_bytes.size()]) {
  for (uint32_t i = 0; i < device_bytes.size(); ++i) {
    slab_bytes_[i] = 0;
    DeviceInfo d;
    d.index = i;
    // Stable across restarts for the same layout, unique per index.
    uint64_t h = 0x9e3779b97f4a7c15ull * (i + 1) ^ device_bytes[i];
    d.uuid = absl::StrFormat("GPU-51%06x-%04x-4000-8000-%012x", i,
                             static_cast<uint32_t>(h >> 48) & 0xffff,
                             h & 0xffffffffffffull);
    d.name = absl::StrCat("gpumemd simulated GPU (", FormatBytes(device_bytes[i]), ")");
    d.pci_bus_id = absl::StrFormat("0000:%02x:00.0", 0x10 + i);
    d.numa_node = 0;
    d.total_bytes = device_bytes[i];
    devices_.push_back(d);
  }
  // No topology given: every pair through the host (the empty topology).
  if (links_.empty()) {
    links_ = *ParseSimTopology("", static_cast<uint32_t>(device_bytes.size()));
  }
}

SimBackend::~SimBackend() = default;

PeerLink SimBackend::Peer(uint32_t a, uint32_t b) const {
  return links_[a * devices_.size() + b];
}

uint64_t SimBackend::SlabBytes(uint32_t device) const {
  return device < devices_.size() ? slab_bytes_[device].load() : 0;
}

const std::vector<HandleKind>& SimBackend::handle_kinds() const {
  static const auto* kinds = new std::vector<HandleKind>{HandleKind::kMemfd};
  return *kinds;
}

void SimBackend::SetCreateDelay(uint32_t device, absl::Duration delay) {
  if (device >= devices_.size()) return;
  create_delay_.resize(devices_.size());
  create_delay_[device] = delay;
}

absl::StatusOr<std::unique_ptr<Slab>> SimBackend::CreateSlab(uint32_t device,
                                                             uint64_t bytes,
                                                             HandleKind kind) {
  if (device >= devices_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  }
  if (kind != HandleKind::kMemfd) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sim backend makes memfd slabs only, not ", HandleKindName(kind)));
  }
  if (bytes == 0) return absl::InvalidArgumentError("empty slab");
  if (device < create_delay_.size() && create_delay_[device] > absl::ZeroDuration()) {
    absl::SleepFor(create_delay_[device]);
  }
  const uint64_t total = devices_[device].total_bytes;
  std::atomic<uint64_t>& used = slab_bytes_[device];
  uint64_t cur = used.load();
  do {
    if (bytes > total - cur) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device ", device, " has ", FormatBytes(total - cur),
          " left for slabs, ", FormatBytes(bytes), " asked"));
    }
  } while (!used.compare_exchange_weak(cur, cur + bytes));
  int fd = memfd_create(absl::StrCat("gpumemd-sim", device).c_str(),
                        MFD_CLOEXEC | MFD_ALLOW_SEALING);
  // Sealed at its size before any client sees it: a client holding the fd
  // can neither shrink it (every other importer would fault on the pages
  // cut off) nor grow it (host memory outside any quota), and can add no
  // seal of its own (F_SEAL_WRITE would break the daemon's scrub).
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    used.fetch_sub(bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat("memfd for a ", FormatBytes(bytes), " slab: ", strerror(e)));
  }
  return std::unique_ptr<Slab>(new SimSlab(device, bytes, fd, &used));
}

absl::StatusOr<std::unique_ptr<Slab>> SimBackend::AdoptSlab(uint32_t device, uint64_t bytes,
                                                            HandleKind kind, int fd,
                                                            const SlabIdentity& identity) {
  auto refuse = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  if (device >= devices_.size()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("no device ", device)));
  }
  if (kind != HandleKind::kMemfd) {
    return refuse(absl::InvalidArgumentError("the sim backend takes back memfd slabs only"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return refuse(absl::FailedPreconditionError("the handle is not a memfd"));
  }
  if (identity.ino == 0 || static_cast<uint64_t>(st.st_ino) != identity.ino ||
      static_cast<uint64_t>(st.st_dev) != identity.dev) {
    return refuse(absl::FailedPreconditionError(
        "the handle is not the slab's (another file than the one the daemon made)"));
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "the handle is ", st.st_size, " bytes; the slab was ", bytes)));
  }
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return refuse(absl::FailedPreconditionError(
        "the handle's memfd is not sealed at its size, as every slab of the daemon's is"));
  }
  const uint64_t total = devices_[device].total_bytes;
  std::atomic<uint64_t>& used = slab_bytes_[device];
  uint64_t cur = used.load();
  do {
    if (bytes > total - cur) {
      return refuse(absl::ResourceExhaustedError(absl::StrCat(
          "device ", device, " has ", FormatBytes(total - cur), " left for slabs, ",
          FormatBytes(bytes), " to take back")));
    }
  } while (!used.compare_exchange_weak(cur, cur + bytes));
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return std::unique_ptr<Slab>(new SimSlab(device, bytes, fd, &used));
}

}  // namespace gpumem
