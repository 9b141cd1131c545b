// offload_load: a closed-loop gRPC load generator for a running offload_server (loopback only).
//
//   build-bench/bin/offload_load --server=127.0.0.1:50051 --server_pid=<server pid>
//       --workload=batch_verify --batch=64 --mode=cold --duration=5 --warmup=1 --inflight=8
//
// Keeps --inflight calls outstanding (gRPC callback API) for --warmup seconds, then measures for
// --duration seconds: calls and items completed in the window, their latency (p50/p99/p999 per
// call), the fraction of items the server says came from a memo (memo_hit), errors, and the
// server's CPU time per item (utime+stime of /proc/<server_pid>/stat over the window).
//
// Workloads: verify, batch_verify, derive, batch_derive, open, batch_open (--batch items per
// batch call, --size plaintext bytes for open). --mode=cold gives every item inputs the memo
// cannot hold: verify items are distinct valid signatures signed locally with libsodium
// beforehand (the run ends early if --cold_items run out); derive items are fresh random peers;
// open items cycle over --open_pool distinct envelopes, by default three times what the server's
// per-key open bound (--server_open_bytes_per_key) holds, so that an LRU never hits. --mode=warm
// cycles over --warm_set distinct items, which the warm-up puts in the memo. The measured hit
// fraction is printed either way, so a cold run that hit would show it.
//
// Keys come from the KeyService (an X25519 key created, an XChaCha20-Poly1305 key imported so
// that envelopes can be sealed locally without the server's Seal recording them) and are deleted
// at the end. The last line of output is a markdown table row (see --print_header).
// --rate=R (calls/s) makes the loop open: calls start on a fixed schedule (at most --inflight
// outstanding) and latency counts from each call's scheduled start, so a server that falls
// behind shows it in p99 (no coordinated omission).
// --check recomputes every answer locally with libsodium and counts any difference as an error:
// verify items then include invalid signatures (every 5th message altered after signing), the
// X25519 key is imported from a secret the load generator knows, and opened plaintexts are
// compared byte for byte. It costs client CPU: for correctness runs, not for figures.
// Exit status: 0 if the window saw completed items and no unexpected error; 1 otherwise.
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"
#include "offload/v1/x25519.grpc.pb.h"
#include "tests/load/load_support.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server address; loopback only.");
ABSL_FLAG(int, server_pid, 0, "Server process id, for its CPU time (0: not reported).");
ABSL_FLAG(std::string, workload, "batch_verify",
          "verify | batch_verify | derive | batch_derive | open | batch_open");
ABSL_FLAG(std::string, mode, "cold", "cold (no memo hit possible) | warm (repeated inputs)");
ABSL_FLAG(int, batch, 64, "Items per batch call (batch_* workloads).");
ABSL_FLAG(int, size, 1024, "Plaintext bytes per open item.");
ABSL_FLAG(std::string, aead, "xchacha20", "Open workloads' key type: xchacha20 | chacha20.");
ABSL_FLAG(int, inflight, 8, "Calls kept outstanding.");
ABSL_FLAG(int, channels, 2, "gRPC channels (TCP connections); calls are spread over them.");
ABSL_FLAG(double, warmup, 1.0, "Seconds of load before the measured window.");
ABSL_FLAG(double, duration, 5.0, "Seconds of the measured window.");
ABSL_FLAG(int64_t, max_calls, 10000000, "Most calls started in all (a bound on the run).");
ABSL_FLAG(int, warm_set, 64, "Distinct items cycled over in warm mode.");
ABSL_FLAG(int64_t, cold_items, 200000,
          "Cold verify: distinct signatures made beforehand (the run ends when they run out).");
ABSL_FLAG(int64_t, open_pool, 0,
          "Cold open: distinct envelopes cycled over; 0 = 3x what the per-key bound holds.");
ABSL_FLAG(int64_t, server_open_bytes_per_key, 8 << 20,
          "The server's --memo_open_bytes_per_key, to size the cold open pool.");
ABSL_FLAG(std::string, label, "", "First column of the markdown row (default: workload/mode).");
ABSL_FLAG(bool, print_header, false, "Print the markdown table header before the row.");
ABSL_FLAG(double, rate, 0,
          "Calls/s on a fixed schedule (open loop, latency from the scheduled start); 0 = closed "
          "loop with --inflight calls outstanding.");
ABSL_FLAG(std::string, write_request, "",
          "Instead of a run: write the workload's first request to this file (its protobuf bytes; "
          "FILE.grpc gets them in a gRPC frame), keep the keys it made, and exit - a body for "
          "h2load (tests/bench/run_all.py's fixed-request rows).");
ABSL_FLAG(int, background_batch_verify, 0,
          "Head-of-line probe: also keep --background_inflight BatchVerify calls of this many "
          "items (invalid signatures: never memoised, every item a full verification) running "
          "on the first channel for the whole run; 0 = none. Their count is printed apart.");
