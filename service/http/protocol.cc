#include "service/http/protocol.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace offload::http {
namespace {

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// For messages that quote a header value: printable ASCII only, at most 64 characters.
std::string Quote(absl::string_view value) {
  std::string out;
  for (char c : value.substr(0, 64)) {
    out.push_back(absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?');
  }
  return absl::StrCat("\"", out, value.size() > 64 ? "...\"" : "\"");
}

}  // namespace

absl::StatusOr<ContentType> ParseContentType(absl::string_view content_type) {
  absl::string_view media = content_type.substr(0, content_type.find(';'));
  media = absl::StripAsciiWhitespace(media);
  const auto is = [media](absl::string_view name) { return absl::EqualsIgnoreCase(media, name); };
  if (is("application/proto")) return ContentType{Protocol::kConnect, Codec::kProto};
  if (is("application/json")) return ContentType{Protocol::kConnect, Codec::kJson};
  if (is("application/grpc-web") || is("application/grpc-web+proto")) {
    return ContentType{Protocol::kGrpcWeb, Codec::kProto, false};
  }
  if (is("application/grpc-web-text") || is("application/grpc-web-text+proto")) {
    return ContentType{Protocol::kGrpcWeb, Codec::kProto, true};
  }
  if (is("application/grpc") || is("application/grpc+proto")) {
    return ContentType{Protocol::kGrpc, Codec::kProto, false};
  }
  if (is("application/grpc+json")) return ContentType{Protocol::kGrpc, Codec::kJson, false};
  return absl::InvalidArgumentError(absl::StrCat(
      "content-type: expected application/proto, application/json, application/grpc-web, "
      "application/grpc-web+proto, application/grpc-web-text, application/grpc-web-text+proto, "
      "application/grpc, application/grpc+proto or application/grpc+json, got ",
      Quote(content_type)));
}

bool IsGrpcContentType(absl::string_view content_type) {
  absl::string_view media = content_type.substr(0, content_type.find(';'));
  media = absl::StripAsciiWhitespace(media);
  constexpr absl::string_view kGrpc = "application/grpc";
  return media.size() >= kGrpc.size() && absl::EqualsIgnoreCase(media.substr(0, kGrpc.size()), kGrpc) &&
         (media.size() == kGrpc.size() || media[kGrpc.size()] == '+');
}

absl::string_view GrpcContentType(const ContentType& type) {
  return type.codec == Codec::kJson ? "application/grpc+json" : "application/grpc";
}

absl::string_view GrpcWebContentType(const ContentType& type) {
  return type.text ? "application/grpc-web-text+proto" : "application/grpc-web+proto";
}

absl::StatusOr<std::string> DecodeGrpcWebText(absl::string_view body) {
  // Each chunk ends at its padding (or at the end): decode them one by one.
  std::string out;
  std::string chunk;
  const auto flush = [&]() -> absl::Status {
    if (chunk.empty()) return absl::OkStatus();
    std::string bytes;
    if (chunk.size() % 4 == 1 || !absl::Base64Unescape(chunk, &bytes)) {
      return absl::InvalidArgumentError("grpc-web-text request: the body is not base64");
    }
    out += bytes;
    chunk.clear();
    return absl::OkStatus();
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == ' ' || c == '\r' || c == '\n' || c == '\t') continue;
    chunk.push_back(c);
    if (c == '=' && (i + 1 == body.size() || body[i + 1] != '=')) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  return out;
}

std::string EncodeGrpcWebText(absl::string_view bytes) { return absl::Base64Escape(bytes); }

absl::StatusOr<std::string> PercentDecode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%') {
      int value = 0;
      if (i + 2 >= text.size()) {
        return absl::InvalidArgumentError("a '%' escape is cut short");
      }
      for (int k = 1; k <= 2; ++k) {
        const char h = text[i + k];
        value <<= 4;
        if (h >= '0' && h <= '9') {
          value |= h - '0';
        } else if (h >= 'a' && h <= 'f') {
          value |= h - 'a' + 10;
        } else if (h >= 'A' && h <= 'F') {
          value |= h - 'A' + 10;
        } else {
          return absl::InvalidArgumentError("a '%' escape is not two hex digits");
        }
      }
      out.push_back(static_cast<char>(value));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<ConnectGetQuery> ParseConnectGetQuery(absl::string_view query, size_t max_bytes) {
  ConnectGetQuery out;
  std::optional<std::string> encoding, message, compression, base64, connect;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    const absl::string_view key = pair.substr(0, eq);
    const absl::string_view raw = eq == absl::string_view::npos ? "" : pair.substr(eq + 1);
    std::optional<std::string>* slot = nullptr;
    if (key == "encoding") slot = &encoding;
    else if (key == "message") slot = &message;
    else if (key == "compression") slot = &compression;
    else if (key == "base64") slot = &base64;
    else if (key == "connect") slot = &connect;
    if (slot == nullptr) continue;  // e.g. a cache buster
    if (slot->has_value()) continue;  // the first one counts, as connect-go's Query().Get reads it
    if (raw.size() > 4 * max_bytes + 64) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "query: ", key, ": expected at most ", max_bytes, " bytes once decoded"));
    }
    absl::StatusOr<std::string> value = PercentDecode(raw);
    if (!value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("query: ", key, ": ", value.status().message()));
    }
    *slot = *std::move(value);
  }
  if (connect.has_value() && *connect != "v1") {
    return absl::InvalidArgumentError(
        absl::StrCat("query: connect: expected v1, got ", Quote(*connect)));
  }
  if (!encoding.has_value()) {
    return absl::InvalidArgumentError("query: encoding: expected proto or json, got none");
  }
  if (*encoding == "proto") {
    out.codec = Codec::kProto;
  } else if (*encoding == "json") {
    out.codec = Codec::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("query: encoding: expected proto or json, got ", Quote(*encoding)));
  }
  if (compression.has_value()) {
    absl::StatusOr<Encoding> c = ParseEncoding(*compression);
    if (!c.ok()) return c.status();
    out.compression = *c;
  }
  if (!message.has_value()) {
    return absl::InvalidArgumentError("query: message: expected the request message, got none");
  }
  if (base64.has_value() && *base64 == "1") {
    std::string bytes;
    std::string text = *message;
    // URL-safe base64, padding optional (some clients send the standard alphabet: accepted).
    for (char& c : text) {
      if (c == '+') c = '-';
      if (c == '/') c = '_';
    }
    while (!text.empty() && text.back() == '=') text.pop_back();
    if (text.size() % 4 == 1 || !absl::WebSafeBase64Unescape(text, &bytes)) {
      return absl::InvalidArgumentError("query: message: expected URL-safe base64 (base64=1)");
    }
    out.message = std::move(bytes);
  } else if (base64.has_value() && *base64 != "0") {
    return absl::InvalidArgumentError(
        absl::StrCat("query: base64: expected 1 or 0, got ", Quote(*base64)));
  } else {
    out.message = *std::move(message);
  }
  if (out.message.size() > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("query: message: expected at most ", max_bytes, " bytes, got ",
                     out.message.size()));
  }
  return out;
}

