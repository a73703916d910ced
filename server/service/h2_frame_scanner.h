// H2FrameScanner: the frame headers of one direction of an HTTP/2
// connection, read as its bytes pass by, without keeping the bytes.
//
// Bytes come in chunks of any size, split anywhere. The scanner keeps at
// most one partial 9-byte frame header between chunks and skips payloads by
// their length. The client's direction starts with the 24-byte connection
// preface, which must be exact. Nothing else about the frames is judged
// here (gRPC does that); a length is trusted only to find the next header.
//
// Invariants: every frame header is reported exactly once, in order, with
// where it began; once the preface was wrong or a visit said stop, the
// scanner stays stopped and reports nothing more.
#ifndef GPUMEMD_SERVER_SERVICE_H2_FRAME_SCANNER_H_
#define GPUMEMD_SERVER_SERVICE_H2_FRAME_SCANNER_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace gpumem {

// Frame types (RFC 9113, section 6) the daemon looks at.
inline constexpr uint8_t kH2Data = 0x0;
inline constexpr uint8_t kH2Headers = 0x1;
inline constexpr uint8_t kH2RstStream = 0x3;
inline constexpr uint8_t kH2Settings = 0x4;
inline constexpr uint8_t kH2Goaway = 0x7;
// The END_STREAM flag of DATA and HEADERS; the ACK flag of SETTINGS.
inline constexpr uint8_t kH2EndStream = 0x1;
inline constexpr uint8_t kH2Ack = 0x1;
// GOAWAY error codes: a peer that broke the protocol, one that makes the
// server do too much.
inline constexpr uint32_t kH2ProtocolError = 0x1;
inline constexpr uint32_t kH2EnhanceYourCalm = 0xb;
// The size of a frame header.
inline constexpr size_t kH2FrameHeaderBytes = 9;
// What an HTTP/2 client sends first.
inline constexpr absl::string_view kH2ClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct H2Frame {
  uint32_t length = 0;  // of the payload, 24 bits
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t stream_id = 0;  // 31 bits (the reserved bit cleared)
};

class H2FrameScanner {
 public:
  enum class Direction {
    kFromClient,  // starts with the connection preface
    kFromServer,
  };
  explicit H2FrameScanner(Direction direction)
      : preface_left_(direction == Direction::kFromClient ? kH2ClientPreface.size() : 0) {}

  // Scans the next bytes of the direction. `visit` is called for each frame
  // whose header completes within `data`; when it returns false the scan
  // stops and returns where that frame's header began in `data` (0 when it
  // began in an earlier chunk): the bytes before it may be passed on, that
  // frame and what follows may not. Otherwise returns data.size(). A wrong
  // preface stops the scan too, returning 0 (stopped() is then true and
  // bad_preface() says why).
  size_t Scan(absl::string_view data, absl::FunctionRef<bool(const H2Frame&)> visit);

  bool stopped() const { return stopped_; }
  bool bad_preface() const { return bad_preface_; }
  // Whether the bytes scanned so far end where a frame (or the preface)
  // ends: a frame written now would be read whole by the peer.
  bool at_frame_boundary() const {
    return !stopped_ && preface_left_ == 0 && header_len_ == 0 && payload_left_ == 0;
  }

 private:
  size_t preface_left_;       // preface bytes still to check
  uint8_t header_[kH2FrameHeaderBytes];
  size_t header_len_ = 0;     // bytes of a header seen so far
  uint64_t payload_left_ = 0;  // of the current frame
  bool stopped_ = false;
  bool bad_preface_ = false;
};

}  // namespace gpumem

#endif  // GPUMEMD_SERVER_SERVICE_H2_FRAME_SCANNER_H_
