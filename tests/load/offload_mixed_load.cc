// offload_mixed_load: mixed-traffic load generator for a running offload_server (loopback only),
// for soak and overload runs (tests/load/README.md).
//
//   # open loop: 2000 calls/s offered for 30 minutes
//   build/bin/offload_mixed_load --server=127.0.0.1:50051 --server_pid=<pid>
//       --mode=open --rate=2000 --duration=1800
//   # closed loop: 32 calls in flight for 20 s
//   build/bin/offload_mixed_load --server=127.0.0.1:50051 --mode=closed --inflight=32 --duration=20
//
// Traffic: Verify, Derive and AeadOpen calls in the proportions --verify_weight, --derive_weight,
// --open_weight; single calls, or with --batch=N batch calls of N items. An item uses a "warm"
// input (one of --warm_set per operation, sent once before the run so that the memo holds it) with
// probability --warm_fraction, else a fresh one the server has never seen (a signature made now, a
// new X25519 peer, an envelope sealed now; or, with --fresh_pool, one of a pool made at start). A
// fraction --bad_fraction of items carries bad input, each kind with the code the API promises:
// wrong sizes (INVALID_ARGUMENT), unknown key ids (NOT_FOUND), tampered, truncated or wrong-AAD
// envelopes (INVALID_ARGUMENT), an envelope naming a key version that does not exist (NOT_FOUND),
// a small-order peer (INVALID_ARGUMENT), a key of the wrong type (FAILED_PRECONDITION).
//
// Every answer is checked: Verify says valid for the valid signatures and invalid for the
// tampered ones (--verify_invalid_fraction of the fresh verify calls); Open returns the plaintext
// that was sealed; Derive equals libsodium's crypto_scalarmult (or crypto_box_beforenm) of the
// local peer secret and the server key's public half; a fresh input is never a memo hit.
// Outcomes:
//   ok            a good input answered correctly (its latency is in p50/p99)
//   expected_err  a bad input answered with the code it must get
//   exhausted     RESOURCE_EXHAUSTED: the server shed the call (overload protection)
//   deadline      DEADLINE_EXCEEDED: unexpected unless --deadline_exceeded_ok (overload runs)
//   unexpected    anything else: a wrong answer, a wrong code, a memo hit for a fresh input...
//   skipped       open loop only: not sent because --max_outstanding calls were already out
//
// Every --report_every seconds a line "interval t=... ok_per_s=... p50_ms=... p99_ms=...
// expected_err=... exhausted=... deadline=... unexpected=... skipped=... rss_mib=..." (server VmRSS
// from /proc/<server_pid>/status); at the end "summary ..." and one "op ..." line per operation,
// key=value pairs that tests/load/*.sh parse. With --recovery_seconds (open loop), the offered
// load stops after --duration and a closed-loop probe (--recovery_inflight calls) measures how
// long until its throughput is back to --recovery_fraction of --normal_ok_per_s: "recovery ...".
// Exit status 1 on any unexpected outcome or when no call succeeded; 2 for bad flags or set-up.
#include <grpcpp/grpcpp.h>
#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"
#include "offload/v1/x25519.grpc.pb.h"
#include "tests/load/load_support.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server address; loopback only.");
ABSL_FLAG(int, server_pid, 0, "Server process id, for its RSS (0: not reported).");
ABSL_FLAG(std::string, mode, "closed", "open (--rate calls/s offered) | closed (--inflight calls)");
ABSL_FLAG(double, rate, 1000, "Open loop: calls per second offered, whatever the answers.");
ABSL_FLAG(int, inflight, 16, "Closed loop: calls kept outstanding.");
ABSL_FLAG(int64_t, calls, 0,
          "Closed loop: send this many calls, then stop (0: --duration decides; with --calls, "
          "--duration is only a cap, 0 = none). The summary's rss_warm_mib is then read once "
          "--rss_warmup_fraction of the calls were sent: the same point of the work, whatever "
          "the machine's speed.");
ABSL_FLAG(int, senders, 1, "Open loop: threads sending calls, each at --rate / --senders.");
ABSL_FLAG(double, duration, 30, "Seconds of load after priming; 0 = until SIGINT or SIGTERM.");
ABSL_FLAG(double, warmup, 0,
          "Seconds at the start whose ok calls are left out of the summary's throughput and "
          "latency (errors always count).");
ABSL_FLAG(double, report_every, 10, "Seconds between interval lines.");
ABSL_FLAG(double, verify_weight, 1, "Relative share of Verify calls.");
ABSL_FLAG(double, derive_weight, 1, "Relative share of Derive calls.");
ABSL_FLAG(double, open_weight, 1, "Relative share of AeadOpen calls.");
ABSL_FLAG(double, warm_fraction, 0.8, "Share of good calls that repeat a warm input (memo hits).");
ABSL_FLAG(int, warm_set, 256, "Warm inputs per operation, sent once before the run.");
ABSL_FLAG(double, bad_fraction, 0.01, "Share of calls with bad input (each must get its code).");
ABSL_FLAG(double, verify_invalid_fraction, 0.05,
          "Share of fresh Verify calls whose signature is invalid (must answer valid=false).");
ABSL_FLAG(int, open_size, 256, "Plaintext bytes of each envelope.");
ABSL_FLAG(int, batch, 1,
          "Items per call: 1 = single Verify/Derive/Open calls; N > 1 = BatchVerify/BatchDerive/"
          "BatchOpen calls of N items (each item drawn from the mix on its own).");
ABSL_FLAG(int, fresh_pool, 0,
          "0: every fresh input is made for its call (signed, key pair made, sealed now). N > 0: "
          "fresh inputs cycle over N per operation made at start, so that the generator spends "
          "no crypto per call (overload runs); make N larger than the server's memo bounds hold "
          "for them to miss. Only their first round is checked for no memo hit.");
ABSL_FLAG(int, deadline_ms, 5000, "Deadline of each call.");
ABSL_FLAG(bool, deadline_exceeded_ok, false,
          "Count DEADLINE_EXCEEDED apart (overload runs) instead of as unexpected.");
ABSL_FLAG(int, channels, 2, "gRPC channels (TCP connections); calls are spread over them.");
ABSL_FLAG(int64_t, max_outstanding, 20000,
          "Open loop: most calls outstanding; a call due beyond it is skipped (and counted).");
ABSL_FLAG(double, recovery_seconds, 0,
          "Open loop: after --duration, stop the offered load and probe for this long.");
ABSL_FLAG(int, recovery_inflight, 16, "Calls the recovery probe keeps outstanding.");
ABSL_FLAG(double, normal_ok_per_s, 0,
          "Normal throughput of the probe (from a closed-loop run with --inflight = "
          "--recovery_inflight); 0 = the probe's own throughput in its last quarter.");
ABSL_FLAG(double, recovery_fraction, 0.8,
          "Recovered: the first 1 s window whose probe throughput reaches this share of normal.");
ABSL_FLAG(double, rss_warmup_fraction, 0.2,
          "The summary's rss_warm_mib is the server RSS at this fraction of --duration (of "
          "--calls with --calls).");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the traffic mix (0: random, printed).");
ABSL_FLAG(int, print_unexpected, 5, "Unexpected outcomes described on stderr (the first N).");

namespace offload::load {
namespace {

namespace v1 = ::offload::v1;
using Ms = std::chrono::milliseconds;

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted.store(true); }

enum Op { kVerify = 0, kDerive = 1, kOpen = 2, kOps = 3 };
constexpr const char* kOpNames[kOps] = {"verify", "derive", "open"};

enum Result { kOk = 0, kExpectedError, kExhausted, kDeadline, kUnexpected, kResults };

// What a call must get back. A good call expects OK and then `check` on the answer; a bad one
// expects `code`.
struct Expectation {
  grpc::StatusCode code = grpc::OK;
  bool fresh = false;     // never sent before: a memo hit would be a cache returning a wrong entry
  const char* what = "";  // the kind of input, for messages (a literal)
};

struct Outcome {
  Op op = kVerify;
  Result result = kOk;
  bool memo_hit = false;
  std::string detail;  // for kUnexpected
};

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c <= 16 ? kNames[c] : absl::StrCat("code ", c);
}

