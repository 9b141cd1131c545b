// The engine's exchange as a call::Call: the request read with the protocol mappings of
// service/http, the answer made and written in the protocol of the request.
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "service/call/call.h"
#include "service/common/secret_bytes.h"
#include "service/common/status_macros.h"
#include "service/gateway/internal/refusals.h"
#include "service/gateway/internal/shared.h"
#include "service/http/answer.h"
#include "service/http/connect.h"
#include "service/http/rpc_codec.h"
#include "service/httpd/server.h"

namespace offload::gateway {
namespace {

using http::Encoding;

class HttpCall final : public call::Call {
 public:
  // `shared` keeps the context alive (an aliasing pointer into it).
  HttpCall(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange,
           const api::Method* method)
      : call::Call(std::shared_ptr<const call::Context>(shared, &shared->call), method),
        shared_(shared.get()),
        exchange_(std::move(exchange)) {}

  // A POST (Connect, gRPC-Web binary or text, gRPC).
  void StartPost() {
    http::UnaryPost post = http::ReadUnaryPost(
        exchange_->header("content-type"), exchange_->http_version() >= 0x200,
        [this](const char* name) { return exchange_->header(name); }, exchange_->body().size(),
        exchange_->body_too_large(), shared_->max_message_bytes);
    type_ = post.type;
    if (!post.refusal.ok()) {
      refusal_http_status_ = post.http_status;
      refusal_headers_ = std::move(post.headers);
      return Fail(std::move(post.refusal), CallerOf());
    }
    if (exchange_->refusal() != httpd::Exchange::Refusal::kNone) {
      // Refused unread by the engine (a memory budget, the drain): the status says when to come
      // back.
      return Fail(EngineRefusal(exchange_->refusal(), post.body_limit), CallerOf());
    }
    options_ = post.options;
    if (method().secret_request) exchange_->MarkSecret();  // zeroed with the exchange
    Decode(options_.encoding, exchange_->body());
  }

  // A Connect GET of a side-effect-free method.
  void StartGet() {
    get_ = true;
    type_ = http::ContentType{http::Protocol::kConnect, http::Codec::kProto, false};
    if (exchange_->refusal() != httpd::Exchange::Refusal::kNone) {
      return Fail(EngineRefusal(exchange_->refusal(), 0), CallerOf());
    }
    http::ConnectGet get = http::ReadConnectGet(
        exchange_->query(), [this](const char* name) { return exchange_->header(name); },
        shared_->max_message_bytes);
    type_ = get.type;
    if (!get.refusal.ok()) return Fail(std::move(get.refusal), CallerOf());
    options_ = get.options;
    Decode(options_.encoding, get.message);
  }

 private:
  // Who sent the request: the connection's peer and its verified certificate's identity.
  call::Caller CallerOf() const {
    return {exchange_->peer_address(), exchange_->peer_identity()};
  }

  // The body (or GET message) into the request message, then the call.
  void Decode(Encoding encoding, absl::string_view bytes) {
    if (shared_->count_bytes) {
      shared_->bytes.received[static_cast<int>(encoding)].fetch_add(bytes.size(),
                                                                     std::memory_order_relaxed);
    }
    absl::Time deadline = absl::InfiniteFuture();
    if (options_.timeout.has_value()) {
      deadline = absl::Now() + *options_.timeout;
      exchange_->SetDeadline(deadline);  // a reset at its end is the client's timer, not abuse
    }
    if (auto origin = exchange_->header("origin")) origin_ = std::string(*origin);
    if (absl::Status s = DecodeBody(encoding, bytes); !s.ok()) {
      return Fail(std::move(s), CallerOf());
    }
    Start(CallerOf(), deadline);
  }

