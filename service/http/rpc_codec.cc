#include "service/http/rpc_codec.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/util/json_util.h"
#include "service/common/secret_bytes.h"
#include "service/http/answer.h"

namespace offload::http {
namespace {

// Whether `path` ("a.b[2].c", as protobuf's JSON parser names where it stopped) names fields of
// `type`, by proto or JSON name: only then is it the schema's text rather than the caller's.
bool IsFieldPath(absl::string_view path, const google::protobuf::Descriptor* type) {
  if (path.empty() || path.size() > 256) return false;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (type == nullptr) return false;  // a name below a field that is not a message
    if (const size_t bracket = part.find('['); bracket != absl::string_view::npos) {
      absl::string_view index = part.substr(bracket);
      if (!absl::ConsumePrefix(&index, "[") || !absl::ConsumeSuffix(&index, "]") ||
          index.empty() || !std::all_of(index.begin(), index.end(), absl::ascii_isdigit)) {
        return false;
      }
      part = part.substr(0, bracket);
    }
    const std::string name(part);
    const google::protobuf::FieldDescriptor* field = type->FindFieldByName(name);
    for (int i = 0; field == nullptr && i < type->field_count(); ++i) {
      if (type->field(i)->json_name() == name) field = type->field(i);
    }
    if (field == nullptr) return false;
    type = field->message_type();
  }
  return true;
}

// Whether `text` is the parser's own wording ("Unexpected token.", "Cannot find field."):
// letters, spaces and punctuation, no quotes or digits, so no value of the caller's.
bool IsParserText(absl::string_view text) {
  if (text.empty() || text.size() > 120) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isalpha(static_cast<unsigned char>(c)) ||
           absl::string_view(" ,.:;{}[]_-").find(c) != absl::string_view::npos;
  });
}

// The JSON parser's error without anything the caller sent but the schema's names: its messages
// quote the offending value ("(secret): invalid value \"<an ImportKey's private key>\"") or a
// snippet of the input, and the message goes to the caller, the log and the audit log.
std::string DescribeJsonError(absl::string_view message, const google::protobuf::Descriptor* type) {
  // An unknown field: its name is the caller's text (it may hold ": " or a newline itself).
  if (absl::EndsWith(message, ": Cannot find field.")) return "a field the message does not have";
  const absl::string_view first = message.substr(0, message.find('\n'));
  if (first.size() != message.size()) {
    // The stream parser's errors: its wording, then a snippet of the input and a caret.
    return IsParserText(first) ? std::string(first) : "not well-formed";
  }
  absl::string_view path, rest;
  if (absl::StartsWith(first, "(") && first.find("): ") != absl::string_view::npos) {
    const size_t end = first.find("): ");
    path = first.substr(1, end - 1);
    rest = first.substr(end + 3);
  } else if (const size_t colon = first.find(": "); colon != absl::string_view::npos) {
    path = first.substr(0, colon);
    rest = first.substr(colon + 2);
  } else {
    return IsParserText(first) ? std::string(first) : "not well-formed";
  }
  std::string what = "invalid value";
  if (absl::StartsWith(rest, "invalid value")) {
    // "... for type T": T is the schema's (the value comes before it).
    const size_t at = rest.rfind(" for type ");
    const absl::string_view t =
        at == absl::string_view::npos ? absl::string_view() : rest.substr(at + 10);
    if (!t.empty() && t.size() <= 128 &&
        std::all_of(t.begin(), t.end(), [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                 absl::string_view("_./").find(c) != absl::string_view::npos;
        })) {
      absl::StrAppend(&what, " for type ", t);
    }
  } else if (IsParserText(rest)) {
    what = std::string(rest);
  }
  return IsFieldPath(path, type) ? absl::StrCat(path, ": ", what) : what;
}

absl::Status FromProtobuf(const google::protobuf::util::Status& s,
                          const google::protobuf::Descriptor* type) {
  if (s.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "request: invalid JSON: ",
      DescribeJsonError(absl::string_view(s.message().data(), s.message().size()), type)));
}

}  // namespace