// Classifies the status of a finished call. For a good call that came back OK, returns kOk and
// leaves the answer check to the caller.
Result Classify(const grpc::Status& status, const Expectation& e, bool deadline_ok,
                std::string* detail) {
  if (status.error_code() == e.code) return e.code == grpc::OK ? kOk : kExpectedError;
  if (status.error_code() == grpc::RESOURCE_EXHAUSTED) return kExhausted;
  if (status.error_code() == grpc::DEADLINE_EXCEEDED && deadline_ok) return kDeadline;
  *detail = absl::StrCat(e.what, ": expected ", CodeName(e.code), ", got ",
                         CodeName(status.error_code()), " (", status.error_message(), ")");
  return kUnexpected;
}

using Rng = std::mt19937_64;

double Uniform(Rng& rng) { return std::uniform_real_distribution<double>(0, 1)(rng); }
size_t Pick(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

// ------------------------------------------------------------------------------------------
// The traffic: keys, warm and fresh inputs, and how each kind of item is sent and checked.

// One item of a call: the request message (the same type in a single and a batch call), what
// it must get, and the check of a good item's answer.
template <typename Req, typename Resp>
struct Item {
  Req req;
  Expectation e;
  std::function<void(const Resp&, Outcome*)> check;
};

// A single-RPC response seen as the batch item's response type (Verify: valid and memo_hit).
struct VerifyAnswer {
  bool valid = false;
  bool memo_hit = false;
};

// Called once per call with the RPC status and one Outcome per item.
using OnCall = std::function<void(const grpc::Status&, std::vector<Outcome>)>;

class Traffic {
 public:
  struct Options {
    double weights[kOps] = {1, 1, 1};
    double warm_fraction = 0.8;
    int warm_set = 256;
    int fresh_pool = 0;
    double bad_fraction = 0.01;
    double verify_invalid_fraction = 0.05;
    int open_size = 256;
    int batch = 1;
    Ms deadline{5000};
    bool deadline_exceeded_ok = false;
  };

  Traffic(Channels channels, Options options) : channels_(std::move(channels)), opt_(options) {
    for (const auto& c : channels_) {
      ed_.push_back(v1::Ed25519Service::NewStub(c));
      x_.push_back(v1::X25519Service::NewStub(c));
      aead_.push_back(v1::AeadService::NewStub(c));
    }
    double total = 0;
    for (double w : opt_.weights) total += std::max(0.0, w);
    double acc = 0;
    for (int op = 0; op < kOps; ++op) {
      acc += std::max(0.0, opt_.weights[op]) / total;
      cumulative_[op] = acc;
    }
  }

  ~Traffic() {
    for (auto& s : signer_secrets_) sodium_memzero(s.data(), s.size());
    sodium_memzero(aead_key_.data(), aead_key_.size());
    for (auto* peers : {&warm_peers_, &pool_peers_}) {
      for (auto& p : *peers) sodium_memzero(p.secret.data(), p.secret.size());
    }
  }

  // Creates the keys, the warm inputs and the fresh pools. Keys are deleted by Cleanup.
  absl::Status SetUp() {
    // Ed25519: a few local signers; warm signatures made here.
    for (int i = 0; i < 4; ++i) {
      std::string pk(crypto_sign_PUBLICKEYBYTES, '\0'), sk(crypto_sign_SECRETKEYBYTES, '\0');
      crypto_sign_keypair(U(pk), U(sk));
      signer_publics_.push_back(std::move(pk));
      signer_secrets_.push_back(std::move(sk));
    }
    for (int i = 0; i < opt_.warm_set; ++i) warm_signed_.push_back(SignFresh(i));

    // X25519: a server key; warm peers with their expected shared keys.
    dh_key_id_ = UniqueKeyId("mixed-dh");
    absl::StatusOr<v1::KeyInfo> dh = CreateKey(channels_[0], dh_key_id_, v1::KEY_TYPE_X25519);
    if (!dh.ok()) return dh.status();
    created_.push_back(dh_key_id_);
    server_dh_public_ = dh->versions(0).public_key();
    if (server_dh_public_.size() != crypto_scalarmult_BYTES) {
      return absl::InternalError("CreateKey: X25519 public key is not 32 bytes");
    }
    for (int i = 0; i < opt_.warm_set; ++i) warm_peers_.push_back(PeerWithAnswers());

    // AEAD: an imported XChaCha20-Poly1305 key, so that envelopes can be sealed locally without
    // the server's Seal recording them in the open memo.
    aead_key_id_ = UniqueKeyId("mixed-aead");
    aead_key_ = RandomString(crypto_aead_xchacha20poly1305_ietf_KEYBYTES);
    absl::StatusOr<v1::KeyInfo> aead =
        ImportKey(channels_[0], aead_key_id_, v1::KEY_TYPE_XCHACHA20_POLY1305, aead_key_);
    if (!aead.ok()) return aead.status();
    created_.push_back(aead_key_id_);
    aead_version_ = aead->current_version();
    for (int i = 0; i < opt_.warm_set; ++i) warm_sealed_.push_back(SealFresh());
    missing_key_id_ = UniqueKeyId("mixed-missing");

    // Fresh pools, made on every core: inputs cycled over instead of made per call.
    if (opt_.fresh_pool > 0) {
      const int n = opt_.fresh_pool;
      pool_signed_.resize(n);
      pool_peers_.resize(n);
      pool_sealed_.resize(n);
      const int threads = std::max(1u, std::thread::hardware_concurrency());
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([this, t, threads, n] {
          for (int i = t; i < n; i += threads) {
            pool_signed_[i] = SignFresh(i);
            pool_peers_[i] = PeerWithAnswers();
            pool_sealed_[i] = SealFresh();
          }
        });
      }
      for (auto& w : workers) w.join();
    }
    return absl::OkStatus();
  }

  void Cleanup() {
    for (const std::string& id : created_) {
      if (absl::Status s = DeleteKey(channels_[0], id); !s.ok()) {
        std::fprintf(stderr, "cleanup: %s\n", std::string(s.message()).c_str());
      }
    }
    created_.clear();
  }

  // Sends every warm input once as a single call, `inflight` calls outstanding; returns the
  // outcomes.
  std::vector<Outcome> Prime(int inflight) {
    std::vector<std::function<void(OnCall)>> calls;
    for (int i = 0; i < opt_.warm_set; ++i) {
      if (opt_.weights[kVerify] > 0) {
        calls.push_back([this, i](OnCall d) {
          SendVerify(0, {VerifyItemFor(warm_signed_[i], true, {grpc::OK, false, "warm verify"})},
                     false, std::move(d));
        });
      }
      if (opt_.weights[kDerive] > 0) {
        for (const auto output : {v1::DERIVE_OUTPUT_RAW, v1::DERIVE_OUTPUT_BOX_BEFORENM}) {
          calls.push_back([this, i, output](OnCall d) {
            SendDerive(0, {DeriveWith(warm_peers_[i], output, {grpc::OK, false, "warm derive"})},
                       false, std::move(d));
          });
        }
      }
      if (opt_.weights[kOpen] > 0) {
        calls.push_back([this, i](OnCall d) {
          SendOpen(0, {OpenOf(warm_sealed_[i], {grpc::OK, false, "warm open"})}, false,
                   std::move(d));
        });
      }
    }
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Outcome> outcomes;
    size_t next = 0, done = 0;
    std::function<void()> issue = [&] {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= calls.size()) return;
        i = next++;
      }
      calls[i]([&](const grpc::Status&, std::vector<Outcome> os) {
        {
          std::lock_guard<std::mutex> lock(mu);
          for (Outcome& o : os) outcomes.push_back(std::move(o));
        }
        issue();  // before counting this one done, so that Prime cannot return under it
        std::lock_guard<std::mutex> lock(mu);
        ++done;
        cv.notify_all();
      });
    };
    for (int k = 0; k < inflight; ++k) issue();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == calls.size(); });
    return outcomes;
  }

  // Starts one call of the mix on `channel` (a batch of --batch items of one operation when
  // --batch > 1); `done` runs once on a gRPC thread.
  void Issue(size_t channel, Rng& rng, OnCall done) {
    const double r = Uniform(rng);
    Op op = kOpen;
    for (int i = 0; i < kOps; ++i) {
      if (r < cumulative_[i]) {
        op = static_cast<Op>(i);
        break;
      }
    }
    const bool batch = opt_.batch > 1;
    const int n = std::max(1, opt_.batch);
    switch (op) {
      case kVerify: {
        std::vector<Item<v1::VerifyRequest, VerifyAnswer>> items;
        for (int i = 0; i < n; ++i) items.push_back(MakeVerify(rng));
        return SendVerify(channel, std::move(items), batch, std::move(done));
      }
      case kDerive: {
        std::vector<Item<v1::DeriveRequest, v1::DeriveResponse>> items;
        for (int i = 0; i < n; ++i) items.push_back(MakeDerive(rng));
        return SendDerive(channel, std::move(items), batch, std::move(done));
      }
      default: {
        std::vector<Item<v1::AeadOpenRequest, v1::AeadOpenResponse>> items;
        for (int i = 0; i < n; ++i) items.push_back(MakeOpen(rng));
        return SendOpen(channel, std::move(items), batch, std::move(done));
      }
    }
  }

 private:
  struct Signed {
    std::string public_key, signature, message;
  };
  struct Peer {
    std::string secret, public_key, raw, box;  // raw, box: the answers (empty: not computed)
  };
  struct Sealed {
    std::string envelope, aad, plaintext;
  };
  enum class Kind { kBad, kWarm, kFresh };

  static unsigned char* U(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }
  static const unsigned char* U(const std::string& s) {
    return reinterpret_cast<const unsigned char*>(s.data());
  }

  Kind PickKind(Rng& rng) const {
    if (Uniform(rng) < opt_.bad_fraction) return Kind::kBad;
    return Uniform(rng) < opt_.warm_fraction ? Kind::kWarm : Kind::kFresh;
  }
  // A fresh input from the pool is "never seen" only on its first round.
  Expectation FreshExpectation(const char* what) {
    const bool first_round =
        opt_.fresh_pool == 0 || pool_next_.load() < static_cast<uint64_t>(opt_.fresh_pool);
    return {grpc::OK, first_round, what};
  }
  size_t NextPoolIndex() { return pool_next_.fetch_add(1) % opt_.fresh_pool; }

  Signed SignFresh(size_t signer) const {
    signer %= signer_secrets_.size();
    Signed s{signer_publics_[signer], std::string(crypto_sign_BYTES, '\0'), RandomString(64)};
    crypto_sign_detached(U(s.signature), nullptr, U(s.message), s.message.size(),
                         U(signer_secrets_[signer]));
    return s;
  }

  static Peer NewPeer() {
    Peer p;
    p.secret.resize(crypto_box_SECRETKEYBYTES);
    p.public_key.resize(crypto_box_PUBLICKEYBYTES);
    crypto_box_keypair(U(p.public_key), U(p.secret));
    return p;
  }
  Peer PeerWithAnswers() const {
    Peer p = NewPeer();
    p.raw = ExpectedShared(p.secret, v1::DERIVE_OUTPUT_RAW);
    p.box = ExpectedShared(p.secret, v1::DERIVE_OUTPUT_BOX_BEFORENM);
    return p;
  }

  // What the server must answer for a peer whose secret is `secret`: libsodium's
  // crypto_scalarmult with the server key's public half, or crypto_box_beforenm (empty on
  // failure, which then fails the comparison).
  std::string ExpectedShared(const std::string& secret, v1::DeriveOutput output) const {
    std::string out(32, '\0');
    if (output == v1::DERIVE_OUTPUT_BOX_BEFORENM) {
      if (crypto_box_beforenm(U(out), U(server_dh_public_), U(secret)) != 0) return "";
    } else if (crypto_scalarmult(U(out), U(secret), U(server_dh_public_)) != 0) {
      return "";
    }
    return out;
  }

  Sealed SealFresh() const {
    Sealed s;
    s.plaintext = RandomString(opt_.open_size);
    s.aad = RandomString(16);
    s.envelope = SealEnvelope(aead_key_, aead_version_, /*xchacha=*/true, s.plaintext, s.aad);
    return s;
  }

  static void Fail(Outcome* o, const Expectation& e, const std::string& why) {
    o->result = kUnexpected;
    o->detail = absl::StrCat(e.what, ": ", why);
  }

  // Finishes one item: its status (the RPC's for a single call, the item's for a batch) and,
  // for a good item answered OK, its check and the memo check of fresh inputs.
  template <typename Req, typename Resp>
  Outcome Judge(Op op, const Item<Req, Resp>& item, const grpc::Status& status,
                const Resp& resp) const {
    Outcome o;
    o.op = op;
    o.result = Classify(status, item.e, opt_.deadline_exceeded_ok, &o.detail);
    if (o.result != kOk) return o;
    if (item.check) item.check(resp, &o);
    if (o.result == kOk && item.e.fresh && o.memo_hit) {
      Fail(&o, item.e, "memo_hit for an input never sent before");
    }
    return o;
  }

  // Sends `items` as one single call (REQUIRES: one item) or one batch call.
  template <typename Req, typename Resp, typename BatchReq, typename BatchResp, typename Single,
            typename Batch, typename ItemResponse>
  void Send(Op op, std::vector<Item<Req, Resp>> items, bool batch, Single single, Batch batch_call,
            ItemResponse item_response, OnCall done) {
    auto shared = std::make_shared<std::vector<Item<Req, Resp>>>(std::move(items));
    if (!batch) {
      single(shared, std::move(done));
      return;
    }
    StartUnary<BatchReq, BatchResp>(
        batch_call,
        [&shared](BatchReq* r) {
          for (auto& item : *shared) *r->add_items() = std::move(item.req);  // not read again
        },
        opt_.deadline,
        [this, op, shared, item_response, done = std::move(done)](const grpc::Status& status,
                                                                  const BatchResp& resp) {
          std::vector<Outcome> outcomes;
          if (status.ok() && resp.results_size() != static_cast<int>(shared->size())) {
            Outcome o;
            o.op = op;
            o.result = kUnexpected;
            o.detail = absl::StrCat("batch of ", shared->size(), " answered with ",
                                    resp.results_size(), " results");
            outcomes.assign(shared->size(), o);
          } else {
            for (size_t i = 0; i < shared->size(); ++i) {
              const auto& item = (*shared)[i];
              if (!status.ok()) {
                outcomes.push_back(Judge(op, item, status, Resp()));
                continue;
              }
              const auto& result = resp.results(static_cast<int>(i));
              const grpc::Status item_status(static_cast<grpc::StatusCode>(result.status().code()),
                                             result.status().message());
              outcomes.push_back(Judge(op, item, item_status, item_response(result)));
            }
          }
          done(status, std::move(outcomes));
        });
  }

  void SendVerify(size_t channel, std::vector<Item<v1::VerifyRequest, VerifyAnswer>> items,
                  bool batch, OnCall done) {
    auto* async = ed_[channel]->async();
    using Items = std::shared_ptr<std::vector<Item<v1::VerifyRequest, VerifyAnswer>>>;
    Send<v1::VerifyRequest, VerifyAnswer, v1::BatchVerifyRequest, v1::BatchVerifyResponse>(
        kVerify, std::move(items), batch,
        [this, async](Items shared, OnCall done) {
          StartUnary<v1::VerifyRequest, v1::VerifyResponse>(
              [async](auto... a) { async->Verify(a...); },
              [&shared](v1::VerifyRequest* r) { *r = std::move((*shared)[0].req); }, opt_.deadline,
              [this, shared, done = std::move(done)](const grpc::Status& status,
                                                     const v1::VerifyResponse& resp) {
                done(status, {Judge(kVerify, (*shared)[0], status,
                                    VerifyAnswer{resp.valid(), resp.memo_hit()})});
              });
        },
        [async](auto... a) { async->BatchVerify(a...); },
        [](const v1::BatchVerifyResult& r) {
          return VerifyAnswer{r.valid(), r.memo_hit()};
        },
        std::move(done));
  }

  void SendDerive(size_t channel, std::vector<Item<v1::DeriveRequest, v1::DeriveResponse>> items,
                  bool batch, OnCall done) {
    auto* async = x_[channel]->async();
    using Items = std::shared_ptr<std::vector<Item<v1::DeriveRequest, v1::DeriveResponse>>>;
    Send<v1::DeriveRequest, v1::DeriveResponse, v1::BatchDeriveRequest, v1::BatchDeriveResponse>(
        kDerive, std::move(items), batch,
        [this, async](Items shared, OnCall done) {
          StartUnary<v1::DeriveRequest, v1::DeriveResponse>(
              [async](auto... a) { async->Derive(a...); },
              [&shared](v1::DeriveRequest* r) { *r = std::move((*shared)[0].req); }, opt_.deadline,
              [this, shared, done = std::move(done)](const grpc::Status& status,
                                                     const v1::DeriveResponse& resp) {
                done(status, {Judge(kDerive, (*shared)[0], status, resp)});
              });
        },
        [async](auto... a) { async->BatchDerive(a...); },
        [](const v1::BatchDeriveResult& r) { return r.response(); }, std::move(done));
  }

  void SendOpen(size_t channel, std::vector<Item<v1::AeadOpenRequest, v1::AeadOpenResponse>> items,
                bool batch, OnCall done) {
    auto* async = aead_[channel]->async();
    using Items = std::shared_ptr<std::vector<Item<v1::AeadOpenRequest, v1::AeadOpenResponse>>>;
    Send<v1::AeadOpenRequest, v1::AeadOpenResponse, v1::BatchAeadOpenRequest,
         v1::BatchAeadOpenResponse>(
        kOpen, std::move(items), batch,
        [this, async](Items shared, OnCall done) {
          StartUnary<v1::AeadOpenRequest, v1::AeadOpenResponse>(
              [async](auto... a) { async->Open(a...); },
              [&shared](v1::AeadOpenRequest* r) { *r = std::move((*shared)[0].req); },
              opt_.deadline,
              [this, shared, done = std::move(done)](const grpc::Status& status,
                                                     const v1::AeadOpenResponse& resp) {
                done(status, {Judge(kOpen, (*shared)[0], status, resp)});
              });
        },
        [async](auto... a) { async->BatchOpen(a...); },
        [](const v1::BatchAeadOpenResult& r) { return r.response(); }, std::move(done));
  }

  // -- items -------------------------------------------------------------------------------

  static Item<v1::VerifyRequest, VerifyAnswer> VerifyItemFor(const Signed& s, bool want_valid,
                                                             Expectation e) {
    Item<v1::VerifyRequest, VerifyAnswer> item;
    item.req.set_public_key(s.public_key);
    item.req.set_signature(s.signature);
    item.req.set_message(s.message);
    item.check = [want_valid, e](const VerifyAnswer& a, Outcome* o) {
      o->memo_hit = a.memo_hit;
      if (a.valid != want_valid) {
        Fail(o, e, absl::StrCat("valid=", a.valid, ", expected ", want_valid));
      } else if (!a.valid && a.memo_hit) {
        Fail(o, e, "an invalid signature answered from the memo");
      }
    };
    item.e = std::move(e);
    return item;
  }

  Item<v1::VerifyRequest, VerifyAnswer> MakeVerify(Rng& rng) {
    switch (PickKind(rng)) {
      case Kind::kBad: {
        Signed s = warm_signed_[Pick(rng, warm_signed_.size())];
        if (Pick(rng, 2) == 0) {
          s.public_key.resize(31);
          return VerifyItemFor(s, false, {grpc::INVALID_ARGUMENT, false, "31-byte public_key"});
        }
        s.signature.push_back('\0');
        return VerifyItemFor(s, false, {grpc::INVALID_ARGUMENT, false, "65-byte signature"});
      }
      case Kind::kWarm:
        return VerifyItemFor(warm_signed_[Pick(rng, warm_signed_.size())], true,
                             {grpc::OK, false, "warm verify"});
      case Kind::kFresh:
        break;
    }
    if (Uniform(rng) < opt_.verify_invalid_fraction) {
      Signed s = warm_signed_[Pick(rng, warm_signed_.size())];
      s.message[Pick(rng, s.message.size())] ^= static_cast<char>(1 + Pick(rng, 255));
      return VerifyItemFor(s, false, {grpc::OK, true, "invalid signature"});
    }
    if (opt_.fresh_pool > 0) {
      Expectation e = FreshExpectation("fresh verify");
      return VerifyItemFor(pool_signed_[NextPoolIndex()], true, std::move(e));
    }
    return VerifyItemFor(SignFresh(Pick(rng, signer_secrets_.size())), true,
                         {grpc::OK, true, "fresh verify"});
  }

  // A derive item for `peer`; its answer is checked against the peer's precomputed answer, or,
  // when none was computed (a peer made for this call), against one computed when the answer
  // arrives, so that the thread sending calls does not pay for it.
  Item<v1::DeriveRequest, v1::DeriveResponse> DeriveWith(const Peer& peer, v1::DeriveOutput output,
                                                         Expectation e,
                                                         const std::string& key_id = "",
                                                         std::string peer_key = "") const {
    Item<v1::DeriveRequest, v1::DeriveResponse> item;
    item.req.set_key_id(key_id.empty() ? dh_key_id_ : key_id);
    item.req.set_peer_public_key(peer_key.empty() ? peer.public_key : peer_key);
    item.req.set_output(output);
    std::string want = output == v1::DERIVE_OUTPUT_BOX_BEFORENM ? peer.box : peer.raw;
    auto secret = want.empty() ? std::make_shared<std::string>(peer.secret) : nullptr;
    item.check = [this, output, want, secret, e](const v1::DeriveResponse& resp, Outcome* o) {
      o->memo_hit = resp.memo_hit();
      const std::string expected = secret ? ExpectedShared(*secret, output) : want;
      if (resp.shared_key().size() != expected.size() ||
          sodium_memcmp(resp.shared_key().data(), expected.data(), expected.size()) != 0) {
        Fail(o, e, "shared_key differs from libsodium's");
      }
    };
    item.e = std::move(e);
    return item;
  }

  Item<v1::DeriveRequest, v1::DeriveResponse> MakeDerive(Rng& rng) {
    const v1::DeriveOutput output =
        Pick(rng, 4) == 0 ? v1::DERIVE_OUTPUT_BOX_BEFORENM : v1::DERIVE_OUTPUT_RAW;
    switch (PickKind(rng)) {
      case Kind::kBad: {
        const Peer& p = warm_peers_[Pick(rng, warm_peers_.size())];
        switch (Pick(rng, 4)) {
          case 0:
            return DeriveWith(p, output, {grpc::INVALID_ARGUMENT, false, "33-byte peer_public_key"},
                              "", p.public_key + std::string(1, '\1'));
          case 1:
            return DeriveWith(p, output, {grpc::NOT_FOUND, false, "derive with an unknown key id"},
                              missing_key_id_);
          case 2:
            return DeriveWith(p, output, {grpc::INVALID_ARGUMENT, false, "small-order peer"}, "",
                              std::string(32, '\0'));
          default:
            return DeriveWith(p, output,
                              {grpc::FAILED_PRECONDITION, false, "derive with an AEAD key"},
                              aead_key_id_);
        }
      }
      case Kind::kWarm:
        return DeriveWith(warm_peers_[Pick(rng, warm_peers_.size())], output,
                          {grpc::OK, false, "warm derive"});
      case Kind::kFresh:
        break;
    }
    if (opt_.fresh_pool > 0) {
      Expectation e = FreshExpectation("fresh derive");
      return DeriveWith(pool_peers_[NextPoolIndex()], output, std::move(e));
    }
    Peer p = NewPeer();
    Item<v1::DeriveRequest, v1::DeriveResponse> item =
        DeriveWith(p, output, {grpc::OK, true, "fresh derive"});
    sodium_memzero(p.secret.data(), p.secret.size());
    return item;
  }

  Item<v1::AeadOpenRequest, v1::AeadOpenResponse> OpenOf(const Sealed& s, Expectation e,
                                                         const std::string& key_id = "") const {
    Item<v1::AeadOpenRequest, v1::AeadOpenResponse> item;
    item.req.set_key_id(key_id.empty() ? aead_key_id_ : key_id);
    item.req.set_envelope(s.envelope);
    item.req.set_associated_data(s.aad);
    item.check = [want = s.plaintext, e](const v1::AeadOpenResponse& resp, Outcome* o) {
      o->memo_hit = resp.memo_hit();
      if (resp.plaintext() != want) Fail(o, e, "plaintext differs from what was sealed");
    };
    item.e = std::move(e);
    return item;
  }

  Item<v1::AeadOpenRequest, v1::AeadOpenResponse> MakeOpen(Rng& rng) {
    switch (PickKind(rng)) {
      case Kind::kBad: {
        Sealed s = warm_sealed_[Pick(rng, warm_sealed_.size())];
        const size_t header = 5 + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
        switch (Pick(rng, 5)) {
          case 0:
            return OpenOf(s, {grpc::NOT_FOUND, false, "open with an unknown key id"},
                          missing_key_id_);
          case 1: {
            // Any byte after the header: ciphertext or tag. A warm envelope, so that a memo that
            // matched on less than the whole envelope would answer it.
            const size_t at = header + Pick(rng, s.envelope.size() - header);
            s.envelope[at] ^= static_cast<char>(1 + Pick(rng, 255));
            return OpenOf(s, {grpc::INVALID_ARGUMENT, false, "tampered envelope"});
          }
          case 2:
            s.envelope.resize(header + 15);
            return OpenOf(s, {grpc::INVALID_ARGUMENT, false, "truncated envelope"});
          case 3: {
            const uint32_t v = aead_version_ + 1000;
            s.envelope[1] = static_cast<char>(v >> 24);
            s.envelope[2] = static_cast<char>(v >> 16);
            s.envelope[3] = static_cast<char>(v >> 8);
            s.envelope[4] = static_cast<char>(v);
            return OpenOf(s, {grpc::NOT_FOUND, false, "envelope naming a missing key version"});
          }
          default:
            s.aad[0] ^= 1;
            return OpenOf(s, {grpc::INVALID_ARGUMENT, false, "wrong associated data"});
        }
      }
      case Kind::kWarm:
        return OpenOf(warm_sealed_[Pick(rng, warm_sealed_.size())], {grpc::OK, false, "warm open"});
      case Kind::kFresh:
        break;
    }
    if (opt_.fresh_pool > 0) {
      Expectation e = FreshExpectation("fresh open");
      return OpenOf(pool_sealed_[NextPoolIndex()], std::move(e));
    }
    return OpenOf(SealFresh(), {grpc::OK, true, "fresh open"});
  }

  const Channels channels_;
  const Options opt_;
  double cumulative_[kOps] = {};
  std::vector<std::unique_ptr<v1::Ed25519Service::Stub>> ed_;
  std::vector<std::unique_ptr<v1::X25519Service::Stub>> x_;
  std::vector<std::unique_ptr<v1::AeadService::Stub>> aead_;
  std::vector<std::string> created_;
  std::vector<std::string> signer_publics_, signer_secrets_;
  std::vector<Signed> warm_signed_, pool_signed_;
  std::string dh_key_id_, server_dh_public_;
  std::vector<Peer> warm_peers_, pool_peers_;
  std::string aead_key_id_, aead_key_;
  uint32_t aead_version_ = 0;
  std::vector<Sealed> warm_sealed_, pool_sealed_;
  std::string missing_key_id_;
  std::atomic<uint64_t> pool_next_{0};
};

