// Streams on the engine: health Watch (the status now, then each change) and server reflection
// (a bidirectional stream), in gRPC, gRPC-Web or Connect's streaming protocol (http/stream.h),
// bounded in number and in unread answers, and all ended by a drain.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.pb.h"
#include "grpc/reflection/v1/reflection.pb.h"
#include "service/common/status_macros.h"
#include "service/gateway/internal/refusals.h"
#include "service/gateway/internal/shared.h"
#include "service/http/rpc_codec.h"

namespace offload::gateway {

using http::StreamWire;

void Gateway::Shared::Push(Watch& watch) {
  const int status = health->StatusOf(watch.service);
  if (status == watch.sent) return;
  watch.sent = status;
  grpc::health::v1::HealthCheckResponse response;
  response.set_status(static_cast<grpc::health::v1::HealthCheckResponse::ServingStatus>(status));
  watch.exchange->Write(http::EncodeFrame(0, response.SerializeAsString()));
}

void Gateway::Shared::PushAll(bool end) {
  absl::MutexLock lock(&watch_mu);
  Prune();
  for (const std::shared_ptr<Watch>& w : watches) {
    Push(*w);
    if (end) EndStream(*w->exchange, w->wire, DrainingRefusal());
  }
  if (!end) return;
  watches.clear();
  for (const OpenStream& open : streams) {
    if (std::shared_ptr<httpd::Exchange> e = open.exchange.lock()) {
      EndStream(*e, open.wire, DrainingRefusal());
    }
  }
  streams.clear();
}

void Gateway::Shared::Prune() {
  watches.erase(std::remove_if(watches.begin(), watches.end(),
                               [](const auto& w) {
                                 if (!w->exchange->abandoned()) return false;
                                 w->exchange->Finish({});
                                 return true;
                               }),
                watches.end());
  streams.erase(std::remove_if(streams.begin(), streams.end(),
                               [](const OpenStream& open) {
                                 std::shared_ptr<httpd::Exchange> e = open.exchange.lock();
                                 return e == nullptr || e->abandoned();
                               }),
                streams.end());
}

absl::Status Gateway::Shared::StartStream(httpd::Exchange& exchange, StreamWire wire) {
  if (health->draining()) return DrainingRefusal();
  Prune();
  if (watches.size() + streams.size() >= kMaxOpenStreams) {
    return BusyRefusal(absl::StrCat(
        "at most ", kMaxOpenStreams, " health Watch and reflection streams may be open at once"));
  }
  httpd::Headers headers = http::StreamHeaders(wire);
  cors.AddResponseHeaders(exchange.header("origin"), &headers);
  exchange.StartResponse(200, std::move(headers));
  return absl::OkStatus();
}

httpd::Response Gateway::Shared::Refusal(const httpd::Exchange& exchange, StreamWire wire,
                                         const absl::Status& status) const {
  httpd::Response out = ToResponse(http::StreamRefusal(wire, status));
  cors.AddResponseHeaders(exchange.header("origin"), &out.headers);
  return out;
}

void EndStream(httpd::Exchange& exchange, StreamWire wire, const absl::Status& status) {
  http::StreamEnd end = http::EndOfStream(wire, status);
  if (end.last_data.has_value()) {
    exchange.Finish(std::move(end.trailers), *std::move(end.last_data));
  } else {
    exchange.Finish(std::move(end.trailers));
  }
}

void Reflect(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange) {
  // Each request message as it arrives, each answer written at once; the stream ends when the
  // client ends its side (OK), on a malformed message, or when a drain starts (UNAVAILABLE).
  constexpr size_t kMaxRequestBytes = 16 << 10;  // a reflection request is a name or two
  const StreamWire wire = *http::StreamWireOf(exchange->header("content-type"));
  const absl::StatusOr<http::Encoding> encoding_or = http::StreamEncoding(
      wire, [&exchange](const char* name) { return exchange->header(name); });
  if (!encoding_or.ok()) {
    return exchange->Respond(shared->Refusal(*exchange, wire, encoding_or.status()));
  }
  {
    absl::MutexLock lock(&shared->watch_mu);
    if (absl::Status s = shared->StartStream(*exchange, wire); !s.ok()) {
      return exchange->Respond(shared->Refusal(*exchange, wire, s));
    }
    shared->streams.push_back({exchange, wire});
  }
  struct State {
    explicit State(const api::Reflection* r) : stream(r), reader(kMaxRequestBytes) {}
    api::Reflection::Stream stream;
    http::FrameReader reader;
    bool over = false;
  };
  auto state = std::make_shared<State>(shared->reflection.get());
  std::weak_ptr<httpd::Exchange> weak = exchange;
  const http::Encoding encoding = *encoding_or;
  exchange->ReadBody([state, weak, encoding, wire](absl::string_view data, bool end) {
    std::shared_ptr<httpd::Exchange> ex = weak.lock();
    if (ex == nullptr || state->over) return;
    absl::Status status = state->reader.Feed(data, [&](bool compressed, absl::string_view message) {
      grpc::reflection::v1::ServerReflectionRequest request;
      OFFLOAD_RETURN_IF_ERROR(http::DecodeMessage(
          http::ContentType{http::Protocol::kGrpc, http::Codec::kProto}, encoding, compressed,
          message, kMaxRequestBytes, &request));
      if (ex->unsent_bytes() > Gateway::Shared::kMaxStreamUnsentBytes) {
        // Answers pile up unread: the client asks without reading.
        return absl::ResourceExhaustedError("reflection: the answers are not being read");
      }
      ex->Write(http::EncodeFrame(0, state->stream.Answer(request).SerializeAsString()));
      return absl::OkStatus();
    });
    if (status.ok() && end && !state->reader.at_boundary()) {
      status = absl::InvalidArgumentError("grpc request: the stream ended inside a message");
    }
    if (!status.ok() || end) {
      state->over = true;
      EndStream(*ex, wire, status);
    }
  });
}

void WatchHealth(std::shared_ptr<Gateway::Shared> shared,
                 std::shared_ptr<httpd::Exchange> exchange) {
  // The request (one small message) as it arrives; then the status now, and each change.
  constexpr size_t kMaxRequestBytes = 4096;
  auto body = std::make_shared<std::string>();
  std::weak_ptr<httpd::Exchange> weak = exchange;
  const StreamWire wire = *http::StreamWireOf(exchange->header("content-type"));
  exchange->ReadBody([shared = std::move(shared), weak, body, wire](absl::string_view data,
                                                                     bool end) {
    std::shared_ptr<httpd::Exchange> ex = weak.lock();
    if (ex == nullptr) return;
    if (body->size() <= kMaxRequestBytes) {
      body->append(data.data(), std::min(data.size(), kMaxRequestBytes + 1 - body->size()));
    }
    if (!end) return;
    const absl::StatusOr<http::Encoding> encoding =
        http::StreamEncoding(wire, [&ex](const char* name) { return ex->header(name); });
    grpc::health::v1::HealthCheckRequest request;
    absl::Status status = encoding.status();
    if (status.ok() && body->size() > kMaxRequestBytes) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("health request: expected at most ", kMaxRequestBytes, " bytes"));
    }
    if (status.ok()) {
      status = http::DecodeRequest(http::ContentType{http::Protocol::kGrpc, http::Codec::kProto},
                                   *encoding, *body, kMaxRequestBytes, &request);
    }
    if (status.ok() && ex->abandoned()) status = absl::CancelledError("client went away");
    if (status.ok()) {
      // Under the lock Drain's PushAll takes: a stream either ends there or is refused here.
      absl::MutexLock lock(&shared->watch_mu);
      status = shared->StartStream(*ex, wire);
      if (status.ok()) {
        auto watch = std::make_shared<Gateway::Shared::Watch>();
        watch->exchange = std::move(ex);
        watch->wire = wire;
        watch->service = request.service();
        shared->Push(*watch);
        shared->watches.push_back(std::move(watch));
        return;
      }
    }
    ex->Respond(shared->Refusal(*ex, wire, status));
  });
}

}  // namespace offload::gateway
