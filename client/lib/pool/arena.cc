#include "client/lib/pool/arena.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <atomic>

namespace gpumem {
namespace client {
namespace {
std::atomic<uint64_t> g_next_arena_id{1};
}  // namespace

Arena* ArenaTable::For(const v1::PlacementRequest& placement) {
  std::string key;
  {
    google::protobuf::io::StringOutputStream out(&key);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    placement.SerializeToCodedStream(&coded);
  }
  absl::MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  if (it != by_key_.end()) return it->second;
  auto arena = std::make_unique<Arena>();
  arena->id = g_next_arena_id.fetch_add(1);
  arena->index = static_cast<uint32_t>(arenas_.size());
  arena->placement = placement;
  Arena* raw = arena.get();
  arenas_.push_back(std::move(arena));
  by_key_[key] = raw;
  return raw;
}

}  // namespace client
}  // namespace gpumem