// ------------------------------------------------------------------------------------------
// Counting.

// Items and calls (the same with --batch=1).
struct Counts {
  int64_t sent = 0, skipped = 0;  // calls
  int64_t accepted_calls = 0;     // calls answered with no item shed, late or unexpected
  int64_t results[kResults] = {};
  int64_t ok_by_op[kOps] = {}, hits_by_op[kOps] = {};
  LatencyHistogram ok_latency, exhausted_latency;

  void Add(const Counts& o) {
    sent += o.sent;
    skipped += o.skipped;
    accepted_calls += o.accepted_calls;
    for (int i = 0; i < kResults; ++i) results[i] += o.results[i];
    for (int i = 0; i < kOps; ++i) {
      ok_by_op[i] += o.ok_by_op[i];
      hits_by_op[i] += o.hits_by_op[i];
    }
    ok_latency.Merge(o.ok_latency);
    exhausted_latency.Merge(o.exhausted_latency);
  }
  int64_t hits() const { return hits_by_op[0] + hits_by_op[1] + hits_by_op[2]; }
};

// Thread-safe tally of outcomes: the current interval (every call), the main phase's totals
// (calls started before the load stopped), and the recovery probe's bins.
class Tally {
 public:
  explicit Tally(int print_unexpected) : print_unexpected_(print_unexpected) {}

