// One curl easy handle per request (handles are not shared between
// threads); CURLOPT_NOSIGNAL because the plugin is multithreaded. The
// status mapping follows the API server's own conventions (metav1.Status).
#include "client/dra/api_server.h"

#include <curl/curl.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/dra/atomic_file.h"

namespace gpumem {
namespace dra {
namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  if (body->size() > (32u << 20)) return 0;  // refuse absurd answers
  body->append(data, size * n);
  return size * n;
}

// The message of a metav1.Status body, or the body's start.
std::string ServerMessage(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    return j["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

}  // namespace

absl::StatusOr<ApiServerConfig> InClusterConfig(const std::string& sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    return absl::FailedPreconditionError(
        "not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset): pass "
        "--api_server (and --api_token_file, --api_ca_file)");
  }
  ApiServerConfig c;
  const std::string h = host;
  // An IPv6 service address needs brackets in a URL.
  c.url = absl::StrCat("https://", h.find(':') != std::string::npos ? "[" + h + "]" : h, ":",
                       port);
  c.token_file = sa_dir + "/token";
  c.ca_file = sa_dir + "/ca.crt";
  return c;
}

ApiServer::ApiServer(ApiServerConfig config) : config_(std::move(config)) { GlobalInit(); }

absl::StatusOr<std::string> ApiServer::Request(const std::string& method,
                                               const std::string& path,
                                               const std::string& content_type,
                                               const std::string& body) const {
  const std::string what = absl::StrCat(method, " ", path);
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return absl::InternalError("curl_easy_init failed");
  CURL* h = curl.get();
  const std::string url = config_.url + path;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  const long timeout_ms = static_cast<long>(absl::ToInt64Milliseconds(config_.timeout));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  if (!config_.unix_socket.empty()) {
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, config_.unix_socket.c_str());
  }
  if (!config_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, config_.ca_file.c_str());
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);

  struct Headers {
    curl_slist* list = nullptr;
    ~Headers() { curl_slist_free_all(list); }
  } headers;
  auto add = [&](const std::string& line) {
    headers.list = curl_slist_append(headers.list, line.c_str());
  };
  add("Accept: application/json");
  add("User-Agent: gpumemd-dra");
  if (!config_.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadWholeFile(config_.token_file);
    if (!token.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot read the service-account token: ", token.status().message()));
    }
    add(absl::StrCat("Authorization: Bearer ", absl::StripAsciiWhitespace(*token)));
  }
  if (!content_type.empty()) add("Content-Type: " + content_type);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method != "GET") {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  std::string answer;
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer);

  const CURLcode rc = curl_easy_perform(h);
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": the API server did not answer within ",
        absl::FormatDuration(config_.timeout)));
  }
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot reach the API server at ",
                                               config_.url,
                                               config_.unix_socket.empty()
                                                   ? ""
                                                   : " (socket " + config_.unix_socket + ")",
                                               ": ", curl_easy_strerror(rc)));
  }
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  if (code >= 200 && code < 300) return answer;
  const std::string msg = absl::StrCat(what, ": HTTP ", code, ": ", ServerMessage(answer));
  switch (code) {
    case 400:
    case 422:
      return absl::InvalidArgumentError(msg);
    case 401:
    case 403:
      return absl::PermissionDeniedError(msg);
    case 404:
      return absl::NotFoundError(msg);
    case 409:
      return absl::AbortedError(msg);
    default:
      if (code == 429 || code >= 500) return absl::UnavailableError(msg);
      return absl::UnknownError(msg);
  }
}

absl::StatusOr<std::string> ApiServer::Get(const std::string& path) const {
  return Request("GET", path, "", "");
}

absl::Status ApiServer::Apply(const std::string& path, const std::string& object,
                              const std::string& manager) const {
  const std::string query = absl::StrCat(path.find('?') == std::string::npos ? "?" : "&",
                                         "fieldManager=", manager, "&force=true");
  return Request("PATCH", path + query, "application/apply-patch+yaml", object).status();
}

}  // namespace dra
}  // namespace gpumem
