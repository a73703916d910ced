// The C ABI (gpumem.h) over CachingPool: handles, the thread's last error,
// placement structs and text, stats as JSON.
//
// A handle is never freed (gpumem_close keeps its few bytes, marked closed)
// so that a call after close is answered, not undefined. Status codes: the
// daemon's gRPC/absl codes pass through; the library's own ride on the
// absl::Status as a payload (LibraryCodeOf).
#include "client/lib/include/gpumem.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/lib/c_handle.h"
#include "client/lib/device_uuids.h"
#include "client/lib/env_config.h"
#include "client/lib/pool/library_error.h"
#include "client/lib/slabs/cuda_device_context.h"
#include "client/lib/tenant_budget.h"

namespace gpumem {
namespace client {
namespace {

struct LastError {
  int code = 0;
  std::string message;
};
thread_local LastError last_error;

}  // namespace

// Closed handles stay allocated (and reachable, so leak checkers agree that
// they are kept on purpose): a later call through one is answered CLOSED.
void KeepClosedHandle(gpumem_client* c) {
  static absl::Mutex* mu = new absl::Mutex;
  static std::vector<gpumem_client*>* closed = new std::vector<gpumem_client*>;
  absl::MutexLock lock(mu);
  closed->push_back(c);
}

int SetError(const absl::Status& s) {
  last_error.code = s.ok() ? GPUMEM_OK : LibraryCodeOf(s);
  last_error.message = std::string(s.message());
  return last_error.code;
}

int SetOk() {
  last_error.code = GPUMEM_OK;
  last_error.message.clear();
  return GPUMEM_OK;
}

absl::StatusOr<CachingPool*> PoolOf(gpumem_client* c) {
  if (c == nullptr) return absl::InvalidArgumentError("client is NULL");
  const uint32_t magic = c->magic.load(std::memory_order_acquire);
  if (magic == kClosedMagic) {
    return LibraryError(GPUMEM_E_CLOSED, "this client was closed (gpumem_close)");
  }
  if (magic != kOpenMagic) {
    return absl::InvalidArgumentError("not a gpumem client handle");
  }
  if (c->pool->Forked()) return ForkedError();
  return c->pool.get();
}

absl::StatusOr<v1::PlacementRequest> PlacementOf(const gpumem_placement* w) {
  PlacementFlags f;
  if (w->gpus != nullptr) f.gpus = w->gpus;
  if (w->exclude != nullptr) f.exclude = w->exclude;
  if (w->fallback_count > 0 && w->fallback == nullptr) {
    return absl::InvalidArgumentError("placement: fallback_count > 0 but fallback is NULL");
  }
  for (size_t i = 0; i < w->fallback_count; ++i) {
    if (w->fallback[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("placement: fallback[", i, "] is NULL"));
    }
    f.fallback.push_back(w->fallback[i]);
  }
  if (w->policy != nullptr) f.policy = w->policy;
  return BuildPlacementRequest(f);
}

// gpumem_call_json and gpumem_mem_get_info.

// JSON of a message, as gpumem_call_json promises.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(m, &out, opts).ok()) {
    return absl::InternalError("the daemon's answer could not be printed as JSON");
  }
  return out;
}

template <typename T>
absl::StatusOr<std::string> JsonOf(const absl::StatusOr<T>& answer) {
  if (!answer.ok()) return answer.status();
  return ToJson(*answer);
}

absl::Status ParseRequest(const char* method, const char* json,
                          google::protobuf::Message* request) {
  if (json == nullptr || *json == '\0') return absl::OkStatus();
  google::protobuf::util::JsonParseOptions opts;
  const auto s = google::protobuf::util::JsonStringToMessage(json, request, opts);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        method, ": the request is not a JSON ", request->GetDescriptor()->name(), ": ",
        std::string(s.message())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CallJson(CachingPool* pool, const std::string& method,
                                     const char* json) {
  absl::StatusOr<Client*> daemon = pool->Daemon();
  if (!daemon.ok()) return daemon.status();
  if (method == "GetStats") {
    v1::GetStatsRequest req;
    if (absl::Status s = ParseRequest("GetStats", json, &req); !s.ok()) return s;
    if (req.include_slabs()) {
      return absl::InvalidArgumentError(
          "GetStats: include_slabs is not offered here (gpumemctl stats --slabs shows them)");
    }
    return JsonOf((*daemon)->GetStats(false));
  }
  if (method == "GetSession") {
    v1::GetSessionRequest req;
    if (absl::Status s = ParseRequest("GetSession", json, &req); !s.ok()) return s;
    return JsonOf((*daemon)->GetSession());
  }
  if (method == "GetUsage") {
    v1::GetUsageRequest req;
    if (absl::Status s = ParseRequest("GetUsage", json, &req); !s.ok()) return s;
    return JsonOf((*daemon)->GetUsage());
  }
  if (method == "GetLedger") {
    v1::GetLedgerRequest req;
    if (absl::Status s = ParseRequest("GetLedger", json, &req); !s.ok()) return s;
    return JsonOf((*daemon)->GetLedger(req));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "method \"", method, "\" is not one gpumem_call_json makes (GetStats, GetSession, "
      "GetUsage, GetLedger)"));
}