namespace {

// "scheme://host[:port]": a serialized origin as browsers send it.
absl::Status CheckOrigin(absl::string_view origin) {
  const size_t sep = origin.find("://");
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_cors_origins: expected exact origins such as https://app.example.com (", why,
        "), got ", Quote(origin)));
  };
  if (origin == "*" || origin == "null") return bad("no wildcard or null");
  if (sep == absl::string_view::npos || sep == 0) return bad("scheme://host[:port]");
  for (char c : origin.substr(0, sep)) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return bad("a scheme of letters, digits, + - .");
    }
  }
  const absl::string_view host = origin.substr(sep + 3);
  if (host.empty()) return bad("a host");
  for (char c : host) {
    if (c == '/' || c == '?' || c == '#' || c == '*' || c == ' ' || c == ',') {
      return bad("no path, query or wildcard");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CorsPolicy> CorsPolicy::Create(std::vector<std::string> origins) {
  for (std::string& o : origins) {
    o = std::string(absl::StripAsciiWhitespace(o));
    if (absl::Status s = CheckOrigin(o); !s.ok()) return s;
    // Scheme and host compare case-insensitively; browsers send them lower-case.
    o = absl::AsciiStrToLower(o);
  }
  return CorsPolicy(std::move(origins));
}

absl::StatusOr<CorsPolicy> CorsPolicy::Parse(absl::string_view list) {
  std::vector<std::string> origins;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    origins.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return Create(std::move(origins));
}

bool CorsPolicy::Allows(absl::string_view origin) const {
  for (const std::string& o : origins_) {
    if (absl::EqualsIgnoreCase(o, origin)) return true;
  }
  return false;
}

void CorsPolicy::AddResponseHeaders(std::optional<absl::string_view> origin,
                                    HeaderList* out) const {
  if (!enabled()) return;
  // The answer depends on Origin: caches must keep one per origin.
  out->emplace_back("vary", "Origin");
  if (!origin.has_value() || !Allows(*origin)) return;
  out->emplace_back("access-control-allow-origin", std::string(*origin));
  out->emplace_back("access-control-expose-headers", std::string(kExposeHeaders));
}

CorsPolicy::Answer CorsPolicy::Preflight(absl::string_view origin,
                                         absl::string_view request_method) const {
  Answer answer;
  answer.headers.emplace_back("vary", "Origin, Access-Control-Request-Method, "
                                      "Access-Control-Request-Headers");
  const bool method_ok = request_method == "POST" || request_method == "GET";
  if (!Allows(origin) || !method_ok) {
    answer.status = 403;
    answer.headers.emplace_back("content-type", "text/plain; charset=utf-8");
    return answer;
  }
  answer.status = 204;
  answer.headers.emplace_back("access-control-allow-origin", std::string(origin));
  answer.headers.emplace_back("access-control-allow-methods", "GET, POST");
  answer.headers.emplace_back("access-control-allow-headers", std::string(kAllowHeaders));
  answer.headers.emplace_back("access-control-max-age", "7200");
  return answer;
}

absl::string_view ConnectContentType(Codec codec) {
  return codec == Codec::kJson ? "application/json" : "application/proto";
}

absl::string_view ConnectCodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return "ok";
    case absl::StatusCode::kCancelled: return "canceled";
    case absl::StatusCode::kUnknown: return "unknown";
    case absl::StatusCode::kInvalidArgument: return "invalid_argument";
    case absl::StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case absl::StatusCode::kNotFound: return "not_found";
    case absl::StatusCode::kAlreadyExists: return "already_exists";
    case absl::StatusCode::kPermissionDenied: return "permission_denied";
    case absl::StatusCode::kResourceExhausted: return "resource_exhausted";
    case absl::StatusCode::kFailedPrecondition: return "failed_precondition";
    case absl::StatusCode::kAborted: return "aborted";
    case absl::StatusCode::kOutOfRange: return "out_of_range";
    case absl::StatusCode::kUnimplemented: return "unimplemented";
    case absl::StatusCode::kInternal: return "internal";
    case absl::StatusCode::kUnavailable: return "unavailable";
    case absl::StatusCode::kDataLoss: return "data_loss";
    case absl::StatusCode::kUnauthenticated: return "unauthenticated";
    default: return "unknown";
  }
}

int ConnectHttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kFailedPrecondition: return 400;
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    default: return 500;
  }
}

namespace {

// The name Connect's error details give a payload: its type URL without the host part.
absl::string_view DetailTypeName(absl::string_view type_url) {
  const size_t slash = type_url.rfind('/');
  return slash == absl::string_view::npos ? type_url : type_url.substr(slash + 1);
}

std::string UnpaddedBase64(absl::string_view bytes) {
  std::string out = absl::Base64Escape(bytes);
  while (!out.empty() && out.back() == '=') out.pop_back();
  return out;
}

// The delay of the google.rpc.RetryInfo payload `status` carries (as service/ops/retry_delay.h
// puts it there), or nullopt: none, or one that does not parse.
std::optional<absl::Duration> RetryInfoDelay(const absl::Status& status) {
  const auto payload = status.GetPayload("type.googleapis.com/google.rpc.RetryInfo");
  if (!payload.has_value()) return std::nullopt;
  google::rpc::RetryInfo info;
  if (!info.ParseFromString(std::string(*payload))) return std::nullopt;
  return absl::Seconds(info.retry_delay().seconds()) +
         absl::Nanoseconds(info.retry_delay().nanos());
}

}  // namespace

std::string GrpcStatusDetailsBin(const absl::Status& status) {
  google::rpc::Status details;
  status.ForEachPayload([&details](absl::string_view type_url, const absl::Cord& payload) {
    google::protobuf::Any* any = details.add_details();
    any->set_type_url(std::string(type_url));
    any->set_value(std::string(payload));
  });
  if (details.details_size() == 0) return std::string();
  details.set_code(static_cast<int32_t>(status.code()));
  details.set_message(std::string(status.message()));
  return UnpaddedBase64(details.SerializeAsString());
}