ABSL_FLAG(int, background_inflight, 1, "BatchVerify calls outstanding for --background_batch_verify.");
ABSL_FLAG(bool, check, false,
          "Recompute every answer with libsodium and count differences as errors (adds invalid "
          "signatures to verify items).");

namespace offload::load {
namespace {

namespace v1 = ::offload::v1;

// What one completed call brought back.
struct Outcome {
  grpc::Status status;
  int items = 0;
  int hits = 0;
  int item_errors = 0;  // item status != OK, verify false, or a result of the wrong shape
  std::string first_error;
};

using OnDone = std::function<void(Outcome)>;

// --write_request: StartRpc serializes the request here instead of sending it.
std::string* g_captured_request = nullptr;

// A workload starts call number `seq` (the items seq*batch ... of its item sequence) and reports
// its Outcome once. Start returns false when the workload has no more inputs.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual bool Start(size_t channel, int64_t seq, OnDone done) = 0;
  virtual void Cleanup() {}
};

google::protobuf::ArenaOptions ArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 4096;
  options.max_block_size = 64 * 1024;
  return options;
}

// Starts one callback RPC. `call` is the stub's async() method, `fill` builds the request and
// `count` turns the request and response into an Outcome.
// `shared`, when set, is sent instead of a request built by `fill` (see RequestCache).
template <typename Req, typename Resp, typename Call, typename Count>
void StartRpc(Call call, std::function<void(Req*)> fill, Count count, OnDone done,
              const Req* shared = nullptr) {
  // Request and response live on one arena: a batch's item messages cost no malloc each, so the
  // generator, which shares the cores with the server, takes less of them.
  struct State {
    google::protobuf::Arena arena{ArenaOptions()};
    grpc::ClientContext ctx;
    Req* req = google::protobuf::Arena::CreateMessage<Req>(&arena);
    Resp* resp = google::protobuf::Arena::CreateMessage<Resp>(&arena);
  };
  if (g_captured_request != nullptr) {
    Req req;
    fill(&req);
    *g_captured_request = (shared != nullptr ? *shared : req).SerializeAsString();
    done(Outcome{});
    return;
  }
  auto* s = new State;
  s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const Req* req = shared;
  if (req == nullptr) {
    fill(s->req);
    req = s->req;
  }
  call(&s->ctx, req, s->resp, [s, req, count, done = std::move(done)](grpc::Status status) {
    Outcome o;
    o.status = status;
    if (status.ok()) count(*req, *s->resp, &o);
    delete s;
    done(std::move(o));
  });
}

// Warm mode sends the same few requests over and over: each distinct one is built once, on first
// use, and every later call sends that copy (the server still receives and parses every call's
// bytes). This keeps the generator's CPU per item low where the server's is lowest, on memo hits.
// Thread-safe; the requests live as long as the cache.
template <typename Req>
class RequestCache {
 public:
  // The request for `slot`, built by `fill` the first time.
  const Req* Get(int64_t slot, const std::function<void(Req*)>& fill) {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<Req>& req = map_[slot];
    if (req == nullptr) {
      req = std::make_unique<Req>();
      fill(req.get());
    }
    return req.get();
  }

 private:
  std::mutex mu_;
  std::unordered_map<int64_t, std::unique_ptr<Req>> map_;
};

void ItemError(Outcome* o, const std::string& what) {
  if (o->item_errors++ == 0) o->first_error = what;
}

// ------------------------------------------------------------------------------------------
// Verify

struct Signed {
  std::string public_key, signature, message;
};

// With `corrupt`, every 5th message is altered after signing: an invalid signature.
std::vector<Signed> SignMany(int64_t n, bool corrupt) {
  std::vector<Signed> out(n);
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&out, t, threads, n, corrupt] {
      unsigned char pk[32], sk[64];
      crypto_sign_keypair(pk, sk);
      for (int64_t i = t; i < n; i += threads) {
        if ((i / threads) % 1024 == 0) crypto_sign_keypair(pk, sk);  // a few signers
        Signed& s = out[i];
        s.public_key.assign(reinterpret_cast<char*>(pk), 32);
        s.message = RandomString(64);
        s.signature.resize(64);
        crypto_sign_detached(reinterpret_cast<unsigned char*>(s.signature.data()), nullptr,
                             reinterpret_cast<const unsigned char*>(s.message.data()), 64, sk);
        if (corrupt && i % 5 == 2) s.message[0] ^= 1;
      }
      sodium_memzero(sk, sizeof(sk));
    });
  }
  for (auto& th : pool) th.join();
  return out;
}

// libsodium's answer for one verify item: what --check expects.
template <typename Req>
bool ExpectedValid(const Req& r) {
  return r.public_key().size() == 32 && r.signature().size() == 64 &&
         crypto_sign_verify_detached(
             reinterpret_cast<const unsigned char*>(r.signature().data()),
             reinterpret_cast<const unsigned char*>(r.message().data()), r.message().size(),
             reinterpret_cast<const unsigned char*>(r.public_key().data())) == 0;
}