int CopyOut(const std::string& text, char** out) {
  *out = static_cast<char*>(std::malloc(text.size() + 1));
  if (*out == nullptr) return SetError(absl::ResourceExhaustedError("out of host memory"));
  std::memcpy(*out, text.c_str(), text.size() + 1);
  return SetOk();
}

}  // namespace client
}  // namespace gpumem

using gpumem::client::CachingPool;
using gpumem::client::PoolOf;
using gpumem::client::SetError;
using gpumem::client::SetOk;

extern "C" {

gpumem_client* gpumem_connect(const char* socket_path) {
  absl::StatusOr<gpumem::client::PoolOptions> o =
      gpumem::client::PoolOptionsFromEnv(socket_path != nullptr ? socket_path : "");
  if (!o.ok()) {
    SetError(o.status());
    return nullptr;
  }
  absl::StatusOr<gpumem::v1::PlacementRequest> where = gpumem::client::PlacementFromEnv();
  if (!where.ok()) {
    SetError(where.status());
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<CachingPool>> pool = CachingPool::Create(*o);
  if (!pool.ok()) {
    SetError(pool.status());
    return nullptr;
  }
  absl::StatusOr<CachingPool::Arena*> arena = (*pool)->ArenaFor(*where);
  if (!arena.ok()) {
    SetError(arena.status());
    return nullptr;
  }
  auto* c = new gpumem_client;
  c->pool = std::move(*pool);
  c->default_arena = *arena;
  c->magic.store(gpumem::client::kOpenMagic, std::memory_order_release);
  SetOk();
  return c;
}

int gpumem_close(gpumem_client* c) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  c->magic.store(gpumem::client::kClosedMagic, std::memory_order_release);
  c->pool.reset();
  gpumem::client::KeepClosedHandle(c);
  return SetOk();
}

namespace {

// The body of gpumem_malloc and gpumem_malloc_str; `placement` is null for
// the client's default arena.
int MallocWith(gpumem_client* c, size_t size,
               const absl::StatusOr<gpumem::v1::PlacementRequest>* placement,
               void** out) {
  if (out == nullptr) return SetError(absl::InvalidArgumentError("out is NULL"));
  *out = nullptr;
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  CachingPool::Arena* arena = c->default_arena;
  if (placement != nullptr) {
    if (!placement->ok()) return SetError(placement->status());
    absl::StatusOr<CachingPool::Arena*> a = (*pool)->ArenaFor(**placement);
    if (!a.ok()) return SetError(a.status());
    arena = *a;
  }
  absl::StatusOr<void*> ptr = (*pool)->Allocate(size, arena);
  if (!ptr.ok()) return SetError(ptr.status());
  *out = *ptr;
  return SetOk();
}

}  // namespace

int gpumem_malloc(gpumem_client* c, size_t size, const gpumem_placement* where,
                  void** out) {
  if (where == nullptr) return MallocWith(c, size, nullptr, out);
  const absl::StatusOr<gpumem::v1::PlacementRequest> p = gpumem::client::PlacementOf(where);
  return MallocWith(c, size, &p, out);
}

int gpumem_malloc_str(gpumem_client* c, size_t size, const char* placement, void** out) {
  if (placement == nullptr) return MallocWith(c, size, nullptr, out);
  const absl::StatusOr<gpumem::v1::PlacementRequest> p =
      gpumem::client::ParsePlacementText(placement);
  return MallocWith(c, size, &p, out);
}

int gpumem_malloc_sharded(gpumem_client* c, size_t total, unsigned shards,
                          const gpumem_placement* where, void** ptrs, size_t* sizes,
                          int* devices) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  if (ptrs == nullptr) return SetError(absl::InvalidArgumentError("ptrs is NULL"));
  gpumem::v1::PlacementRequest p;
  if (where != nullptr) {
    absl::StatusOr<gpumem::v1::PlacementRequest> parsed = gpumem::client::PlacementOf(where);
    if (!parsed.ok()) return SetError(parsed.status());
    p = *parsed;
  }
  absl::StatusOr<std::vector<CachingPool::Shard>> out =
      (*pool)->AllocateSharded(total, shards, p);
  if (!out.ok()) return SetError(out.status());
  for (size_t i = 0; i < out->size(); ++i) {
    ptrs[i] = (*out)[i].ptr;
    if (sizes != nullptr) sizes[i] = (*out)[i].size;
    if (devices != nullptr) devices[i] = (*out)[i].device;
  }
  return SetOk();
}

