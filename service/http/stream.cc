#include "service/http/stream.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "service/common/status_macros.h"
#include "service/http/connect.h"
#include "service/http/grpc.h"

namespace offload::http {

std::optional<StreamWire> StreamWireOf(std::optional<absl::string_view> content_type) {
  if (!content_type.has_value()) return std::nullopt;
  const absl::string_view media =
      absl::StripAsciiWhitespace(content_type->substr(0, content_type->find(';')));
  if (absl::EqualsIgnoreCase(media, "application/connect+proto")) return StreamWire::kConnect;
  const absl::StatusOr<ContentType> type = ParseContentType(media);
  if (!type.ok() || type->codec != Codec::kProto || type->text) return std::nullopt;
  if (type->protocol == Protocol::kGrpc) return StreamWire::kGrpc;
  if (type->protocol == Protocol::kGrpcWeb) return StreamWire::kGrpcWeb;
  return std::nullopt;
}

HeaderList StreamHeaders(StreamWire wire) {
  switch (wire) {
    case StreamWire::kGrpc:
      return {{"content-type", "application/grpc"},
              {"grpc-accept-encoding", std::string(kGrpcAcceptEncoding)}};
    case StreamWire::kGrpcWeb:
      return {{"content-type", "application/grpc-web+proto"},
              {"grpc-accept-encoding", std::string(kGrpcAcceptEncoding)}};
    case StreamWire::kConnect:
      return {{"content-type", "application/connect+proto"},
              {"connect-accept-encoding", "gzip"}};
  }
  return {};
}

absl::StatusOr<Encoding> StreamEncoding(StreamWire wire, HeaderLookup header) {
  if (wire == StreamWire::kConnect) {
    return ParseEncoding(header("connect-content-encoding").value_or(""));
  }
  OFFLOAD_ASSIGN_OR_RETURN(CallOptions options, ParseCallHeaders(Protocol::kGrpc, header));
  return options.encoding;
}

StreamEnd EndOfStream(StreamWire wire, const absl::Status& status) {
  switch (wire) {
    case StreamWire::kGrpc:
      return {GrpcTrailers(status), std::nullopt};
    case StreamWire::kGrpcWeb:
      return {{}, EncodeFrame(kFrameTrailer, GrpcWebTrailers(status))};
    case StreamWire::kConnect:
      return {{}, EncodeFrame(kConnectEndStream, ConnectEndStreamJson(status))};
  }
  return {GrpcTrailers(status), std::nullopt};
}

Answer StreamRefusal(StreamWire wire, const absl::Status& status) {
  switch (wire) {
    case StreamWire::kGrpc:
      return GrpcTrailersOnly(status, "application/grpc");
    case StreamWire::kGrpcWeb:
      return GrpcTrailersOnly(status, "application/grpc-web+proto");
    case StreamWire::kConnect: {
      Answer out;
      out.status = 200;
      out.headers = StreamHeaders(wire);
      out.body = EncodeFrame(kConnectEndStream, ConnectEndStreamJson(status));
      return out;
    }
  }
  return GrpcTrailersOnly(status, "application/grpc");
}

}  // namespace offload::http