class VerifyWorkload final : public Workload {
 public:
  VerifyWorkload(const Channels& channels, bool batch, int batch_size, bool cold, int64_t items,
                 bool check)
      : batch_(batch),
        batch_size_(batch ? batch_size : 1),
        cold_(cold),
        check_(check),
        items_(SignMany(items, check)) {
    for (const auto& c : channels) stubs_.push_back(v1::Ed25519Service::NewStub(c));
  }

  bool Start(size_t channel, int64_t seq, OnDone done) override {
    const int64_t first = seq * batch_size_;
    if (cold_ && first + batch_size_ > static_cast<int64_t>(items_.size())) return false;
    auto item = [this, first](int j) -> const Signed& {
      return items_[(first + j) % items_.size()];
    };
    auto* async = stubs_[channel]->async();
    const int64_t slot = first % static_cast<int64_t>(items_.size());
    if (!batch_) {
      std::function<void(v1::VerifyRequest*)> fill([&](v1::VerifyRequest* r) {
        const Signed& s = item(0);
        r->set_public_key(s.public_key);
        r->set_signature(s.signature);
        r->set_message(s.message);
      });
      StartRpc<v1::VerifyRequest, v1::VerifyResponse>(
          [async](auto... a) { async->Verify(a...); }, fill,
          [check = check_](const v1::VerifyRequest& req, const v1::VerifyResponse& resp,
                           Outcome* o) {
            o->items = 1;
            o->hits = resp.memo_hit();
            if (resp.valid() != (check ? ExpectedValid(req) : true)) {
              ItemError(o, resp.valid() ? "valid=true for an invalid signature" : "valid=false");
            }
          },
          std::move(done), cold_ ? nullptr : unary_cache_.Get(slot, fill));
      return true;
    }
    const int n = batch_size_;
    std::function<void(v1::BatchVerifyRequest*)> fill([&](v1::BatchVerifyRequest* r) {
      for (int j = 0; j < n; ++j) {
        const Signed& s = item(j);
        v1::VerifyRequest* it = r->add_items();
        it->set_public_key(s.public_key);
        it->set_signature(s.signature);
        it->set_message(s.message);
      }
    });
    StartRpc<v1::BatchVerifyRequest, v1::BatchVerifyResponse>(
        [async](auto... a) { async->BatchVerify(a...); }, fill,
        [n, check = check_](const v1::BatchVerifyRequest& req,
                            const v1::BatchVerifyResponse& resp, Outcome* o) {
          if (resp.results_size() != n) return ItemError(o, "wrong number of results");
          for (int j = 0; j < n; ++j) {
            const auto& r = resp.results(j);
            ++o->items;
            o->hits += r.memo_hit();
            if (r.status().code() != 0) {
              ItemError(o, r.status().message());
            } else if (r.valid() != (check ? ExpectedValid(req.items(j)) : true)) {
              ItemError(o, r.valid() ? "valid=true for an invalid signature" : "valid=false");
            }
          }
        },
        std::move(done), cold_ ? nullptr : batch_cache_.Get(slot, fill));
    return true;
  }

 private:
  const bool batch_;
  const int batch_size_;
  const bool cold_;
  const bool check_;
  const std::vector<Signed> items_;
  std::vector<std::unique_ptr<v1::Ed25519Service::Stub>> stubs_;
  RequestCache<v1::VerifyRequest> unary_cache_;
  RequestCache<v1::BatchVerifyRequest> batch_cache_;
};

// ------------------------------------------------------------------------------------------
// Derive