int gpumem_free(gpumem_client* c, void* ptr) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  absl::Status s = (*pool)->Free(ptr);
  return s.ok() ? SetOk() : SetError(s);
}

namespace {

// The daemon's device UUIDs by index, or the last error set.
absl::StatusOr<std::vector<std::string>> DaemonUuids(gpumem_client* c) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) {
    SetError(pool.status());
    return pool.status();
  }
  absl::StatusOr<std::vector<std::string>> uuids = gpumem::client::DeviceUuids(*pool);
  if (!uuids.ok()) SetError(uuids.status());
  return uuids;
}

}  // namespace

int gpumem_device_count(gpumem_client* c) {
  absl::StatusOr<std::vector<std::string>> uuids = DaemonUuids(c);
  if (!uuids.ok()) return -1;
  SetOk();
  return static_cast<int>(uuids->size());
}

int gpumem_visible_device_count(gpumem_client* c) {
  absl::StatusOr<std::vector<std::string>> uuids = DaemonUuids(c);
  if (!uuids.ok()) return -1;
  // The daemon's rule (PlacementRequest.visible_devices): a view naming none
  // of its devices restricts nothing.
  int seen = 0;
  for (const std::string& uuid : *uuids) {
    for (const std::string& mine : gpumem::client::CudaDeviceContext::VisibleUuids()) {
      if (absl::EqualsIgnoreCase(uuid, mine)) {
        ++seen;
        break;
      }
    }
  }
  SetOk();
  return seen > 0 ? seen : static_cast<int>(uuids->size());
}

int gpumem_export_dmabuf(gpumem_client* c, const void* ptr, size_t size, int* fd,
                         size_t* offset) {
  if (fd == nullptr || offset == nullptr) {
    return SetError(absl::InvalidArgumentError("fd or offset is NULL"));
  }
  *fd = -1;
  *offset = 0;
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  absl::StatusOr<CachingPool::DmaBuf> buf = (*pool)->ExportDmaBuf(ptr, size);
  if (!buf.ok()) return SetError(buf.status());
  *fd = buf->fd;
  *offset = buf->offset;
  return SetOk();
}

int gpumem_device_of(gpumem_client* c, const void* ptr) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) {
    SetError(pool.status());
    return -1;
  }
  absl::StatusOr<int> d = (*pool)->DeviceOf(ptr);
  if (!d.ok()) {
    SetError(d.status());
    return -1;
  }
  SetOk();
  return *d;
}

int gpumem_device_ordinal(gpumem_client* c, const void* ptr, int* ordinal) {
  if (ordinal == nullptr) return SetError(absl::InvalidArgumentError("ordinal is NULL"));
  *ordinal = -1;
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  absl::StatusOr<int> o = (*pool)->OrdinalOf(ptr);
  if (!o.ok()) return SetError(o.status());
  *ordinal = *o;
  return SetOk();
}

int gpumem_trim(gpumem_client* c, size_t* released) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  absl::StatusOr<uint64_t> n = (*pool)->Trim();
  if (!n.ok()) return SetError(n.status());
  if (released != nullptr) *released = *n;
  return SetOk();
}