absl::StatusOr<CallOptions> ParseCallHeaders(Protocol protocol, HeaderLookup header) {
  CallOptions options;
  if (protocol == Protocol::kConnect) {
    if (absl::Status s = CheckConnectProtocolVersion(header("connect-protocol-version")); !s.ok()) {
      return s;
    }
    if (auto t = header("connect-timeout-ms")) {
      absl::StatusOr<absl::Duration> timeout = ParseConnectTimeout(*t);
      if (!timeout.ok()) return timeout.status();
      options.timeout = *timeout;
    }
    absl::StatusOr<Encoding> e = ParseEncoding(header("content-encoding").value_or(""));
    if (!e.ok()) return e.status();
    options.encoding = *e;
    options.accept = NegotiateEncoding(header("accept-encoding"));
  } else {
    if (auto t = header("grpc-timeout")) {
      absl::StatusOr<absl::Duration> timeout = ParseGrpcTimeout(*t);
      if (!timeout.ok()) return timeout.status();
      options.timeout = *timeout;
    }
    absl::StatusOr<Encoding> e = ParseEncoding(header("grpc-encoding").value_or(""));
    if (!e.ok()) return e.status();
    options.encoding = *e;
    options.accept = NegotiateEncoding(header("grpc-accept-encoding"));
  }
  return options;
}

int64_t MaxBody(int64_t max_message_bytes) {
  return ((max_message_bytes + int64_t{kFrameHeaderBytes} + 2) / 3) * 4 + 4096;
}

int64_t UnaryBodyLimit(const ContentType& type, int64_t max_message_bytes) {
  if (type.text) return MaxBody(max_message_bytes);
  return type.protocol == Protocol::kConnect ? max_message_bytes
                                             : max_message_bytes + int64_t{kFrameHeaderBytes};
}

UnaryPost ReadUnaryPost(std::optional<absl::string_view> content_type, bool http2,
                        HeaderLookup header, size_t body_size, bool body_too_large,
                        int64_t max_message_bytes) {
  UnaryPost post;
  absl::StatusOr<ContentType> type = ParseContentType(content_type.value_or(""));
  if (!type.ok() && IsGrpcContentType(content_type.value_or(""))) {
    // gRPC with a codec we lack: gRPC's own answer.
    post.type = ContentType{Protocol::kGrpc, Codec::kProto, false};
    if (!http2) {
      post.refusal = absl::UnimplementedError("gRPC requires HTTP/2");
      post.http_status = 505;
      return post;
    }
    post.refusal = absl::UnimplementedError(type.status().message());
    return post;
  }
  if (!type.ok()) {
    // Neither protocol: Connect says 415, and tells what it accepts.
    post.refusal = absl::UnimplementedError(type.status().message());
    post.http_status = 415;
    post.headers = {{"accept-post", std::string(kAcceptPost)}};
    return post;
  }
  post.type = *type;
  if (post.type.protocol == Protocol::kGrpc && !http2) {
    // gRPC is HTTP/2 only (PROTOCOL-HTTP2.md); grpc-go and connect-go answer 505 as well.
    post.refusal = absl::UnimplementedError("gRPC requires HTTP/2");
    post.http_status = 505;
    return post;
  }
  absl::StatusOr<CallOptions> options = ParseCallHeaders(post.type.protocol, header);
  if (!options.ok()) {
    post.refusal = options.status();
    return post;
  }
  post.options = *options;
  const int64_t limit = UnaryBodyLimit(post.type, max_message_bytes);
  post.body_limit = limit;
  if (body_too_large) {
    // Past what this protocol carries: the HTTP server never read it (Handler::BodyLimit), the
    // caller gets its protocol's own error (Connect 429 resource_exhausted, gRPC and gRPC-Web
    // grpc-status 8).
    post.refusal = absl::ResourceExhaustedError(
        absl::StrCat("request body: expected at most ", limit, " bytes, got more"));
    return post;
  }
  if (static_cast<int64_t>(body_size) > limit) {
    post.refusal = absl::ResourceExhaustedError(
        absl::StrCat("request body: expected at most ", limit, " bytes, got ", body_size));
  }
  return post;
}

ConnectGet ReadConnectGet(absl::string_view query, HeaderLookup header,
                          int64_t max_message_bytes) {
  ConnectGet get;
  get.type = ContentType{Protocol::kConnect, Codec::kProto, false};
  absl::StatusOr<ConnectGetQuery> parsed =
      ParseConnectGetQuery(query, static_cast<size_t>(max_message_bytes));
  if (!parsed.ok()) {
    get.refusal = parsed.status();
    return get;
  }
  get.type.codec = parsed->codec;
  if (absl::Status s = CheckConnectProtocolVersion(header("connect-protocol-version")); !s.ok()) {
    get.refusal = s;
    return get;
  }
  if (auto t = header("connect-timeout-ms")) {
    absl::StatusOr<absl::Duration> timeout = ParseConnectTimeout(*t);
    if (!timeout.ok()) {
      get.refusal = timeout.status();
      return get;
    }
    get.options.timeout = *timeout;
  }
  get.options.accept = NegotiateEncoding(header("accept-encoding"));
  get.options.encoding = parsed->compression;
  get.message = std::move(parsed->message);
  return get;
}