  // [issue 34] The request into NewRequest(); an AEAD Open in binary proto, uncompressed, is
  // read where it lies instead: the body taken from the exchange and kept by the call, which
  // is told where its fields lie (only the key id and associated data are copied).
  absl::Status DecodeBody(Encoding encoding, absl::string_view bytes) {
    google::protobuf::Message* request = NewRequest();
    if (TakesOpenInPlace() && http::UncompressedProtoMessage(type_, encoding, bytes).has_value()) {
      const std::string& body = KeepBody(exchange_->TakeBody());
      absl::string_view fields[3];  // key_id, envelope, associated_data
      std::optional<absl::string_view> message =
          http::UncompressedProtoMessage(type_, encoding, body);
      if (message.has_value() && http::ParseBytesFieldsInPlace(
                                     *message, *request->GetDescriptor(), absl::MakeSpan(fields))) {
        SetOpenInPlace(fields[0], fields[1], fields[2]);
        return absl::OkStatus();
      }
      bytes = body;  // protobuf's parser decides (and says what is wrong)
    }
    OFFLOAD_RETURN_IF_ERROR(
        http::DecodeRequest(type_, encoding, bytes, shared_->max_message_bytes, request));
    DropBody();
    return absl::OkStatus();
  }

  // call::Call: the protocol side.
  std::optional<absl::string_view> Metadata(absl::string_view name) const override {
    return exchange_->header(name);
  }
  bool Gone() const override { return exchange_->abandoned(); }
  absl::Status Unread() const override {
    if (!exchange_->answers_over_budget()) return absl::OkStatus();
    return EngineRefusal(httpd::Exchange::Refusal::kAnswersUnread, 0);
  }
  absl::string_view Transport() const override {
    switch (type_.protocol) {
      case http::Protocol::kConnect: return "connect";
      case http::Protocol::kGrpcWeb: return "grpc-web";
      case http::Protocol::kGrpc: return "grpc";
    }
    return "connect";
  }
  // [issue 15, 34] An AEAD Open is answered from its plaintext's buffer in a POST in binary
  // proto: Connect, gRPC or gRPC-Web binary (EncodeShared still compresses a plaintext that
  // pays for it).
  bool TakesSharedMessage() const override {
    return type_.codec == http::Codec::kProto && !type_.text && !get_;
  }
  // [issue 34] The engine's count of the loop this thread runs (httpd::CurrentLoopLoad).
  call::LoopLoad CurrentLoop() const override {
    const httpd::LoopLoad load = httpd::CurrentLoopLoad();
    return {load.on_loop, load.charged, load.waiting};
  }
  void ChargeLoop(int64_t cost) override { httpd::ChargeLoop(cost); }
  absl::Status Encode(const call::Reply& reply) override {
    if (reply.status.ok()) {
      if (reply.shared != nullptr) {
        answer_ = EncodeShared(reply.shared);
      } else {
        std::string message;
        OFFLOAD_RETURN_IF_ERROR(http::EncodeResponse(type_.codec, *reply.response,
                                                     shared_->max_message_bytes, &message));
        const bool gzip = Compress(&message);
        std::optional<http::CacheHint> get;
        if (get_) get = http::CacheHint{method().immutable, Identified()};
        answer_ = http::UnarySuccess(type_, std::move(message), gzip, get);
        if (method().secret_response) MarkSecret(&answer_);
      }
    } else {
      answer_ = http::UnaryError(type_, reply.status, refusal_http_status_, get_);
      for (auto& h : refusal_headers_) answer_.headers.push_back(std::move(h));
      refusal_http_status_ = 0;
      refusal_headers_.clear();
      if (reply.challenge != call::Challenge::kNone) {
        answer_.headers.emplace_back("www-authenticate",
                                     reply.challenge == call::Challenge::kInvalidToken
                                         ? "Bearer error=\"invalid_token\""
                                         : "Bearer");
      }
    }
    shared_->cors.AddResponseHeaders(
        origin_.has_value() ? std::optional<absl::string_view>(*origin_) : std::nullopt,
        &answer_.headers);
    return reply.status;
  }
  void Send() override {
    httpd::Response out = ToResponse(std::move(answer_));
    if (shared_->count_bytes) {
      shared_->bytes.sent[static_cast<int>(sent_encoding_)].fetch_add(out.body_size(),
                                                                       std::memory_order_relaxed);
    }
    exchange_->Respond(std::move(out));
  }
  void AddLogFields(nlohmann::json& line) const override {
    line["http_method"] = get_ ? "GET" : "POST";
    line["http_version"] = exchange_->http_version() >= 0x200 ? "2" : "1.1";
  }