int gpumem_stats_json(gpumem_client* c, char** json) {
  if (json == nullptr) return SetError(absl::InvalidArgumentError("json is NULL"));
  *json = nullptr;
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  // The daemon's first: the call waits for a restart under way to come
  // through, so the pool's figures (its generation too) are read after it.
  absl::StatusOr<gpumem::client::Client*> connection = (*pool)->Daemon();
  if (!connection.ok()) return SetError(connection.status());
  absl::StatusOr<gpumem::v1::GetStatsResponse> daemon = (*connection)->GetStats(false);
  if (!daemon.ok()) return SetError(daemon.status());
  gpumem::client::PoolStats st = (*pool)->Stats();
  std::string out = absl::StrFormat(
      "{\"generation\":%d,\"leases\":%d,\"leased_bytes\":%d,\"in_use_bytes\":%d,"
      "\"cached_bytes\":%d,\"large_blocks\":%d,\"large_bytes\":%d,\"lost_bytes\":%d,"
      "\"deferred_blocks\":%d,\"deferred_bytes\":%d,\"graph_held_blocks\":%d,"
      "\"graph_held_bytes\":%d,\"lease_rows\":[",
      st.generation, st.leases, st.leased_bytes, st.in_use_bytes, st.cached_bytes,
      st.large_blocks, st.large_bytes, st.lost_bytes, st.deferred_blocks, st.deferred_bytes,
      st.graph_held_blocks, st.graph_held_bytes);
  for (size_t i = 0; i < st.rows.size(); ++i) {
    const auto& r = st.rows[i];
    absl::StrAppendFormat(&out,
                          "%s{\"device\":%d,\"bytes\":%d,\"used_bytes\":%d,\"blocks\":%d}",
                          i ? "," : "", r.device, r.bytes, r.used_bytes, r.live_blocks);
  }
  out += "]";
  std::string dj;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(*daemon, &dj, opts).ok()) {
    return SetError(absl::InternalError("daemon stats could not be printed as JSON"));
  }
  absl::StrAppend(&out, ",\"daemon\":", dj, "}");
  *json = static_cast<char*>(std::malloc(out.size() + 1));
  if (*json == nullptr) return SetError(absl::ResourceExhaustedError("out of host memory"));
  std::memcpy(*json, out.c_str(), out.size() + 1);
  return SetOk();
}

int gpumem_call_json(gpumem_client* c, const char* method, const char* request_json,
                     char** response_json) {
  if (response_json == nullptr) {
    return SetError(absl::InvalidArgumentError("response_json is NULL"));
  }
  *response_json = nullptr;
  if (method == nullptr) return SetError(absl::InvalidArgumentError("method is NULL"));
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  absl::StatusOr<std::string> out = gpumem::client::CallJson(*pool, method, request_json);
  if (!out.ok()) return SetError(out.status());
  return gpumem::client::CopyOut(*out, response_json);
}

int gpumem_mem_get_info(gpumem_client* c, int device, size_t* free_bytes, size_t* total_bytes) {
  absl::StatusOr<CachingPool*> pool = PoolOf(c);
  if (!pool.ok()) return SetError(pool.status());
  if (device < 0) {
    return SetError(absl::InvalidArgumentError(absl::StrCat("device ", device, " is negative")));
  }
  absl::StatusOr<gpumem::client::MemInfo> info =
      gpumem::client::PoolMemInfo(*pool, static_cast<uint32_t>(device));
  if (!info.ok()) return SetError(info.status());
  if (free_bytes != nullptr) *free_bytes = info->free_bytes;
  if (total_bytes != nullptr) *total_bytes = info->total_bytes;
  return SetOk();
}

void gpumem_string_free(char* s) { std::free(s); }

int gpumem_last_error(void) { return gpumem::client::last_error.code; }

const char* gpumem_last_error_message(void) { return gpumem::client::last_error.message.c_str(); }

const char* gpumem_status_name(int code) {
  switch (code) {
    case GPUMEM_OK: return "GPUMEM_OK";
    case GPUMEM_E_INVALID_ARGUMENT: return "GPUMEM_E_INVALID_ARGUMENT";
    case GPUMEM_E_NOT_FOUND: return "GPUMEM_E_NOT_FOUND";
    case GPUMEM_E_PERMISSION_DENIED: return "GPUMEM_E_PERMISSION_DENIED";
    case GPUMEM_E_RESOURCE_EXHAUSTED: return "GPUMEM_E_RESOURCE_EXHAUSTED";
    case GPUMEM_E_FAILED_PRECONDITION: return "GPUMEM_E_FAILED_PRECONDITION";
    case GPUMEM_E_INTERNAL: return "GPUMEM_E_INTERNAL";
    case GPUMEM_E_UNAVAILABLE: return "GPUMEM_E_UNAVAILABLE";
    case GPUMEM_E_FOREIGN_POINTER: return "GPUMEM_E_FOREIGN_POINTER";
    case GPUMEM_E_DOUBLE_FREE: return "GPUMEM_E_DOUBLE_FREE";
    case GPUMEM_E_LOST: return "GPUMEM_E_LOST";
    case GPUMEM_E_CLOSED: return "GPUMEM_E_CLOSED";
    case GPUMEM_E_FORKED: return "GPUMEM_E_FORKED";
    default: return "GPUMEM_E_OTHER";
  }
}

}  // extern "C"