namespace {

// A whole message, gzip'd when `compressed` (at most `max_message_bytes` of output), into
// `request`: binary protobuf or JSON.
absl::Status ParseMessage(Codec codec, bool compressed, absl::string_view message,
                          int64_t max_message_bytes, google::protobuf::Message* request) {
  std::string decompressed;
  if (compressed) {
    absl::StatusOr<std::string> plain = Gunzip(message, static_cast<size_t>(max_message_bytes));
    if (!plain.ok()) return plain.status();
    decompressed = *std::move(plain);
    message = decompressed;
  }
  if (codec == Codec::kJson) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    const absl::string_view json = message.empty() ? absl::string_view("{}") : message;
    return FromProtobuf(google::protobuf::util::JsonStringToMessage(
                            google::protobuf::StringPiece(json.data(), json.size()), request,
                            options),
                        request->GetDescriptor());
  }
  if (!request->ParseFromArray(message.data(), static_cast<int>(message.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("request: cannot parse ", message.size(),
                                                   " bytes as ",
                                                   request->GetDescriptor()->full_name()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeMessage(ContentType type, Encoding encoding, bool compressed,
                           absl::string_view message, int64_t max_message_bytes,
                           google::protobuf::Message* request) {
  if (compressed && encoding != Encoding::kGzip) {
    return absl::InternalError(absl::StrCat(
        type.protocol == Protocol::kGrpc ? "grpc request" : "grpc-web request",
        ": compressed frame without grpc-encoding"));
  }
  return ParseMessage(type.codec, compressed, message, max_message_bytes, request);
}

absl::Status DecodeRequest(ContentType type, Encoding encoding, absl::string_view body,
                           int64_t max_message_bytes, google::protobuf::Message* request) {
  bool compressed = false;
  std::string unbased;  // gRPC-Web text: the base64 body, decoded
  if (type.protocol == Protocol::kGrpcWeb && type.text) {
    absl::StatusOr<std::string> bytes = DecodeGrpcWebText(body);
    if (!bytes.ok()) return bytes.status();
    unbased = *std::move(bytes);
    body = unbased;
  }
  if (type.protocol == Protocol::kConnect) {
    return ParseMessage(type.codec, encoding == Encoding::kGzip, body, max_message_bytes, request);
  }
  absl::StatusOr<absl::string_view> frame = ParseUnaryRequestFrame(
      body, &compressed, type.protocol == Protocol::kGrpc ? "grpc request" : "grpc-web request");
  if (!frame.ok()) return frame.status();
  return DecodeMessage(type, encoding, compressed, *frame, max_message_bytes, request);
}

namespace {

// A varint of at most `max_bytes` bytes at `*p` (before `end`) into `*value`; false if it runs
// past `end` or `max_bytes`, or overflows 64 bits.
bool ReadVarint(const uint8_t** p, const uint8_t* end, int max_bytes, uint64_t* value) {
  uint64_t v = 0;
  for (int i = 0; i < max_bytes && *p < end; ++i) {
    const uint8_t b = *(*p)++;
    if (i == 9 && b > 1) return false;  // past 64 bits
    v |= uint64_t{static_cast<uint8_t>(b & 0x7f)} << (7 * i);
    if ((b & 0x80) == 0) {
      *value = v;
      return true;
    }
  }
  return false;
}

}  // namespace

bool ParseBytesFieldsInPlace(absl::string_view message, const google::protobuf::Descriptor& type,
                             absl::Span<absl::string_view> fields) {
  using google::protobuf::FieldDescriptor;
  // Only types whose every field is a singular string or bytes, numbered within `fields`.
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor* f = type.field(i);
    if (f->is_repeated() || f->number() < 1 || static_cast<size_t>(f->number()) > fields.size() ||
        (f->type() != FieldDescriptor::TYPE_STRING && f->type() != FieldDescriptor::TYPE_BYTES)) {
      return false;
    }
  }
  if (message.size() > static_cast<size_t>(INT32_MAX)) return false;
  for (absl::string_view& f : fields) f = absl::string_view();
  const auto* p = reinterpret_cast<const uint8_t*>(message.data());
  const uint8_t* const end = p + message.size();
  while (p < end) {
    uint64_t tag = 0;
    if (!ReadVarint(&p, end, 5, &tag) || tag > UINT32_MAX) return false;
    const uint64_t number = tag >> 3;
    if (number == 0) return false;
    switch (tag & 7) {
      case 0: {  // varint: an unknown field (every known one is length-delimited)
        uint64_t ignored = 0;
        if (!ReadVarint(&p, end, 10, &ignored)) return false;
        break;
      }
      case 1:  // fixed64
        if (end - p < 8) return false;
        p += 8;
        break;
      case 5:  // fixed32
        if (end - p < 4) return false;
        p += 4;
        break;
      case 2: {  // length-delimited
        uint64_t size = 0;
        if (!ReadVarint(&p, end, 5, &size) || size > INT32_MAX ||
            size > static_cast<uint64_t>(end - p)) {
          return false;
        }
        const absl::string_view bytes(reinterpret_cast<const char*>(p), size);
        p += size;
        const FieldDescriptor* f =
            number <= fields.size() ? type.FindFieldByNumber(static_cast<int>(number)) : nullptr;
        if (f == nullptr) break;  // an unknown field: skipped, as protobuf keeps it aside
        if (f->type() == FieldDescriptor::TYPE_STRING &&
            !google::protobuf::internal::IsStructurallyValidUTF8(bytes.data(),
                                                                 static_cast<int>(bytes.size()))) {
          return false;  // proto3 refuses such a string
        }
        fields[number - 1] = bytes;
        break;
      }
      default:  // groups (3, 4) and the invalid wire types 6 and 7: left to protobuf
        return false;
    }
  }
  return true;
}

std::optional<absl::string_view> UncompressedProtoMessage(ContentType type, Encoding encoding,
                                                          absl::string_view body) {
  if (type.codec != Codec::kProto || type.text || encoding != Encoding::kIdentity) {
    return std::nullopt;
  }
  if (type.protocol == Protocol::kConnect) return body;
  bool compressed = false;
  absl::StatusOr<absl::string_view> frame = ParseUnaryRequestFrame(body, &compressed);
  if (!frame.ok() || compressed) return std::nullopt;
  return *frame;
}

absl::Status EncodeResponse(Codec codec, const google::protobuf::Message& response,
                            int64_t max_message_bytes, std::string* out) {
  out->clear();
  if (codec == Codec::kJson) {
    google::protobuf::util::JsonPrintOptions options;
    const auto s = google::protobuf::util::MessageToJsonString(response, out, options);
    if (!s.ok()) return absl::InternalError("response: cannot encode as JSON");
  } else if (!response.SerializeToString(out)) {
    return absl::InternalError("response: cannot serialize");
  }
  if (static_cast<int64_t>(out->size()) > max_message_bytes) {
    out->clear();
    return absl::ResourceExhaustedError(
        absl::StrCat("response: expected at most ", max_message_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::string_view CompressionResultName(CompressionResult result) {
  switch (result) {
    case CompressionResult::kNotAsked: return "not_asked";
    case CompressionResult::kTooSmall: return "too_small";
    case CompressionResult::kIncompressible: return "incompressible";
    case CompressionResult::kNoGain: return "no_gain";
    case CompressionResult::kCompressed: return "compressed";
  }
  return "not_asked";
}

Compression CompressResponse(Encoding accept, const CompressionOptions& options,
                             std::string* message) {
  Compression c;
  if (accept != Encoding::kGzip || options.level == 0) return c;
  if (static_cast<int64_t>(message->size()) < options.min_bytes) {
    c.result = CompressionResult::kTooSmall;
    return c;
  }
  if (SampledEntropyBits(*message) > kMaxCompressibleEntropyBits) {
    c.result = CompressionResult::kIncompressible;
    return c;
  }
  absl::StatusOr<std::string> zipped = Gzip(*message, options.level);
  if (!zipped.ok() || zipped->size() > message->size() - message->size() / 16) {
    c.result = CompressionResult::kNoGain;
    return c;
  }
  WipeString(message);  // what it replaces may be a secret (Answer::secret)
  *message = *std::move(zipped);
  c.encoding = Encoding::kGzip;
  c.result = CompressionResult::kCompressed;
  return c;
}

}  // namespace offload::http