void AppendGrpcStatusDetails(const absl::Status& status, bool pushback,
                             std::vector<std::pair<std::string, std::string>>* out) {
  std::string details = GrpcStatusDetailsBin(status);
  if (details.empty()) return;
  out->emplace_back("grpc-status-details-bin", std::move(details));
  if (!pushback) return;
  if (const std::optional<absl::Duration> delay = RetryInfoDelay(status)) {
    out->emplace_back("grpc-retry-pushback-ms", absl::StrCat(absl::ToInt64Milliseconds(*delay)));
  }
}

std::optional<std::string> RetryAfterValue(const absl::Status& status) {
  const std::optional<absl::Duration> delay = RetryInfoDelay(status);
  if (!delay.has_value()) return std::nullopt;
  return absl::StrCat(std::max<int64_t>(0, absl::ToInt64Seconds(absl::Ceil(*delay, absl::Seconds(1)))));
}

std::string ConnectErrorJson(const absl::Status& status) {
  nlohmann::json body = {{"code", std::string(ConnectCodeName(status.code()))}};
  if (!status.message().empty()) body["message"] = std::string(status.message());
  status.ForEachPayload([&body](absl::string_view type_url, const absl::Cord& payload) {
    body["details"].push_back({{"type", std::string(DetailTypeName(type_url))},
                               {"value", UnpaddedBase64(std::string(payload))}});
  });
  // Replace invalid UTF-8 rather than throw: messages may quote a caller's bytes.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<absl::Duration> ParseConnectTimeout(absl::string_view value) {
  int64_t ms = 0;
  if (value.size() > 10 || !AllDigits(value) || !absl::SimpleAtoi(value, &ms)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "connect-timeout-ms: expected 1 to 10 digits, got ", Quote(value)));
  }
  return absl::Milliseconds(ms);
}

absl::StatusOr<absl::Duration> ParseGrpcTimeout(absl::string_view value) {
  const absl::string_view digits = value.substr(0, value.empty() ? 0 : value.size() - 1);
  int64_t n = 0;
  if (value.size() < 2 || digits.size() > 8 || !AllDigits(digits) ||
      !absl::SimpleAtoi(digits, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc-timeout: expected 1 to 8 digits and a unit, got ", Quote(value)));
  }
  switch (value.back()) {
    case 'H': return absl::Hours(n);
    case 'M': return absl::Minutes(n);
    case 'S': return absl::Seconds(n);
    case 'm': return absl::Milliseconds(n);
    case 'u': return absl::Microseconds(n);
    case 'n': return absl::Nanoseconds(n);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("grpc-timeout: expected a unit of H, M, S, m, u or n, got ", Quote(value)));
  }
}

absl::Status CheckConnectProtocolVersion(std::optional<absl::string_view> value) {
  if (!value.has_value() || absl::StripAsciiWhitespace(*value) == "1") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("connect-protocol-version: expected \"1\", got ", Quote(*value)));
}

absl::StatusOr<Encoding> ParseEncoding(absl::string_view value) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (lower.empty() || lower == "identity") return Encoding::kIdentity;
  if (lower == "gzip") return Encoding::kGzip;
  return absl::UnimplementedError(
      absl::StrCat("encoding: expected identity or gzip, got ", Quote(value)));
}

absl::string_view EncodingName(Encoding encoding) {
  return encoding == Encoding::kGzip ? "gzip" : "identity";
}

