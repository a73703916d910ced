// See h2_frame_scanner.h.
#include "server/service/h2_frame_scanner.h"

#include <algorithm>
#include <cstring>

namespace gpumem {

size_t H2FrameScanner::Scan(absl::string_view data,
                            absl::FunctionRef<bool(const H2Frame&)> visit) {
  if (stopped_) return 0;
  const size_t n = data.size();
  size_t i = 0;
  if (preface_left_ > 0) {
    const size_t seen = kH2ClientPreface.size() - preface_left_;
    const size_t take = std::min(preface_left_, n);
    if (data.substr(0, take) != kH2ClientPreface.substr(seen, take)) {
      stopped_ = true;
      bad_preface_ = true;
      return 0;
    }
    preface_left_ -= take;
    i = take;
  }
  while (i < n) {
    if (payload_left_ > 0) {
      const size_t skip = static_cast<size_t>(std::min<uint64_t>(payload_left_, n - i));
      payload_left_ -= skip;
      i += skip;
      continue;
    }
    const size_t header_start = header_len_ == 0 ? i : 0;
    const size_t take = std::min(kH2FrameHeaderBytes - header_len_, n - i);
    memcpy(header_ + header_len_, data.data() + i, take);
    header_len_ += take;
    i += take;
    if (header_len_ < kH2FrameHeaderBytes) break;
    header_len_ = 0;
    H2Frame frame;
    frame.length = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
    frame.type = header_[3];
    frame.flags = header_[4];
    frame.stream_id = ((uint32_t{header_[5]} << 24) | (uint32_t{header_[6]} << 16) |
                       (uint32_t{header_[7]} << 8) | header_[8]) &
                      0x7fffffffu;
    payload_left_ = frame.length;
    if (!visit(frame)) {
      stopped_ = true;
      return header_start;
    }
  }
  return n;
}

}  // namespace gpumem