  // One finished call: its RPC status, one outcome per item, its latency. An accepted call
  // (at least one ok item; none shed, late or unexpected) counts in the latency percentiles.
  // `in_summary`: counted in the summary's throughput and latency (after --warmup).
  // `probe_bin` >= 0: a recovery probe call ending in that bin (not in the main totals).
  void Record(const grpc::Status& rpc, const std::vector<Outcome>& items, int64_t latency_ns,
              bool in_summary, int probe_bin) {
    std::lock_guard<std::mutex> lock(mu_);
    Counts& main = probe_bin >= 0 ? probe_ : main_;
    int64_t ok = 0;
    bool refused = false;
    for (const Outcome& o : items) {
      for (Counts* c : {&interval_, &main}) {
        ++c->results[o.result];
        if (o.result == kOk) {
          ++c->ok_by_op[o.op];
          c->hits_by_op[o.op] += o.memo_hit;
        }
      }
      ok += o.result == kOk;
      refused |= o.result == kExhausted || o.result == kDeadline || o.result == kUnexpected;
      if (o.result == kUnexpected && unexpected_printed_ < print_unexpected_) {
        ++unexpected_printed_;
        std::fprintf(stderr, "unexpected (%s): %s\n", kOpNames[o.op], o.detail.c_str());
      }
    }
    if (rpc.error_code() == grpc::RESOURCE_EXHAUSTED) {
      interval_.exhausted_latency.Record(latency_ns);
      main.exhausted_latency.Record(latency_ns);
    }
    if (ok > 0 && !refused) {
      ++interval_.accepted_calls;
      ++main.accepted_calls;
      interval_.ok_latency.Record(latency_ns);
      if (in_summary) {
        summary_ok_ += ok;
        ++summary_calls_;
        summary_latency_.Record(latency_ns);
      }
    }
    if (probe_bin >= 0 && ok > 0) {
      if (static_cast<size_t>(probe_bin) >= probe_bins_.size()) {
        probe_bins_.resize(probe_bin + 1, 0);
      }
      probe_bins_[probe_bin] += ok;
    }
  }