  // [issue 15, 34] An AEAD Open in binary proto: the plaintext's buffer (a memo entry's, or the
  // one the cipher wrote) written as it is in the protocol's framing (no copy in user space;
  // under TLS, none before the record), unless the caller takes gzip and the plaintext would
  // shrink: then a contiguous copy is compressed (the copy costs a fraction of the deflate
  // pass).
  http::Answer EncodeShared(call::SharedMessage* m) {
    const http::CompressionOptions& compression = shared_->compression;
    if (options_.accept != Encoding::kIdentity && compression.level > 0 &&
        static_cast<int64_t>(m->body.size()) >= compression.min_bytes &&
        http::SampledEntropyBits(m->body) <= http::kMaxCompressibleEntropyBits) {
      std::string message = std::move(m->head);
      message.append(m->body.data(), m->body.size());
      message.append(m->tail.data(), m->tail.size());
      const bool gzip = Compress(&message);
      return http::UnarySuccess(type_, std::move(message), gzip, std::nullopt);
    }
    if (options_.accept != Encoding::kIdentity && compression.level > 0 && shared_->count_bytes) {
      // Counted as CompressResponse would have counted it.
      const http::CompressionResult result =
          static_cast<int64_t>(m->body.size()) < compression.min_bytes
              ? http::CompressionResult::kTooSmall
              : http::CompressionResult::kIncompressible;
      shared_->bytes.results[static_cast<int>(result)].fetch_add(1, std::memory_order_relaxed);
    }
    return http::UnarySharedSuccess(type_, std::move(m->head), m->body, std::move(m->tail),
                                    std::move(m->owner));
  }

  // A secret answer: the engine zeroes its copies of the body, and the buffer the mapping
  // shares with it (a large gRPC message: the answer's own, made for it) is zeroed when freed.
  static void MarkSecret(http::Answer* answer) {
    answer->secret = true;
    if (answer->owner == nullptr) return;
    answer->owner = std::shared_ptr<const void>(
        answer->owner.get(), [owner = std::move(answer->owner), views = answer->shared_body](
                                 const void*) mutable {
          for (absl::string_view v : views) {
            if (!v.empty()) sodium_memzero(const_cast<char*>(v.data()), v.size());
          }
          owner.reset();
        });
  }

  // Compresses the response `*message` when the caller asked and it pays (CompressResponse);
  // true if it did. Counts the decision.
  bool Compress(std::string* message) {
    const size_t before = message->size();
    const http::Compression c = http::CompressResponse(options_.accept, shared_->compression,
                                                       message);
    sent_encoding_ = c.encoding;
    if (shared_->count_bytes && c.result != http::CompressionResult::kNotAsked) {
      Gateway::Shared::Bytes& b = shared_->bytes;
      b.results[static_cast<int>(c.result)].fetch_add(1, std::memory_order_relaxed);
      if (c.encoding != Encoding::kIdentity) {
        b.saved.fetch_add(before - message->size(), std::memory_order_relaxed);
      }
    }
    return c.encoding == Encoding::kGzip;
  }

  Gateway::Shared* const shared_;  // alive while the base's context is
  const std::shared_ptr<httpd::Exchange> exchange_;
  http::ContentType type_;
  bool get_ = false;
  http::CallOptions options_;
  Encoding sent_encoding_ = Encoding::kIdentity;  // of the response body
  std::optional<std::string> origin_;             // the request's Origin header, for CORS
  int refusal_http_status_ = 0;                   // a refusal's below the protocol (415, 505)
  http::HeaderList refusal_headers_;              // and its own headers (Accept-Post)
  http::Answer answer_;                           // made by Encode, written by Send
};

}  // namespace

void StartPost(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange,
               const api::Method* method) {
  std::make_shared<HttpCall>(std::move(shared), std::move(exchange), method)->StartPost();
}

void StartGet(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange,
              const api::Method* method) {
  std::make_shared<HttpCall>(std::move(shared), std::move(exchange), method)->StartGet();
}

httpd::Response ToResponse(http::Answer answer) {
  httpd::Response out(answer.status, std::move(answer.headers), std::move(answer.body));
  out.shared_body = std::move(answer.shared_body);
  out.owner = std::move(answer.owner);
  out.trailers = std::move(answer.trailers);
  out.secret = answer.secret;
  return out;
}

}  // namespace offload::gateway