class DeriveWorkload final : public Workload {
 public:
  // With `check`, the key is imported from a secret made here, so that every shared key can be
  // recomputed; otherwise the server creates it.
  DeriveWorkload(const Channels& channels, bool batch, int batch_size, bool cold, int warm_set,
                 bool check)
      : channel_(channels[0]), batch_(batch), batch_size_(batch ? batch_size : 1), cold_(cold) {
    for (const auto& c : channels) stubs_.push_back(v1::X25519Service::NewStub(c));
    key_id_ = absl::StrCat("load-dh-", getpid(), "-", randombytes_uniform(1000000));
    auto keys = v1::KeyService::NewStub(channel_);
    grpc::ClientContext ctx;
    v1::KeyInfo info;
    grpc::Status s;
    if (check) {
      secret_ = std::make_shared<std::string>(RandomString(32));
      v1::ImportKeyRequest req;
      req.set_key_id(key_id_);
      req.set_type(v1::KEY_TYPE_X25519);
      req.set_secret(*secret_);
      s = keys->ImportKey(&ctx, req, &info);
    } else {
      v1::CreateKeyRequest req;
      req.set_key_id(key_id_);
      req.set_type(v1::KEY_TYPE_X25519);
      s = keys->CreateKey(&ctx, req, &info);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", check ? "ImportKey" : "CreateKey",
                   s.error_message().c_str());
      std::exit(1);
    }
    for (int i = 0; i < warm_set; ++i) warm_.push_back(RandomString(32));
  }

  bool Start(size_t channel, int64_t seq, OnDone done) override {
    auto* async = stubs_[channel]->async();
    const int64_t first = seq * batch_size_;
    auto fill_one = [this, first](int j, v1::DeriveRequest* r) {
      r->set_key_id(key_id_);
      r->set_output(v1::DERIVE_OUTPUT_RAW);
      r->set_peer_public_key(cold_ ? RandomString(32) : warm_[(first + j) % warm_.size()]);
    };
    auto check = [secret = secret_](const v1::DeriveRequest& req, const v1::DeriveResponse& resp,
                                    Outcome* o) {
      o->hits += resp.memo_hit();
      if (resp.shared_key().size() != 32) return ItemError(o, "shared_key is not 32 bytes");
      if (secret == nullptr) return;
      unsigned char expected[32];
      if (crypto_scalarmult(expected, reinterpret_cast<const unsigned char*>(secret->data()),
                            reinterpret_cast<const unsigned char*>(req.peer_public_key().data())) !=
              0 ||
          sodium_memcmp(expected, resp.shared_key().data(), 32) != 0) {
        ItemError(o, "shared_key differs from libsodium's");
      }
      sodium_memzero(expected, sizeof(expected));
    };
    const int64_t slot = first % static_cast<int64_t>(warm_.empty() ? 1 : warm_.size());
    if (!batch_) {
      std::function<void(v1::DeriveRequest*)> fill(
          [&](v1::DeriveRequest* r) { fill_one(0, r); });
      StartRpc<v1::DeriveRequest, v1::DeriveResponse>(
          [async](auto... a) { async->Derive(a...); }, fill,
          [check](const v1::DeriveRequest& req, const v1::DeriveResponse& resp, Outcome* o) {
            o->items = 1;
            check(req, resp, o);
          },
          std::move(done), cold_ ? nullptr : unary_cache_.Get(slot, fill));
      return true;
    }
    const int n = batch_size_;
    std::function<void(v1::BatchDeriveRequest*)> fill([&](v1::BatchDeriveRequest* r) {
      for (int j = 0; j < n; ++j) fill_one(j, r->add_items());
    });
    StartRpc<v1::BatchDeriveRequest, v1::BatchDeriveResponse>(
        [async](auto... a) { async->BatchDerive(a...); }, fill,
        [n, check](const v1::BatchDeriveRequest& req, const v1::BatchDeriveResponse& resp,
                   Outcome* o) {
          if (resp.results_size() != n) return ItemError(o, "wrong number of results");
          for (int j = 0; j < n; ++j) {
            const auto& r = resp.results(j);
            ++o->items;
            if (r.status().code() != 0) ItemError(o, r.status().message());
            else check(req.items(j), r.response(), o);
          }
        },
        std::move(done), cold_ ? nullptr : batch_cache_.Get(slot, fill));
    return true;
  }

  void Cleanup() override { DeleteKey(channel_, key_id_).IgnoreError(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const bool batch_;
  const int batch_size_;
  const bool cold_;
  std::string key_id_;
  std::shared_ptr<const std::string> secret_;  // the imported X25519 secret (--check only)
  std::vector<std::string> warm_;
  std::vector<std::unique_ptr<v1::X25519Service::Stub>> stubs_;
  RequestCache<v1::DeriveRequest> unary_cache_;
  RequestCache<v1::BatchDeriveRequest> batch_cache_;
};

// ------------------------------------------------------------------------------------------
// Open

class OpenWorkload final : public Workload {
 public:
  OpenWorkload(const Channels& channels, bool batch, int batch_size, bool cold, int warm_set,
               int size, bool xchacha, int64_t pool, bool check)
      : channel_(channels[0]),
        batch_(batch),
        batch_size_(batch ? batch_size : 1),
        cold_(cold),
        size_(size) {
    for (const auto& c : channels) stubs_.push_back(v1::AeadService::NewStub(c));
    key_id_ = UniqueKeyId("load-blobs");
    std::string secret = RandomString(32);
    absl::StatusOr<v1::KeyInfo> info = ImportKey(
        channel_, key_id_,
        xchacha ? v1::KEY_TYPE_XCHACHA20_POLY1305 : v1::KEY_TYPE_CHACHA20_POLY1305, secret);
    if (!info.ok()) {
      std::fprintf(stderr, "%s\n", std::string(info.status().message()).c_str());
      std::exit(1);
    }
    const int64_t count = cold ? pool : warm_set;
    const std::string plaintext = RandomString(size);
    if (check) plaintext_ = std::make_shared<std::string>(plaintext);
    aad_ = RandomString(16);
    for (int64_t i = 0; i < count; ++i) {
      envelopes_.push_back(
          SealEnvelope(secret, info->current_version(), xchacha, plaintext, aad_));
    }
    sodium_memzero(secret.data(), secret.size());
  }

  bool Start(size_t channel, int64_t seq, OnDone done) override {
    auto* async = stubs_[channel]->async();
    const int64_t first = seq * batch_size_;
    auto fill_one = [this, first](int j, v1::AeadOpenRequest* r) {
      r->set_key_id(key_id_);
      r->set_envelope(envelopes_[(first + j) % envelopes_.size()]);
      r->set_associated_data(aad_);
    };
    const size_t size = size_;
    auto check = [size, expected = plaintext_](const v1::AeadOpenResponse& resp, Outcome* o) {
      o->hits += resp.memo_hit();
      if (resp.plaintext().size() != size) return ItemError(o, "plaintext of the wrong size");
      if (expected != nullptr && resp.plaintext() != *expected) {
        ItemError(o, "plaintext differs from what was sealed");
      }
    };
    const int64_t slot = first % static_cast<int64_t>(envelopes_.size());
    if (!batch_) {
      std::function<void(v1::AeadOpenRequest*)> fill(
          [&](v1::AeadOpenRequest* r) { fill_one(0, r); });
      StartRpc<v1::AeadOpenRequest, v1::AeadOpenResponse>(
          [async](auto... a) { async->Open(a...); }, fill,
          [check](const v1::AeadOpenRequest&, const v1::AeadOpenResponse& resp, Outcome* o) {
            o->items = 1;
            check(resp, o);
          },
          std::move(done), cold_ ? nullptr : unary_cache_.Get(slot, fill));
      return true;
    }
    const int n = batch_size_;
    std::function<void(v1::BatchAeadOpenRequest*)> fill([&](v1::BatchAeadOpenRequest* r) {
      for (int j = 0; j < n; ++j) fill_one(j, r->add_items());
    });
    StartRpc<v1::BatchAeadOpenRequest, v1::BatchAeadOpenResponse>(
        [async](auto... a) { async->BatchOpen(a...); }, fill,
        [n, check](const v1::BatchAeadOpenRequest&, const v1::BatchAeadOpenResponse& resp,
                   Outcome* o) {
          if (resp.results_size() != n) return ItemError(o, "wrong number of results");
          for (const auto& r : resp.results()) {
            ++o->items;
            if (r.status().code() != 0) ItemError(o, r.status().message());
            else check(r.response(), o);
          }
        },
        std::move(done), cold_ ? nullptr : batch_cache_.Get(slot, fill));
    return true;
  }

  void Cleanup() override { DeleteKey(channel_, key_id_).IgnoreError(); }
  size_t pool_size() const { return envelopes_.size(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const bool batch_;
  const int batch_size_;
  const bool cold_;
  const int size_;
  std::string key_id_;
  std::string aad_;
  std::shared_ptr<const std::string> plaintext_;  // what every envelope holds (--check only)
  std::vector<std::string> envelopes_;
  std::vector<std::unique_ptr<v1::AeadService::Stub>> stubs_;
  RequestCache<v1::AeadOpenRequest> unary_cache_;
  RequestCache<v1::BatchAeadOpenRequest> batch_cache_;
};

// ------------------------------------------------------------------------------------------
// --background_batch_verify: big batches on the same connection as the measured calls.

class Background {
 public:
  // `inflight` BatchVerify calls of `items` invalid signatures each on `channel`, each restarted
  // when it completes, until Stop().
  Background(std::shared_ptr<grpc::Channel> channel, int items, int inflight)
      : stub_(v1::Ed25519Service::NewStub(channel)), inflight_(inflight) {
    for (const Signed& s : SignMany(items, /*corrupt=*/false)) {
      v1::VerifyRequest* it = request_.add_items();
      it->set_public_key(s.public_key);
      it->set_signature(s.signature);
      it->set_message(s.message);
      it->mutable_message()->push_back('x');  // signed without it: invalid, never memoised
    }
  }
  void Start() {
    for (int i = 0; i < inflight_; ++i) Issue();
  }
  // Waits for the calls in flight; returns calls completed while running and those whose answer
  // was wrong (an error, or an item not answered valid=false).
  std::pair<int64_t, int64_t> Stop() {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.wait(lock, [this] { return outstanding_ == 0; });
    return {completed_, wrong_};
  }

 private:
  void Issue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      ++outstanding_;
    }
    auto* ctx = new grpc::ClientContext;
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto* resp = new v1::BatchVerifyResponse;
    stub_->async()->BatchVerify(ctx, &request_, resp, [this, ctx, resp](grpc::Status status) {
      bool wrong = !status.ok() || resp->results_size() != request_.items_size();
      for (const auto& r : resp->results()) wrong = wrong || r.valid() || r.status().code() != 0;
      delete resp;
      delete ctx;
      {
        std::lock_guard<std::mutex> lock(mu_);
        --outstanding_;
        ++completed_;
        wrong_ += wrong;
        if (stopping_) {
          cv_.notify_all();
          return;
        }
      }
      Issue();
    });
  }

  std::unique_ptr<v1::Ed25519Service::Stub> stub_;
  v1::BatchVerifyRequest request_;
  const int inflight_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int64_t outstanding_ = 0, completed_ = 0, wrong_ = 0;
};

// ------------------------------------------------------------------------------------------
// The closed loop.

class Runner {
 public:
  Runner(Workload* workload, size_t channels, int64_t max_calls)
      : workload_(workload), channels_(channels), max_calls_(max_calls) {}

  struct Result {
    double seconds = 0;
    int64_t calls = 0, items = 0, hits = 0, rpc_errors = 0, item_errors = 0;
    std::vector<int64_t> latency_ns;
    std::string first_error;
    bool ran_out = false;
    int64_t server_cpu_us = -1, client_cpu_us = 0;
  };

  // `rate` > 0: open loop, calls start every 1/rate s (at most `inflight` outstanding) and their
  // latency counts from the scheduled start. Otherwise closed loop: `inflight` calls outstanding.
  Result Run(int inflight, double rate, double warmup_s, double duration_s, int server_pid) {
    const int64_t start = NowNs();
    window_start_ = start + static_cast<int64_t>(warmup_s * 1e9);
    const int64_t planned_end = window_start_ + static_cast<int64_t>(duration_s * 1e9);
    open_loop_ = rate > 0;
    std::thread pacer;
    if (open_loop_) {
      pacer = std::thread([this, start, rate, inflight] {
        for (int64_t i = 0;; ++i) {
          const int64_t due = start + static_cast<int64_t>(static_cast<double>(i) * 1e9 / rate);
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(due)),
                         [this] { return stopping_; });
          waiting_for_slot_ = true;
          cv_.wait(lock, [this, inflight] { return stopping_ || outstanding_ < inflight; });
          waiting_for_slot_ = false;
          if (stopping_) return;
          lock.unlock();
          IssueNext(due);
        }
      });
    } else {
      for (int i = 0; i < inflight; ++i) IssueNext(0);
    }

    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(window_start_)),
                   [this] { return stopping_; });
    lock.unlock();
    const int64_t cpu0 = ProcessCpuMicros(server_pid);
    const int64_t self0 = SelfCpuMicros();
    const int64_t t0 = NowNs();
    window_start_ = t0;  // (the warm-up may have been cut short)
    lock.lock();
    cv_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(planned_end)),
                   [this] { return stopping_; });
    const int64_t t1 = NowNs();
    window_end_.store(t1);
    stopping_ = true;
    cv_.notify_all();
    lock.unlock();
    if (pacer.joinable()) pacer.join();
    const int64_t cpu1 = ProcessCpuMicros(server_pid);
    const int64_t self1 = SelfCpuMicros();

    lock.lock();  // wait for the calls still in flight (each has a 30 s deadline)
    draining_ = true;
    cv_.wait(lock, [this] { return outstanding_ == 0; });
    lock.unlock();
    while (callbacks_.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.lock();
    Result r = std::move(result_);
    r.seconds = (t1 - t0) / 1e9;
    r.ran_out = ran_out_;
    if (cpu0 >= 0 && cpu1 >= 0) r.server_cpu_us = cpu1 - cpu0;
    r.client_cpu_us = self1 - self0;
    return r;
  }

 private:
  // Starts the next call; `scheduled` (open loop) is when it was due, else 0 (now).
  void IssueNext(int64_t scheduled) {
    int64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      if (next_seq_ >= max_calls_) {
        stopping_ = true;
        ran_out_ = true;
        cv_.notify_all();
        return;
      }
      seq = next_seq_++;
      ++outstanding_;
    }
    const int64_t started = scheduled > 0 ? scheduled : NowNs();
    const bool ok = workload_->Start(seq % channels_, seq, [this, started](Outcome o) {
      // Counted before Record, so that Run, once every call is recorded, also waits for this
      // callback to stop touching the Runner (found by ASan: a use after scope at the end).
      callbacks_.fetch_add(1);
      Record(started, std::move(o));
      if (!open_loop_) IssueNext(0);
      callbacks_.fetch_sub(1);  // the callback's last touch
    });
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu_);
      --outstanding_;
      stopping_ = true;
      ran_out_ = true;
      cv_.notify_all();
    }
  }

  void Record(int64_t started, Outcome o) {
    const int64_t now = NowNs();
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_;
    if (now >= window_start_ && now < window_end_.load()) {
      ++result_.calls;
      result_.latency_ns.push_back(now - started);
      if (!o.status.ok()) {
        ++result_.rpc_errors;
        if (result_.first_error.empty()) {
          result_.first_error = absl::StrCat("rpc: ", o.status.error_code(), " ",
                                             o.status.error_message());
        }
      } else {
        result_.items += o.items;
        result_.hits += o.hits;
        result_.item_errors += o.item_errors;
        if (o.item_errors > 0 && result_.first_error.empty()) {
          result_.first_error = "item: " + o.first_error;
        }
      }
    } else if (!o.status.ok() || o.item_errors > 0) {
      ++warmup_errors_;
    }
    // Only when a thread waits for what this changed: a wake-up per call would cost the
    // generator two futex round trips (the pacer and Run's timed waits) on the shared cores.
    if (waiting_for_slot_ || (draining_ && outstanding_ == 0)) cv_.notify_all();
  }

  Workload* const workload_;
  const size_t channels_;
  const int64_t max_calls_;
  std::atomic<int64_t> window_start_{0};
  std::atomic<int64_t> window_end_{INT64_MAX};
  bool open_loop_ = false;  // set before the first call
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool ran_out_ = false;
  bool waiting_for_slot_ = false;  // the pacer waits for outstanding_ < inflight
  bool draining_ = false;          // Run waits for outstanding_ == 0
  int64_t next_seq_ = 0;
  int64_t outstanding_ = 0;
  std::atomic<int> callbacks_{0};  // completion callbacks running
  int64_t warmup_errors_ = 0;
  Result result_;
};