namespace {

// An RFC 9110 qvalue: "0" ["." 0*3DIGIT] or "1" ["." 0*3("0")], in thousandths; -1 if malformed.
int ParseQValue(absl::string_view v) {
  if (v.empty() || v.size() > 5 || (v[0] != '0' && v[0] != '1')) return -1;
  int value = v[0] == '1' ? 1000 : 0;
  if (v.size() == 1) return value;
  if (v[1] != '.') return -1;
  int scale = 100;
  for (char c : v.substr(2)) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return -1;
    value += (c - '0') * scale;
    scale /= 10;
  }
  return value > 1000 ? -1 : value;
}

}  // namespace

Encoding NegotiateEncoding(std::optional<absl::string_view> accept_encoding) {
  if (!accept_encoding.has_value()) return Encoding::kIdentity;
  // q-values in thousandths; -1: not listed. A coding listed twice keeps its lowest weight.
  int gzip = -1, identity = -1, star = -1;
  for (absl::string_view item : absl::StrSplit(*accept_encoding, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    const std::string coding = absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]));
    if (coding.empty()) continue;
    int q = 1000;
    for (size_t i = 1; i < parts.size(); ++i) {
      const absl::string_view param = absl::StripAsciiWhitespace(parts[i]);
      const size_t eq = param.find('=');
      if (eq == absl::string_view::npos) continue;
      if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(param.substr(0, eq)), "q")) continue;
      q = ParseQValue(absl::StripAsciiWhitespace(param.substr(eq + 1)));
    }
    if (q < 0) continue;  // a malformed weight: the entry is ignored
    int* slot = nullptr;
    if (coding == "gzip" || coding == "x-gzip") slot = &gzip;
    else if (coding == "identity") slot = &identity;
    else if (coding == "*") slot = &star;
    if (slot != nullptr) *slot = *slot < 0 ? q : std::min(*slot, q);
  }
  // "*" stands for every coding not listed by name, identity included; an identity neither
  // listed nor covered by "*" is acceptable but preferred last.
  const int gzip_q = gzip >= 0 ? gzip : std::max(star, 0);
  const int identity_q = identity >= 0 ? identity : std::max(star, 0);
  return gzip_q > 0 && gzip_q >= identity_q ? Encoding::kGzip : Encoding::kIdentity;
}

namespace {

// One deflate stream per thread and level, reset per call: deflateInit2 allocates ~270 KB and
// clears a 64 KB hash table, which would otherwise be paid (and the pages faulted) per response.
class ThreadDeflater {
 public:
  ~ThreadDeflater() {
    if (level_ != 0) deflateEnd(&z_);
  }
  z_stream* Get(int level) {
    if (level_ == level) {
      if (deflateReset(&z_) == Z_OK) return &z_;
      deflateEnd(&z_);
      level_ = 0;
    } else if (level_ != 0) {
      deflateEnd(&z_);
      level_ = 0;
    }
    z_ = z_stream{};
    // windowBits 15 + 16: a gzip header and trailer rather than zlib's.
    if (deflateInit2(&z_, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      return nullptr;
    }
    level_ = level;
    return &z_;
  }

 private:
  z_stream z_{};
  int level_ = 0;  // 0: no stream
};

thread_local ThreadDeflater deflater;

}  // namespace

absl::StatusOr<std::string> Gzip(absl::string_view data, int level) {
  if (level < 1 || level > 9) {
    return absl::InvalidArgumentError(absl::StrCat("gzip: expected a level of 1 to 9, got ", level));
  }
  if (data.size() > std::numeric_limits<uInt>::max() / 2) {
    return absl::InvalidArgumentError("gzip: input too large");
  }
  z_stream* z = deflater.Get(level);
  if (z == nullptr) return absl::InternalError("gzip: deflateInit2 failed");
  std::string out(deflateBound(z, data.size()), '\0');
  z->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z->avail_in = static_cast<uInt>(data.size());
  z->next_out = reinterpret_cast<Bytef*>(out.data());
  z->avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(z, Z_FINISH);
  out.resize(z->total_out);
  if (rc != Z_STREAM_END) return absl::InternalError("gzip: deflate did not finish");
  return out;
}

namespace {

// A gzip stream's own claim of its size: the last member's ISIZE (length mod 2^32). Untrusted.
size_t GzipSizeClaim(absl::string_view data) {
  if (data.size() < 18) return 0;  // 10-byte header + 8-byte trailer at least
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + data.size() - 4);
  return size_t{p[0]} | (size_t{p[1]} << 8) | (size_t{p[2]} << 16) | (size_t{p[3]} << 24);
}

// Inflates all of `data` (every member), writing the first `dst_size` bytes of output to `dst`
// and only counting the rest (through a scratch buffer on the stack). Stops with
// ResourceExhausted as soon as more than `max_bytes` came out. `*total`: the output's size.
absl::Status Inflate(absl::string_view data, size_t max_bytes, char* dst, size_t dst_size,
                     size_t* total) {
  if (data.size() > std::numeric_limits<uInt>::max()) {
    return absl::InvalidArgumentError("gzip: the compressed message is too large");
  }
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return absl::InternalError("gzip: inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  char scratch[16384];
  size_t out = 0;
  absl::Status status;
  for (;;) {
    char* next;
    size_t room;
    if (out < dst_size) {
      next = dst + out;
      room = std::min<size_t>(dst_size - out, std::numeric_limits<uInt>::max());
    } else {
      next = scratch;
      room = sizeof(scratch);
    }
    z.next_out = reinterpret_cast<Bytef*>(next);
    z.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&z, Z_NO_FLUSH);
    out += room - z.avail_out;
    if (out > max_bytes) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("message: expected at most ", max_bytes, " bytes once decompressed"));
      break;
    }
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      // Another member follows (gzip(1) concatenates them): go on with it.
      if (inflateReset(&z) != Z_OK) {
        status = absl::InternalError("gzip: inflateReset failed");
        break;
      }
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && z.avail_in == 0) {
      status = absl::InvalidArgumentError("gzip: the compressed message is truncated");
    } else if (rc == Z_MEM_ERROR) {
      status = absl::InternalError("gzip: out of memory");
    } else {
      status = absl::InvalidArgumentError("gzip: the compressed message is malformed");
    }
    break;
  }
  inflateEnd(&z);
  *total = out;
  return status;
}

