#include "service/http/grpc.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/common/secret_bytes.h"

namespace offload::http {

HeaderList GrpcTrailers(const absl::Status& status) {
  HeaderList trailers = {{"grpc-status", absl::StrCat(static_cast<int>(status.code()))}};
  if (!status.message().empty()) {
    trailers.emplace_back("grpc-message", PercentEncode(status.message()));
  }
  AppendGrpcStatusDetails(status, /*pushback=*/true, &trailers);
  return trailers;
}

Answer TrailersOnly(const absl::Status& status, absl::string_view content_type) {
  Answer out;
  out.status = 200;
  out.headers = {{"content-type", std::string(content_type)}};
  for (auto& h : GrpcTrailers(status)) out.headers.push_back(std::move(h));
  return out;
}

Answer GrpcTrailersOnly(const absl::Status& status, absl::string_view content_type) {
  Answer out = TrailersOnly(status, content_type);
  out.headers.emplace_back("grpc-accept-encoding", std::string(kGrpcAcceptEncoding));
  return out;
}

Answer GrpcSuccess(const ContentType& type, std::string message, bool gzip) {
  Answer out;
  out.headers.reserve(4);
  if (type.protocol == Protocol::kGrpc) {
    // HEADERS, one DATA frame with the message (compressed: its flag and grpc-encoding say
    // so), trailers with the status.
    out.headers.emplace_back("content-type", std::string(GrpcContentType(type)));
    if (gzip) out.headers.emplace_back("grpc-encoding", "gzip");
    out.headers.emplace_back("grpc-accept-encoding", std::string(kGrpcAcceptEncoding));
    if (message.size() > kCopyAtMost) {
      // A large message is sent from where it lies, after its frame header (no copy).
      out.body = EncodeFrameHeader(gzip ? kFrameCompressed : 0, message.size());
      auto owned = std::make_shared<const std::string>(std::move(message));
      out.shared_body = {*owned};
      out.owner = std::move(owned);
    } else {
      out.body = EncodeFrame(gzip ? kFrameCompressed : 0, message);
      WipeString(&message);  // copied: a secret's copy is the answer's only (Answer::secret)
    }
    out.trailers = GrpcTrailers(absl::OkStatus());
    return out;
  }
  // gRPC-Web: the message frame's flag and grpc-encoding say it is compressed; trailers never
  // are.
  std::string body = EncodeFrame(gzip ? kFrameCompressed : 0, message);
  WipeString(&message);  // the copies a step leaves behind are zeroed (a secret's, Answer::secret)
  body += EncodeFrame(kFrameTrailer, GrpcWebTrailers(absl::OkStatus()));
  out.headers.emplace_back("content-type", std::string(GrpcWebContentType(type)));
  if (gzip) out.headers.emplace_back("grpc-encoding", "gzip");
  if (type.text) {
    out.body = EncodeGrpcWebText(body);
    WipeString(&body);
  } else {
    out.body = std::move(body);
  }
  return out;
}

Answer GrpcSharedSuccess(const ContentType& type, std::string head, absl::string_view body,
                         std::string tail, std::shared_ptr<const void> owner) {
  Answer out;
  std::string frame = EncodeFrameHeader(0, head.size() + body.size() + tail.size());
  if (type.protocol == Protocol::kGrpc) {
    out.headers.emplace_back("content-type", std::string(GrpcContentType(type)));
    out.headers.emplace_back("grpc-accept-encoding", std::string(kGrpcAcceptEncoding));
    out.trailers = GrpcTrailers(absl::OkStatus());
  } else {
    out.headers.emplace_back("content-type", std::string(GrpcWebContentType(type)));
    tail += EncodeFrame(kFrameTrailer, GrpcWebTrailers(absl::OkStatus()));
  }
  frame += head;
  out.body = std::move(frame);
  SetSharedBody(body, std::move(tail), std::move(owner), &out);
  return out;
}

Answer GrpcError(const ContentType& type, const absl::Status& status, int http_status) {
  if (type.protocol == Protocol::kGrpc) {
    // An answer below gRPC (HTTP/1.1): plain HTTP. Else Trailers-Only: one HEADERS frame with
    // the status and END_STREAM.
    if (http_status != 0) return PlainText(http_status, absl::StrCat(status.message(), "\n"));
    return GrpcTrailersOnly(status, GrpcContentType(type));
  }
  // gRPC-Web "trailers-only": HTTP 200, the status in the headers, no body.
  return TrailersOnly(status, GrpcWebContentType(type));
}

}  // namespace offload::http