  void Sent(bool probe) {
    std::lock_guard<std::mutex> lock(mu_);
    ++interval_.sent;
    ++(probe ? probe_ : main_).sent;
  }
  void Skipped() {
    std::lock_guard<std::mutex> lock(mu_);
    ++interval_.skipped;
    ++main_.skipped;
  }

  // Ends the current interval and returns it.
  Counts TakeInterval() {
    std::lock_guard<std::mutex> lock(mu_);
    Counts c = std::move(interval_);
    interval_ = Counts();
    return c;
  }
  // REQUIRES: no call in flight.
  const Counts& main() const { return main_; }
  const Counts& probe() const { return probe_; }
  int64_t summary_ok() const { return summary_ok_; }
  int64_t summary_calls() const { return summary_calls_; }
  const LatencyHistogram& summary_latency() const { return summary_latency_; }
  std::vector<int64_t> probe_bins() const {
    std::lock_guard<std::mutex> lock(mu_);
    return probe_bins_;
  }

 private:
  const int print_unexpected_;
  mutable std::mutex mu_;
  Counts interval_;
  Counts main_;
  Counts probe_;
  int64_t summary_ok_ = 0, summary_calls_ = 0;
  LatencyHistogram summary_latency_;
  std::vector<int64_t> probe_bins_;
  int unexpected_printed_ = 0;
};