double Percentile(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k] / 1e6;  // ms
}

int Main() {
  const std::string server = absl::GetFlag(FLAGS_server);
  if (!IsLoopback(server)) {
    std::fprintf(stderr, "--server: expected a loopback address (127.0.0.1:port), got %s\n",
                 server.c_str());
    return 2;
  }
  if (sodium_init() < 0) return 2;
  const std::string workload_name = absl::GetFlag(FLAGS_workload);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "cold" && mode != "warm") {
    std::fprintf(stderr, "--mode: expected cold or warm, got %s\n", mode.c_str());
    return 2;
  }
  const bool cold = mode == "cold";
  const bool batch = absl::StartsWith(workload_name, "batch_");
  const int batch_size = batch ? absl::GetFlag(FLAGS_batch) : 1;
  const int size = absl::GetFlag(FLAGS_size);
  const int warm_set = absl::GetFlag(FLAGS_warm_set);
  const bool check = absl::GetFlag(FLAGS_check);

  absl::StatusOr<Channels> connected = ConnectChannels(
      server, absl::GetFlag(FLAGS_channels), std::chrono::milliseconds(5000));
  if (!connected.ok()) {
    std::fprintf(stderr, "%s\n", std::string(connected.status().message()).c_str());
    return 1;
  }
  const Channels& channels = *connected;

  std::unique_ptr<Workload> workload;
  std::string detail;
  const std::string base = batch ? workload_name.substr(6) : workload_name;
  if (base == "verify") {
    const int64_t items = cold ? absl::GetFlag(FLAGS_cold_items) : warm_set;
    const int64_t t = NowNs();
    workload = std::make_unique<VerifyWorkload>(channels, batch, batch_size, cold, items, check);
    detail = absl::StrCat(items, " distinct signatures signed in ", (NowNs() - t) / 1000000,
                          " ms");
  } else if (base == "derive") {
    workload =
        std::make_unique<DeriveWorkload>(channels, batch, batch_size, cold, warm_set, check);
    detail = cold ? "a fresh random peer per item" : absl::StrCat(warm_set, " distinct peers");
  } else if (base == "open") {
    int64_t pool = absl::GetFlag(FLAGS_open_pool);
    if (pool <= 0) {
      const int64_t entry = 2 * int64_t{size} + 16 + 128 + 32;
      pool = 3 * (absl::GetFlag(FLAGS_server_open_bytes_per_key) / entry) + batch_size;
    }
    const bool xchacha = absl::GetFlag(FLAGS_aead) != "chacha20";
    auto open = std::make_unique<OpenWorkload>(channels, batch, batch_size, cold, warm_set,
                                               size, xchacha, pool, check);
    detail = absl::StrCat(open->pool_size(), " distinct envelopes of ", size, " B (",
                          xchacha ? "XChaCha20" : "ChaCha20", "-Poly1305)");
    workload = std::move(open);
  } else {
    std::fprintf(stderr, "--workload: unknown %s\n", workload_name.c_str());
    return 2;
  }

  if (const std::string path = absl::GetFlag(FLAGS_write_request); !path.empty()) {
    std::string bytes;
    g_captured_request = &bytes;
    workload->Start(0, 0, [](Outcome) {});
    g_captured_request = nullptr;
    std::string framed(5, '\0');
    for (int i = 0; i < 4; ++i) framed[1 + i] = static_cast<char>(bytes.size() >> (24 - 8 * i));
    framed += bytes;
    for (const auto& [file, content] :
         {std::pair{path, &bytes}, std::pair{path + ".grpc", &framed}}) {
      FILE* f = std::fopen(file.c_str(), "wb");
      if (f == nullptr || std::fwrite(content->data(), 1, content->size(), f) != content->size()) {
        std::fprintf(stderr, "--write_request: cannot write %s\n", file.c_str());
        return 1;
      }
      std::fclose(f);
    }
    std::printf("wrote %zu request bytes to %s (and framed to %s.grpc); keys kept\n",
                bytes.size(), path.c_str(), path.c_str());
    return 0;
  }

  std::unique_ptr<Background> background;
  if (const int n = absl::GetFlag(FLAGS_background_batch_verify); n > 0) {
    background = std::make_unique<Background>(channels[0], n,
                                              std::max(1, absl::GetFlag(FLAGS_background_inflight)));
    background->Start();
  }
  Runner runner(workload.get(), channels.size(), absl::GetFlag(FLAGS_max_calls));
  Runner::Result r =
      runner.Run(std::max(1, absl::GetFlag(FLAGS_inflight)), absl::GetFlag(FLAGS_rate),
                 absl::GetFlag(FLAGS_warmup),
                 absl::GetFlag(FLAGS_duration), absl::GetFlag(FLAGS_server_pid));
  int64_t background_wrong = 0;
  if (background != nullptr) {
    const auto [completed, wrong] = background->Stop();
    background_wrong = wrong;
    std::printf("background: %lld BatchVerify(%d) calls completed on channel 0 during the run, "
                "%lld wrong\n",
                static_cast<long long>(completed), absl::GetFlag(FLAGS_background_batch_verify),
                static_cast<long long>(wrong));
  }
  workload->Cleanup();

  const double items_s = r.seconds > 0 ? r.items / r.seconds : 0;
  const double calls_s = r.seconds > 0 ? r.calls / r.seconds : 0;
  const double hit = r.items > 0 ? static_cast<double>(r.hits) / r.items : 0;
  const double p50 = Percentile(r.latency_ns, 0.50), p99 = Percentile(r.latency_ns, 0.99),
               p999 = Percentile(r.latency_ns, 0.999);
  const double server_us_item =
      r.server_cpu_us >= 0 && r.items > 0 ? static_cast<double>(r.server_cpu_us) / r.items : -1;
  const double client_us_item =
      r.items > 0 ? static_cast<double>(r.client_cpu_us) / r.items : -1;
  const int64_t errors = r.rpc_errors + r.item_errors;

  std::printf("workload %s mode=%s batch=%d size=%d inflight=%d%s%s: %s\n", workload_name.c_str(),
              mode.c_str(), batch_size, size, absl::GetFlag(FLAGS_inflight),
              absl::GetFlag(FLAGS_rate) > 0
                  ? absl::StrCat(" rate=", absl::GetFlag(FLAGS_rate), " calls/s (open loop)").c_str()
                  : "",
              check ? " check" : "", detail.c_str());
  std::printf("window %.2f s%s: %lld calls, %lld items, %.0f items/s, %.0f calls/s\n", r.seconds,
              r.ran_out ? " (ended early: inputs or --max_calls ran out)" : "",
              static_cast<long long>(r.calls), static_cast<long long>(r.items), items_s, calls_s);
  std::printf("latency per call: p50 %.3f ms, p99 %.3f ms, p999 %.3f ms\n", p50, p99, p999);
  std::printf("memo hit fraction %.4f; errors %lld (rpc %lld, item %lld)%s%s\n", hit,
              static_cast<long long>(errors), static_cast<long long>(r.rpc_errors),
              static_cast<long long>(r.item_errors), r.first_error.empty() ? "" : "; first: ",
              r.first_error.c_str());
  std::printf("server CPU %.2f us/item (%.3f s over the window), load generator CPU %.2f us/item\n",
              server_us_item, r.server_cpu_us / 1e6, client_us_item);

  std::string label = absl::GetFlag(FLAGS_label);
  if (label.empty()) {
    label = absl::StrCat(workload_name, batch ? absl::StrCat("(", batch_size, ")") : "",
                         base == "open" ? absl::StrCat(" ", size, " B") : "", " ", mode);
  }
  if (absl::GetFlag(FLAGS_print_header)) {
    std::printf("| workload | items/s | calls/s | p50 ms | p99 ms | p999 ms | memo hit | errors "
                "| server CPU us/item |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                "| ---: |\n");
  }
  char cpu[32] = "-";
  if (server_us_item >= 0) std::snprintf(cpu, sizeof(cpu), "%.1f", server_us_item);
  std::printf("| %s | %.0f | %.0f | %.2f | %.2f | %.2f | %.3f | %lld | %s |\n", label.c_str(),
              items_s, calls_s, p50, p99, p999, hit, static_cast<long long>(errors), cpu);
  return (r.items > 0 && errors == 0 && background_wrong == 0) ? 0 : 1;
}

}  // namespace
}  // namespace offload::load

int main(int argc, char** argv) {
  // As offload_server does (service/main/main.cc): no page faults per large message.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  absl::SetProgramUsageMessage("Load generator for offload_server. See offload_load.cc.");
  absl::ParseCommandLine(argc, argv);
  return offload::load::Main();
}
