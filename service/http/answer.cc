#include "service/http/answer.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "service/http/connect.h"
#include "service/http/grpc.h"
#include "service/http/stream.h"

namespace offload::http {

Answer PlainText(int status, absl::string_view text, HeaderList headers) {
  headers.emplace_back("content-type", "text/plain; charset=utf-8");
  Answer out;
  out.status = status;
  out.headers = std::move(headers);
  out.body = std::string(text);
  return out;
}

void SetSharedBody(absl::string_view body, std::string tail, std::shared_ptr<const void> owner,
                   Answer* out) {
  struct Owned {
    std::shared_ptr<const void> body_owner;
    std::string tail;
  };
  auto owned = std::make_shared<Owned>();
  owned->body_owner = std::move(owner);
  owned->tail = std::move(tail);
  out->shared_body = {body, owned->tail};
  out->owner = std::move(owned);
}

Answer UnarySharedSuccess(const ContentType& type, std::string head, absl::string_view body,
                          std::string tail, std::shared_ptr<const void> owner) {
  if (type.protocol == Protocol::kConnect) {
    return ConnectSharedSuccess(type.codec, std::move(head), body, std::move(tail),
                                std::move(owner));
  }
  return GrpcSharedSuccess(type, std::move(head), body, std::move(tail), std::move(owner));
}

Answer UnarySuccess(const ContentType& type, std::string message, bool gzip,
                    const std::optional<CacheHint>& get) {
  if (type.protocol == Protocol::kConnect) return ConnectSuccess(type.codec, std::move(message), gzip, get);
  return GrpcSuccess(type, std::move(message), gzip);
}

Answer UnaryError(const ContentType& type, const absl::Status& status, int http_status,
                  bool get) {
  if (type.protocol == Protocol::kConnect) return ConnectError(status, http_status, get);
  return GrpcError(type, status, http_status);
}

Answer UnknownMethod(absl::string_view path, absl::string_view content_type, bool http2) {
  const bool grpc = IsGrpcContentType(content_type);
  if (grpc && !http2) return PlainText(505, "gRPC requires HTTP/2\n");
  const absl::Status unknown =
      absl::UnimplementedError(absl::StrCat("unknown method ", path.substr(0, 128)));
  // gRPC's answer to a method we do not have: UNIMPLEMENTED, Trailers-Only.
  if (grpc) return GrpcTrailersOnly(unknown, "application/grpc");
  // An RPC to a method we do not have: Connect's 404, with its error body.
  Answer out;
  out.status = 404;
  out.headers = {{"content-type", "application/json"}};
  out.body = ConnectErrorJson(unknown);
  return out;
}

Answer ReflectionNotAStream(std::optional<absl::string_view> content_type, bool http2) {
  const bool grpc = IsGrpcContentType(content_type.value_or(""));
  if (grpc && !http2) return PlainText(505, "gRPC requires HTTP/2\n");
  const absl::Status unimplemented = absl::UnimplementedError(
      "server reflection is a bidirectional stream: a POST over HTTP/2 of application/grpc, "
      "application/grpc-web+proto or application/connect+proto");
  if (grpc) return GrpcTrailersOnly(unimplemented, "application/grpc");
  if (const std::optional<StreamWire> wire = StreamWireOf(content_type)) {
    return StreamRefusal(*wire, unimplemented);
  }
  if (content_type.has_value() && absl::StartsWithIgnoreCase(*content_type, "application/grpc-web")) {
    return GrpcTrailersOnly(unimplemented, "application/grpc-web+proto");
  }
  Answer out;
  out.status = 415;
  out.headers = {{"content-type", "application/json"}};
  out.body = ConnectErrorJson(unimplemented);
  return out;
}

}  // namespace offload::http