// ------------------------------------------------------------------------------------------
// Driving the load.

Rng& ThreadRng(uint64_t seed) {
  static std::atomic<uint64_t> next_stream{0};
  thread_local Rng rng(seed + 0x9E3779B97F4A7C15ULL * (next_stream.fetch_add(1) + 1));
  return rng;
}

class Driver {
 public:
  Driver(Traffic* traffic, Tally* tally, size_t channels, uint64_t seed)
      : traffic_(traffic), tally_(tally), channels_(channels), seed_(seed) {}

  void set_summary_from(int64_t ns) { summary_from_ns_ = ns; }
  int64_t outstanding() const { return outstanding_.load(); }

  // Closed loop: keeps `n` calls outstanding until StopClosed, or until `call_limit` (> 0) calls
  // were sent. `probe_origin_ns` > 0 tags the calls as recovery probes, binned by completion
  // time since that origin.
  void StartClosed(int n, int64_t probe_origin_ns = 0, int64_t call_limit = 0) {
    probe_origin_ns_.store(probe_origin_ns);
    call_limit_.store(call_limit);
    closed_issued_.store(0);
    closed_running_.store(true);
    for (int i = 0; i < n; ++i) IssueClosed();
  }
  // Calls the closed loop has sent since StartClosed (at most its `call_limit`).
  int64_t closed_issued() const {
    const int64_t limit = call_limit_.load(), issued = closed_issued_.load();
    return limit > 0 ? std::min(limit, issued) : issued;
  }
  void StopClosed() { closed_running_.store(false); }

  // Open loop on the calling thread: `rate` calls/s until `end_ns` or an interrupt; a call due
  // while `max_outstanding` are out is skipped. Returns the calls due (sent + skipped).
  // The same with `senders` threads sharing the rate.
  int64_t RunOpen(double rate, int64_t end_ns, int64_t max_outstanding, int senders) {
    std::atomic<int64_t> due{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < senders; ++i) {
      threads.emplace_back([&] { due += RunOpen(rate / senders, end_ns, max_outstanding); });
    }
    for (auto& t : threads) t.join();
    return due.load();
  }

