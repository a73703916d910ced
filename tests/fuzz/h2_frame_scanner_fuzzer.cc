// Fuzzes H2FrameScanner (server/service/h2_frame_scanner.h), which reads
// every byte a gRPC client sends to the daemon, against a reference that
// parses the whole input at once.
//
// Input: byte 0 chooses the chunk sizes the bytes arrive in (1..64, varying
// with a seed); byte 1 the direction (bit 0: the client's, with the
// preface) and at which frame the visit says stop (bits 1-7: the n-th
// frame, 0: never); the rest is the stream. Checked for every input: the
// frames reported are exactly the reference's, in order; a stop returns
// where that frame's header began in its chunk (0 if in an earlier one) and
// nothing is reported after it; a wrong preface is caught and reports no
// frame; at the end, at_frame_boundary() is the reference's.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "server/service/h2_frame_scanner.h"

namespace gpumem {
namespace {

struct Seen {
  size_t start;  // where its header began in the stream
  H2Frame frame;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "h2_frame_scanner_fuzzer: %s\n", what);
    abort();
  }
}

bool Same(const H2Frame& a, const H2Frame& b) {
  return a.length == b.length && a.type == b.type && a.flags == b.flags &&
         a.stream_id == b.stream_id;
}

// The whole stream at once: its frames with complete headers, and whether it
// ends on a frame boundary. False when the preface is wrong.
bool Reference(const uint8_t* p, size_t n, bool client, std::vector<Seen>* frames,
               bool* boundary) {
  size_t pos = 0;
  if (client) {
    const size_t take = n < kH2ClientPreface.size() ? n : kH2ClientPreface.size();
    if (memcmp(p, kH2ClientPreface.data(), take) != 0) return false;
    pos = take;
    if (take < kH2ClientPreface.size()) {
      *boundary = false;
      return true;
    }
  }
  while (pos + kH2FrameHeaderBytes <= n) {
    Seen s;
    s.start = pos;
    s.frame.length = (uint32_t{p[pos]} << 16) | (uint32_t{p[pos + 1]} << 8) | p[pos + 2];
    s.frame.type = p[pos + 3];
    s.frame.flags = p[pos + 4];
    s.frame.stream_id = ((uint32_t{p[pos + 5]} << 24) | (uint32_t{p[pos + 6]} << 16) |
                         (uint32_t{p[pos + 7]} << 8) | p[pos + 8]) &
                        0x7fffffffu;
    frames->push_back(s);
    pos += kH2FrameHeaderBytes + s.frame.length;
  }
  *boundary = pos == n;
  return true;
}

}  // namespace
}  // namespace gpumem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpumem;
  if (size < 2) return 0;
  uint32_t seed = data[0];
  const bool client = (data[1] & 1) != 0;
  const size_t stop_at = data[1] >> 1;  // 1-based frame index; 0: never
  const uint8_t* stream = data + 2;
  const size_t n = size - 2;

  std::vector<Seen> expected;
  bool expected_boundary = false;
  const bool preface_ok = Reference(stream, n, client, &expected, &expected_boundary);

  H2FrameScanner scanner(client ? H2FrameScanner::Direction::kFromClient
                                : H2FrameScanner::Direction::kFromServer);
  std::vector<H2Frame> got;
  bool stopped = false;
  size_t pos = 0;
  while (pos < n) {
    seed = seed * 1103515245u + 12345u;
    size_t chunk = 1 + (seed >> 16) % 64;
    if (chunk > n - pos) chunk = n - pos;
    const size_t before = got.size();
    const size_t r = scanner.Scan(
        absl::string_view(reinterpret_cast<const char*>(stream + pos), chunk),
        [&](const H2Frame& f) {
          got.push_back(f);
          return got.size() != stop_at;
        });
    if (stopped) {
      Check(r == 0 && got.size() == before, "a stopped scanner reported more");
    } else if (scanner.stopped() && scanner.bad_preface()) {
      Check(!preface_ok, "a right preface called wrong");
      Check(r == 0 && got.empty(), "a wrong preface passed bytes or frames");
      stopped = true;
    } else if (scanner.stopped()) {
      Check(stop_at != 0 && got.size() == stop_at, "stopped without being told");
      const size_t header_start = expected[stop_at - 1].start;
      const size_t want = header_start > pos ? header_start - pos : 0;
      Check(r == want, "a stop did not return where its frame began");
      stopped = true;
    } else {
      Check(r == chunk, "a chunk not scanned whole");
    }
    pos += chunk;
  }
  if (!preface_ok) {
    Check(n == 0 || scanner.bad_preface(), "a wrong preface not caught");
    return 0;
  }
  const size_t want_frames =
      stop_at != 0 && stop_at <= expected.size() ? stop_at : expected.size();
  Check(got.size() == want_frames, "frames reported are not the reference's");
  for (size_t i = 0; i < got.size(); ++i) Check(Same(got[i], expected[i].frame), "a frame differs");
  if (!scanner.stopped()) {
    Check(scanner.at_frame_boundary() == expected_boundary, "frame boundary wrong at the end");
  }
  return 0;
}