// Output written at once up to the stream's claim when the claim is at most this; beyond it (or
// beyond the claim) the stream is counted first. Bounds what a bomb makes us write.
constexpr size_t kEagerGunzipBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::string> Gunzip(absl::string_view data, size_t max_bytes) {
  // One pass for an honest stream of up to 1 MiB: a buffer of the claimed size.
  std::string out(std::min({GzipSizeClaim(data), max_bytes, kEagerGunzipBytes}), '\0');
  size_t total = 0;
  if (absl::Status s = Inflate(data, max_bytes, out.data(), out.size(), &total); !s.ok()) {
    return s;
  }
  if (total <= out.size()) {
    out.resize(total);
    return out;
  }
  // It came out larger than claimed, and at most `max_bytes` (counted, not kept): now into a
  // buffer of exactly that size.
  std::string().swap(out);
  std::string exact(total, '\0');
  size_t again = 0;
  if (absl::Status s = Inflate(data, max_bytes, exact.data(), exact.size(), &again); !s.ok()) {
    return s;
  }
  if (again != total) return absl::InternalError("gzip: the second pass differs");
  return exact;
}

double SampledEntropyBits(absl::string_view data) {
  if (data.empty()) return 0;
  constexpr size_t kSlices = 8, kSlice = 512;
  uint32_t counts[4][256] = {};  // four tables: consecutive bytes do not wait on one counter
  size_t n = 0;
  const auto add = [&](absl::string_view piece) {
    const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
    size_t i = 0;
    for (; i + 4 <= piece.size(); i += 4) {
      ++counts[0][p[i]];
      ++counts[1][p[i + 1]];
      ++counts[2][p[i + 2]];
      ++counts[3][p[i + 3]];
    }
    for (; i < piece.size(); ++i) ++counts[0][p[i]];
    n += piece.size();
  };
  if (data.size() <= kSlices * kSlice) {
    add(data);
  } else {
    const size_t step = (data.size() - kSlice) / (kSlices - 1);
    for (size_t k = 0; k < kSlices; ++k) add(data.substr(k * step, kSlice));
  }
  double sum = 0;  // sum of c * log2(c)
  for (int b = 0; b < 256; ++b) {
    const uint32_t c = counts[0][b] + counts[1][b] + counts[2][b] + counts[3][b];
    if (c > 1) sum += c * std::log2(static_cast<double>(c));
  }
  return std::log2(static_cast<double>(n)) - sum / static_cast<double>(n);
}