  int64_t RunOpen(double rate, int64_t end_ns, int64_t max_outstanding) {
    const int64_t start = NowNs();
    int64_t due_done = 0;
    Rng& rng = ThreadRng(seed_);
    while (!g_interrupted.load()) {
      const int64_t now = NowNs();
      if (now >= end_ns) break;
      const int64_t due = static_cast<int64_t>((now - start) / 1e9 * rate);
      while (due_done < due && (due_done % 64 != 0 || NowNs() < end_ns)) {
        ++due_done;
        if (outstanding_.load() >= max_outstanding) {
          tally_->Skipped();
          continue;
        }
        Issue(rng, /*closed=*/false, /*probe_origin=*/0);
      }
      const int64_t next_due = start + static_cast<int64_t>((due_done + 1) / rate * 1e9);
      const int64_t wait = std::min<int64_t>(next_due - NowNs(), 1000000);
      if (wait > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
    }
    return due_done;
  }

  // Waits until no call is outstanding (each has a deadline).
  void Drain() {
    while (outstanding_.load() > 0) std::this_thread::sleep_for(Ms(10));
  }

  static constexpr int64_t kProbeBinNs = 250000000;  // 0.25 s

 private:
  void IssueClosed() {
    if (!closed_running_.load() || g_interrupted.load()) return;
    const int64_t limit = call_limit_.load();
    if (closed_issued_.fetch_add(1) >= limit && limit > 0) return;
    Issue(ThreadRng(seed_), /*closed=*/true, probe_origin_ns_.load());
  }

  void Issue(Rng& rng, bool closed, int64_t probe_origin) {
    tally_->Sent(probe_origin > 0);
    outstanding_.fetch_add(1);
    const int64_t start = NowNs();
    const size_t channel = next_channel_.fetch_add(1) % channels_;
    traffic_->Issue(
        channel, rng,
        [this, start, closed, probe_origin](const grpc::Status& rpc, std::vector<Outcome> items) {
          const int64_t now = NowNs();
          const int bin =
              probe_origin > 0 ? static_cast<int>((now - probe_origin) / kProbeBinNs) : -1;
          tally_->Record(rpc, items, now - start,
                         probe_origin == 0 && start >= summary_from_ns_.load(), bin);
          outstanding_.fetch_sub(1);
          if (closed) IssueClosed();
        });
  }

  Traffic* const traffic_;
  Tally* const tally_;
  const size_t channels_;
  const uint64_t seed_;
  std::atomic<int64_t> outstanding_{0};
  std::atomic<size_t> next_channel_{0};
  std::atomic<bool> closed_running_{false};
  std::atomic<int64_t> call_limit_{0};
  std::atomic<int64_t> closed_issued_{0};
  std::atomic<int64_t> summary_from_ns_{0};
  std::atomic<int64_t> probe_origin_ns_{0};
};

double Mib(int64_t kib) { return kib / 1024.0; }
double MsOf(int64_t ns) { return ns / 1e6; }

int64_t RssKib(int pid) {
  absl::StatusOr<int64_t> kib = ProcessStatusKib(pid, "VmRSS");
  return kib.ok() ? *kib : -1;
}

void PrintInterval(double t, double seconds, const Counts& c, int64_t rss_kib,
                   int64_t outstanding) {
  const int64_t ok = c.results[kOk];
  std::printf(
      "interval t=%.1f ok_per_s=%.0f calls_per_s=%.0f sent_per_s=%.0f p50_ms=%.2f p99_ms=%.2f "
      "hit=%.3f "
      "expected_err=%" PRId64 " exhausted=%" PRId64 " deadline=%" PRId64 " unexpected=%" PRId64
      " skipped=%" PRId64 " outstanding=%" PRId64 " rss_mib=%.1f\n",
      t, seconds > 0 ? ok / seconds : 0, seconds > 0 ? c.accepted_calls / seconds : 0,
      seconds > 0 ? c.sent / seconds : 0, MsOf(c.ok_latency.PercentileNs(0.5)),
      MsOf(c.ok_latency.PercentileNs(0.99)), ok > 0 ? static_cast<double>(c.hits()) / ok : 0,
      c.results[kExpectedError], c.results[kExhausted], c.results[kDeadline],
      c.results[kUnexpected], c.skipped, outstanding, rss_kib >= 0 ? Mib(rss_kib) : -1.0);
  std::fflush(stdout);
}

int Main() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "open" && mode != "closed") {
    std::fprintf(stderr, "--mode: expected open or closed, got %s\n", mode.c_str());
    return 2;
  }
  const bool open = mode == "open";
  const double rate = absl::GetFlag(FLAGS_rate);
  if (open && !(rate > 0)) {
    std::fprintf(stderr, "--rate: expected > 0, got %g\n", rate);
    return 2;
  }
  Traffic::Options topt;
  topt.weights[kVerify] = absl::GetFlag(FLAGS_verify_weight);
  topt.weights[kDerive] = absl::GetFlag(FLAGS_derive_weight);
  topt.weights[kOpen] = absl::GetFlag(FLAGS_open_weight);
  if (topt.weights[0] + topt.weights[1] + topt.weights[2] <= 0) {
    std::fprintf(stderr, "--*_weight: at least one weight must be positive\n");
    return 2;
  }
  topt.warm_fraction = absl::GetFlag(FLAGS_warm_fraction);
  topt.warm_set = std::max(1, absl::GetFlag(FLAGS_warm_set));
  topt.bad_fraction = absl::GetFlag(FLAGS_bad_fraction);
  topt.verify_invalid_fraction = absl::GetFlag(FLAGS_verify_invalid_fraction);
  topt.open_size = std::max(1, absl::GetFlag(FLAGS_open_size));
  topt.deadline = Ms(std::max(1, absl::GetFlag(FLAGS_deadline_ms)));
  topt.deadline_exceeded_ok = absl::GetFlag(FLAGS_deadline_exceeded_ok);
  topt.batch = std::max(1, absl::GetFlag(FLAGS_batch));
  topt.fresh_pool = std::max(0, absl::GetFlag(FLAGS_fresh_pool));
  const int server_pid = absl::GetFlag(FLAGS_server_pid);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = (uint64_t{randombytes_random()} << 32) | randombytes_random();

  absl::StatusOr<Channels> channels =
      ConnectChannels(absl::GetFlag(FLAGS_server), absl::GetFlag(FLAGS_channels), Ms(5000));
  if (!channels.ok()) {
    std::fprintf(stderr, "%s\n", std::string(channels.status().message()).c_str());
    return channels.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const size_t channel_count = channels->size();
  Traffic traffic(*channels, topt);
  if (absl::Status s = traffic.SetUp(); !s.ok()) {
    std::fprintf(stderr, "set-up: %s\n", std::string(s.message()).c_str());
    traffic.Cleanup();
    return 2;
  }

  std::printf(
      "mixed load: mode=%s %s weights verify=%g derive=%g open=%g warm_fraction=%g warm_set=%d "
      "bad_fraction=%g open_size=%d batch=%d fresh_pool=%d deadline_ms=%d channels=%zu "
      "seed=%" PRIu64 "\n",
      mode.c_str(),
      open ? absl::StrCat("rate=", rate).c_str()
           : absl::StrCat("inflight=", absl::GetFlag(FLAGS_inflight)).c_str(),
      topt.weights[0], topt.weights[1], topt.weights[2], topt.warm_fraction, topt.warm_set,
      topt.bad_fraction, topt.open_size, topt.batch, topt.fresh_pool,
      absl::GetFlag(FLAGS_deadline_ms), channel_count, seed);

  // Priming: every warm input once, checked like any call.
  int64_t prime_unexpected = 0;
  {
    const int64_t t0 = NowNs();
    std::vector<Outcome> primed = traffic.Prime(16);
    int printed = 0;
    for (const Outcome& o : primed) {
      if (o.result == kOk) continue;
      ++prime_unexpected;
      if (printed++ < absl::GetFlag(FLAGS_print_unexpected)) {
        std::fprintf(stderr, "priming (%s): result %d %s\n", kOpNames[o.op], o.result,
                     o.detail.c_str());
      }
    }
    std::printf("primed %zu warm inputs in %.2f s, %" PRId64 " not ok\n", primed.size(),
                (NowNs() - t0) / 1e9, prime_unexpected);
  }

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  Tally tally(absl::GetFlag(FLAGS_print_unexpected));
  Driver driver(&traffic, &tally, channel_count, seed);
  const double duration = absl::GetFlag(FLAGS_duration);
  const int64_t call_limit = open ? 0 : std::max<int64_t>(0, absl::GetFlag(FLAGS_calls));
  const double report_every = std::max(0.1, absl::GetFlag(FLAGS_report_every));
  const int64_t start = NowNs();
  const int64_t end = duration > 0 ? start + static_cast<int64_t>(duration * 1e9) : INT64_MAX;
  driver.set_summary_from(start + static_cast<int64_t>(absl::GetFlag(FLAGS_warmup) * 1e9));
  const int64_t rss_start = RssKib(server_pid);
  const int64_t server_cpu0 = ProcessCpuMicros(server_pid), self_cpu0 = SelfCpuMicros();
  const double rss_warm_at = duration * absl::GetFlag(FLAGS_rss_warmup_fraction);
  int64_t rss_warm = -1, rss_last = rss_start, rss_max = rss_start;

  // The reporter: interval lines and an RSS sample every second, on its own thread.
  std::atomic<bool> reporting{true};
  std::thread reporter([&] {
    int64_t last_report = start, last_sample = start;
    while (reporting.load()) {
      std::this_thread::sleep_for(Ms(100));
      const int64_t now = NowNs();
      const double t = (now - start) / 1e9;
      if (now - last_sample >= 1000000000 || now - last_report >= report_every * 1e9) {
        last_sample = now;
        const int64_t rss = RssKib(server_pid);
        rss_last = rss;
        rss_max = std::max(rss_max, rss);
        if (call_limit == 0 && rss_warm < 0 && duration > 0 && t >= rss_warm_at) rss_warm = rss;
      }
      if (now - last_report >= report_every * 1e9) {
        const Counts c = tally.TakeInterval();
        PrintInterval(t, (now - last_report) / 1e9, c, rss_last, driver.outstanding());
        last_report = now;
      }
    }
    const int64_t now = NowNs();
    const Counts c = tally.TakeInterval();
    if (c.sent > 0 || c.results[kOk] > 0) {
      PrintInterval((now - start) / 1e9, (now - last_report) / 1e9, c, RssKib(server_pid),
                    driver.outstanding());
    }
  });

  int64_t due = 0;
  int64_t load_end = 0;
  if (open) {
    due = driver.RunOpen(rate, end, absl::GetFlag(FLAGS_max_outstanding),
                         std::max(1, absl::GetFlag(FLAGS_senders)));
    load_end = NowNs();
  } else {
    driver.StartClosed(std::max(1, absl::GetFlag(FLAGS_inflight)), 0, call_limit);
    const int64_t warm_calls = static_cast<int64_t>(
        static_cast<double>(call_limit) * absl::GetFlag(FLAGS_rss_warmup_fraction));
    while (!g_interrupted.load() && NowNs() < end) {
      if (call_limit > 0) {
        // rss_warm: only this thread writes it in this mode (the reporter leaves it alone).
        if (rss_warm < 0 && driver.closed_issued() >= warm_calls) {
          rss_warm = RssKib(server_pid);
          std::printf("warm calls=%" PRId64 " rss_mib=%.1f\n", driver.closed_issued(),
                      Mib(rss_warm));
          std::fflush(stdout);
        }
        if (driver.closed_issued() >= call_limit && driver.outstanding() == 0) break;
      }
      std::this_thread::sleep_for(Ms(20));
    }
    driver.StopClosed();
    load_end = NowNs();
  }
  const int64_t rss_at_load_end = RssKib(server_pid);
  const int64_t server_cpu1 = ProcessCpuMicros(server_pid), self_cpu1 = SelfCpuMicros();
  const int64_t backlog = driver.outstanding();

  // Recovery: the offered load has stopped (its calls still out); a closed-loop probe runs.
  const double recovery_s = absl::GetFlag(FLAGS_recovery_seconds);
  const bool recovery = open && recovery_s > 0 && !g_interrupted.load();
  if (recovery) {
    std::printf("load stopped: %" PRId64
                " calls still outstanding; recovery probe with %d "
                "in flight for %.0f s\n",
                backlog, absl::GetFlag(FLAGS_recovery_inflight), recovery_s);
    std::fflush(stdout);
    driver.StartClosed(std::max(1, absl::GetFlag(FLAGS_recovery_inflight)), load_end);
    const int64_t probe_end = load_end + static_cast<int64_t>(recovery_s * 1e9);
    while (!g_interrupted.load() && NowNs() < probe_end) std::this_thread::sleep_for(Ms(20));
    driver.StopClosed();
  }
  driver.Drain();
  reporting.store(false);
  reporter.join();
  traffic.Cleanup();

  // Summary.
  const Counts& total = tally.main();
  const double seconds = (load_end - start) / 1e9;
  const double summary_seconds =
      std::max(1e-9, seconds - std::min(seconds, absl::GetFlag(FLAGS_warmup)));
  const int64_t answered = total.results[kOk] + total.results[kExpectedError] +
                           total.results[kExhausted] + total.results[kDeadline] +
                           total.results[kUnexpected];
  const int64_t unexpected =
      total.results[kUnexpected] + tally.probe().results[kUnexpected] + prime_unexpected;
  const LatencyHistogram& lat = tally.summary_latency();
  const int64_t hwm = [&] {
    absl::StatusOr<int64_t> k = ProcessStatusKib(server_pid, "VmHWM");
    return k.ok() ? *k : int64_t{-1};
  }();
  if (rss_warm < 0) rss_warm = rss_start;
  const int64_t rss_end = rss_at_load_end >= 0 ? rss_at_load_end : rss_last;
  rss_max = std::max(rss_max, rss_end);
  std::printf("summary mode=%s seconds=%.1f offered_per_s=%.0f sent=%" PRId64
              " sent_per_s=%.0f"
              " skipped=%" PRId64 " ok=%" PRId64
              " ok_per_s=%.1f calls_per_s=%.1f p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.1f"
              " hit=%.3f expected_err=%" PRId64 " exhausted=%" PRId64
              " exhausted_share=%.4f"
              " exhausted_p99_ms=%.3f deadline=%" PRId64 " deadline_share=%.4f unexpected=%" PRId64
              " rss_start_mib=%.1f rss_warm_mib=%.1f rss_end_mib=%.1f rss_max_mib=%.1f"
              " rss_growth_after_warmup=%.4f server_hwm_mib=%.1f server_cpu_us_per_call=%.1f"
              " client_cpu_us_per_call=%.1f\n",
              mode.c_str(), seconds, open ? due / std::max(seconds, 1e-9) : 0.0, total.sent,
              total.sent / std::max(seconds, 1e-9), total.skipped, total.results[kOk],
              tally.summary_ok() / summary_seconds, tally.summary_calls() / summary_seconds,
              MsOf(lat.PercentileNs(0.5)), MsOf(lat.PercentileNs(0.99)),
              MsOf(lat.PercentileNs(0.999)), MsOf(lat.max_ns()),
              total.results[kOk] > 0 ? static_cast<double>(total.hits()) / total.results[kOk] : 0,
              total.results[kExpectedError], total.results[kExhausted],
              answered > 0 ? static_cast<double>(total.results[kExhausted]) / answered : 0,
              MsOf(total.exhausted_latency.PercentileNs(0.99)), total.results[kDeadline],
              answered > 0 ? static_cast<double>(total.results[kDeadline]) / answered : 0,
              unexpected, Mib(rss_start), Mib(rss_warm), Mib(rss_end), Mib(rss_max),
              rss_warm > 0 ? static_cast<double>(rss_end - rss_warm) / rss_warm : 0, Mib(hwm),
              server_cpu0 >= 0 && server_cpu1 >= 0 && total.sent > 0
                  ? static_cast<double>(server_cpu1 - server_cpu0) / total.sent
                  : -1.0,
              total.sent > 0 ? static_cast<double>(self_cpu1 - self_cpu0) / total.sent : -1.0);
  for (int op = 0; op < kOps; ++op) {
    std::printf("op %s ok=%" PRId64 " hit=%.3f\n", kOpNames[op], total.ok_by_op[op],
                total.ok_by_op[op] > 0
                    ? static_cast<double>(total.hits_by_op[op]) / total.ok_by_op[op]
                    : 0);
  }

  if (recovery) {
    const std::vector<int64_t> bins = tally.probe_bins();
    const double bin_s = Driver::kProbeBinNs / 1e9;
    const int per_window = static_cast<int>(1.0 / bin_s + 0.5);
    double normal = absl::GetFlag(FLAGS_normal_ok_per_s);
    if (normal <= 0 && !bins.empty()) {  // the probe's own last quarter
      const size_t from = bins.size() * 3 / 4;
      int64_t n = 0;
      for (size_t i = from; i < bins.size(); ++i) n += bins[i];
      normal = n / ((bins.size() - from) * bin_s);
    }
    const double target = normal * absl::GetFlag(FLAGS_recovery_fraction);
    double recovered_after = -1;
    for (size_t i = 0; i + per_window <= bins.size(); ++i) {
      int64_t n = 0;
      for (int j = 0; j < per_window; ++j) n += bins[i + j];
      if (n / (per_window * bin_s) >= target) {
        recovered_after = i * bin_s;
        break;
      }
    }
    std::string series;
    for (size_t i = 0; i + 1 < bins.size() && i < 80; i += 2) {
      absl::StrAppend(&series, i == 0 ? "" : ",",
                      static_cast<int64_t>((bins[i] + bins[i + 1]) / (2 * bin_s)));
    }
    std::printf("recovery backlog_at_stop=%" PRId64
                " normal_ok_per_s=%.0f target_ok_per_s=%.0f "
                "recovered_after_s=%s probe_ok_per_s_by_half_second=%s\n",
                backlog, normal, target,
                recovered_after >= 0 ? absl::StrCat(recovered_after).c_str() : "never",
                series.c_str());
  }
  if (open && due < 0.95 * rate * seconds) {
    std::printf(
        "note: the generator fell behind: %.0f calls/s due of %.0f asked (CPU-bound "
        "client; see client_cpu_us_per_call)\n",
        due / std::max(seconds, 1e-9), rate);
  }
  std::fflush(stdout);
  if (unexpected > 0) {
    std::fprintf(stderr, "FAIL: %" PRId64 " unexpected outcomes\n", unexpected);
    return 1;
  }
  if (total.results[kOk] == 0) {
    std::fprintf(stderr, "FAIL: no call succeeded\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace offload::load

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Mixed-traffic load generator for offload_server. See tests/load/offload_mixed_load.cc.");
  absl::ParseCommandLine(argc, argv);
  if (sodium_init() < 0) return 2;
  return offload::load::Main();
}