std::string EncodeFrameHeader(uint8_t flags, size_t payload_size) {
  std::string out;
  const uint32_t n = static_cast<uint32_t>(payload_size);
  out.push_back(static_cast<char>(flags));
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  return out;
}

std::string EncodeFrame(uint8_t flags, absl::string_view payload) {
  std::string out = EncodeFrameHeader(flags, payload.size());
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<absl::string_view> ParseUnaryRequestFrame(absl::string_view body,
                                                         bool* compressed, absl::string_view what) {
  if (body.size() < kFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected a 5-byte frame header, got ", body.size(), " bytes"));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(body.data());
  const uint8_t flags = p[0];
  const uint64_t length = (uint64_t{p[1]} << 24) | (uint64_t{p[2]} << 16) |
                          (uint64_t{p[3]} << 8) | uint64_t{p[4]};
  if ((flags & ~kFrameCompressed) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected a data frame (flags 0 or 1), got flags ", int{flags}));
  }
  const uint64_t have = body.size() - kFrameHeaderBytes;
  if (have != length) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected one frame of ", length, " bytes, got ", have,
        have < length ? " (truncated)" : " (trailing data)"));
  }
  *compressed = (flags & kFrameCompressed) != 0;
  return body.substr(kFrameHeaderBytes);
}

absl::Status FrameReader::Feed(
    absl::string_view data,
    const std::function<absl::Status(bool compressed, absl::string_view message)>& fn) {
  if (!error_.ok()) return error_;
  while (!data.empty()) {
    // The header first (5 bytes, perhaps in pieces), then the message.
    if (buffer_.size() < kFrameHeaderBytes) {
      const size_t take = std::min(kFrameHeaderBytes - buffer_.size(), data.size());
      buffer_.append(data.data(), take);
      data.remove_prefix(take);
      if (buffer_.size() < kFrameHeaderBytes) break;
      const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data());
      const uint64_t length = (uint64_t{p[1]} << 24) | (uint64_t{p[2]} << 16) |
                              (uint64_t{p[3]} << 8) | uint64_t{p[4]};
      if ((p[0] & ~kFrameCompressed) != 0) {
        error_ = absl::InvalidArgumentError(absl::StrCat(
            "grpc request: expected a message frame (flags 0 or 1), got flags ", int{p[0]}));
        return error_;
      }
      if (length > max_) {
        error_ = absl::ResourceExhaustedError(absl::StrCat(
            "grpc request: a message of ", length, " bytes, expected at most ", max_));
        return error_;
      }
      // No reserve from the declared length: the buffer grows with the bytes that came.
    }
    const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data());
    const size_t length = (size_t{p[1]} << 24) | (size_t{p[2]} << 16) | (size_t{p[3]} << 8) |
                          size_t{p[4]};
    const size_t take = std::min(kFrameHeaderBytes + length - buffer_.size(), data.size());
    buffer_.append(data.data(), take);
    data.remove_prefix(take);
    if (buffer_.size() < kFrameHeaderBytes + length) break;
    // `p` may have moved as the buffer grew: read the flag afresh.
    const bool compressed = (static_cast<unsigned char>(buffer_[0]) & kFrameCompressed) != 0;
    std::string message = std::move(buffer_);
    buffer_.clear();
    if (absl::Status s = fn(compressed, absl::string_view(message).substr(kFrameHeaderBytes));
        !s.ok()) {
      error_ = s;
      return error_;
    }
  }
  return absl::OkStatus();
}

std::string PercentEncode(absl::string_view message) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : message) {
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

std::string GrpcWebTrailers(const absl::Status& status) {
  std::string out = absl::StrCat("grpc-status: ", static_cast<int>(status.code()), "\r\n");
  if (!status.message().empty()) {
    absl::StrAppend(&out, "grpc-message: ", PercentEncode(status.message()), "\r\n");
  }
  const std::string details = GrpcStatusDetailsBin(status);
  if (!details.empty()) absl::StrAppend(&out, "grpc-status-details-bin: ", details, "\r\n");
  return out;
}

}  // namespace offload::http
