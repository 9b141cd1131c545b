// The memo caches at work through the real operations: real keys in a real file store, real
// ciphers (counted where they run), the real worker pool.
#include "service/ops/operations.h"

#include <sodium.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "service/crypto/op_counts.h"
#include "service/ops/test_stack.h"

namespace offload::ops {
namespace {

using crypto::CryptoOp;
using crypto::CryptoOpCount;

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class OperationsTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(memo::MemoOptions{}); }

  void Start(memo::MemoOptions memo_options) {
    auto stack = TestStack::Create(memo_options);
    ASSERT_TRUE(stack.ok()) << stack.status();
    stack_ = *std::move(stack);
    keys_ = stack_->keys.get();
    memo_ = stack_->memo.get();
    pool_ = stack_->pool.get();
    ops_ = stack_->ops.get();
  }

  void TearDown() override { stack_.reset(); }

  void CreateKey(const std::string& id, v1::KeyType type) {
    v1::CreateKeyRequest request;
    request.set_key_id(id);
    request.set_type(type);
    ASSERT_TRUE(keys_->CreateKey(request).ok());
  }

  std::string Seal(const std::string& key_id, const std::string& plaintext,
                   const std::string& aad = "") {
    v1::AeadSealRequest request;
    request.set_key_id(key_id);
    request.set_plaintext(plaintext);
    request.set_associated_data(aad);
    v1::AeadSealResponse response;
    EXPECT_TRUE(ops_->AeadSeal(request, &response).ok());
    return response.envelope();
  }

  absl::Status Open(const std::string& key_id, const std::string& envelope,
                    v1::AeadOpenResponse* response, const std::string& aad = "") {
    v1::AeadOpenRequest request;
    request.set_key_id(key_id);
    request.set_envelope(envelope);
    request.set_associated_data(aad);
    return ops_->AeadOpen(request, response);
  }

  std::unique_ptr<TestStack> stack_;
  keys::KeyManager* keys_ = nullptr;
  memo::Memo* memo_ = nullptr;
  WorkerPool* pool_ = nullptr;
  Operations* ops_ = nullptr;
};

// The mobile app: 27 read-state blobs of 55 KB, opened on every resume. Ciphertexts made
// elsewhere (not by this process's Seal) so that the first round really decrypts.
TEST_F(OperationsTest, ReplayOf27BlobsRunsTheCipher27Times) {
  CreateKey("state", v1::KEY_TYPE_XCHACHA20_POLY1305);
  std::mt19937_64 rng(27);
  std::vector<std::string> envelopes, plaintexts;
  for (int i = 0; i < 27; ++i) {
    plaintexts.push_back(RandomBytes(55 * 1024, rng));
    envelopes.push_back(Seal("state", plaintexts.back()));
  }
  memo_->DropKey("state");  // forget what Seal recorded: as if sealed by another replica
  const uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
  int hits = 0;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 27; ++i) {
      v1::AeadOpenResponse response;
      ASSERT_TRUE(Open("state", envelopes[i], &response).ok());
      ASSERT_EQ(response.plaintext(), plaintexts[i]);
      EXPECT_EQ(response.memo_hit(), round == 1) << "round " << round << " blob " << i;
      hits += response.memo_hit();
    }
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 27u);
  EXPECT_EQ(hits, 27);
}

TEST_F(OperationsTest, SealedEnvelopeOpensWithZeroCipherRuns) {
  CreateKey("k", v1::KEY_TYPE_CHACHA20_POLY1305);
  const std::string envelope = Seal("k", "hello", "aad");
  const uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
  v1::AeadOpenResponse response;
  ASSERT_TRUE(Open("k", envelope, &response, "aad").ok());
  EXPECT_EQ(response.plaintext(), "hello");
  EXPECT_TRUE(response.memo_hit());
  EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 0u);
  // The same envelope with other associated data is not the same question: it fails.
  EXPECT_EQ(Open("k", envelope, &response, "other").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(OperationsTest, FailedOpenFailsEveryTimeAndIsNeverCached) {
  CreateKey("k", v1::KEY_TYPE_AES256_GCM);
  std::string envelope = Seal("k", std::string(1000, 'x'));
  // Tamper with the body but keep nonce and tag: the memo must not answer for it.
  envelope[100] ^= 1;
  const uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
  for (int i = 0; i < 5; ++i) {
    v1::AeadOpenResponse response;
    absl::Status s = Open("k", envelope, &response);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_FALSE(response.memo_hit());
    EXPECT_TRUE(response.plaintext().empty());
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 5u);
}

// [aead.proto, common.proto] Sizes are checked before anything else: an envelope too short for
// any algorithm or of another format is INVALID_ARGUMENT whatever the key id names (unknown,
// another type), for Open and Rewrap alike.
TEST_F(OperationsTest, MalformedEnvelopeIsRefusedBeforeTheKeyIsLookedUp) {
  CreateKey("ed", v1::KEY_TYPE_ED25519);
  CreateKey("k", v1::KEY_TYPE_CHACHA20_POLY1305);
  std::string format2 = Seal("k", "x");
  format2[0] = 2;
  for (const std::string& envelope :
       {std::string(), std::string("\x01"), std::string(32, '\x01'), format2}) {
    for (const char* key_id : {"nokey", "ed", "k"}) {
      v1::AeadOpenResponse opened;
      const absl::Status open = Open(key_id, envelope, &opened);
      EXPECT_EQ(open.code(), absl::StatusCode::kInvalidArgument) << key_id << ": " << open;
      EXPECT_TRUE(absl::StartsWith(open.message(), "envelope: ")) << open;
      v1::AeadRewrapRequest rewrap;
      rewrap.set_key_id(key_id);
      rewrap.set_envelope(envelope);
      v1::AeadRewrapResponse rewrapped;
      EXPECT_EQ(ops_->AeadRewrap(rewrap, &rewrapped).code(), absl::StatusCode::kInvalidArgument)
          << key_id;
    }
  }
  // A well-formed envelope still needs its key: the lookup decides, also for key version 0.
  v1::AeadOpenResponse opened;
  std::string version0 = Seal("k", "x");
  EXPECT_EQ(Open("nokey", version0, &opened).code(), absl::StatusCode::kNotFound);
  version0[1] = version0[2] = version0[3] = version0[4] = 0;
  EXPECT_EQ(Open("nokey", version0, &opened).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Open("k", version0, &opened).code(), absl::StatusCode::kInvalidArgument);
}

// The gRPC Open handler answers hits with AeadOpenFromMemo alone and sends misses to a worker
// for AeadOpenFresh: the two steps must give AeadOpen's answers and count one lookup per call.
TEST_F(OperationsTest, OpenInTwoStepsAnswersAsOpenAndCountsOneLookup) {
  CreateKey("k", v1::KEY_TYPE_XCHACHA20_POLY1305);
  const std::string envelope = Seal("k", std::string(3000, 'p'), "aad");
  std::string tampered = envelope;
  tampered[60] ^= 1;
  memo_->DropKey("k");  // as if sealed elsewhere: the first open decrypts
  auto two_steps = [&](const std::string& env, const std::string& key_id, bool* hit_inline,
                       v1::AeadOpenResponse* response) {
    v1::AeadOpenRequest request;
    request.set_key_id(key_id);
    request.set_envelope(env);
    request.set_associated_data("aad");
    Operations::OpenProbe probe;
    absl::Status status;
    *hit_inline = ops_->AeadOpenFromMemo(request, response, &probe, &status);
    return *hit_inline ? status : ops_->AeadOpenFresh(request, probe, response);
  };
  const memo::CacheStats start = memo_->open_stats();
  const uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
  for (int i = 0; i < 3; ++i) {
    v1::AeadOpenResponse split, whole;
    bool complete = false;
    ASSERT_TRUE(two_steps(envelope, "k", &complete, &split).ok());
    EXPECT_EQ(complete, i > 0) << "round " << i;  // the first round decrypts on a worker
    EXPECT_EQ(split.memo_hit(), i > 0);
    ASSERT_TRUE(Open("k", envelope, &whole, "aad").ok());
    EXPECT_TRUE(whole.memo_hit());  // the split call recorded it
    whole.set_memo_hit(split.memo_hit());
    EXPECT_EQ(split.SerializeAsString(), whole.SerializeAsString());
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 1u);
  const memo::CacheStats after = memo_->open_stats();
  EXPECT_EQ(after.hits - start.hits, 5u);
  EXPECT_EQ(after.misses - start.misses, 1u);

  // Errors come from the first step (unknown key) or the second (tampered body), never a hit.
  v1::AeadOpenResponse r;
  bool complete = false;
  EXPECT_EQ(two_steps(envelope, "nope", &complete, &r).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(complete);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(two_steps(tampered, "k", &complete, &r).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(complete);
    EXPECT_TRUE(r.plaintext().empty());
  }
}

// The zero-copy path of the gRPC Open handler: the wire form (prefix + shared plaintext +
// suffix) is byte for byte protobuf's serialization of AeadOpen's answer, a hit hands out the
// very buffer the fresh open wrote (no copy), and a tampered body that keeps nonce and tag fails
// on every try, as it would fresh.
TEST_F(OperationsTest, SharedOpenSerializesAsProtobufAndHitsWithoutACopy) {
  CreateKey("k", v1::KEY_TYPE_CHACHA20_POLY1305);
  std::mt19937_64 rng(15);
  auto wire = [](const Operations::OpenResult& r) {
    uint8_t prefix[Operations::OpenResult::kMaxWirePrefix];
    uint8_t suffix[Operations::OpenResult::kMaxWireSuffix];
    std::string out(reinterpret_cast<const char*>(prefix), r.WirePrefix(prefix));
    out.append(reinterpret_cast<const char*>(r.plaintext->data()), r.plaintext->size());
    out.append(reinterpret_cast<const char*>(suffix), r.WireSuffix(suffix));
    return out;
  };
  for (size_t size : {0, 1, 127, 128, 16383, 16384, 55000, 2100000}) {
    SCOPED_TRACE(size);
    const std::string plaintext = RandomBytes(size, rng);
    const std::string envelope = Seal("k", plaintext, "aad");
    memo_->DropKey("k");  // as if sealed elsewhere: the first open decrypts
    std::string tampered = envelope;
    if (size > 0) tampered[30] ^= 1;
    const uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
    const uint8_t* fresh_buffer = nullptr;
    for (int round = 0; round < 2; ++round) {
      v1::AeadOpenRequest request;
      request.set_key_id("k");
      request.set_envelope(envelope);
      request.set_associated_data("aad");
      Operations::OpenResult result;
      Operations::OpenProbe probe;
      absl::Status status;
      const bool complete = ops_->AeadOpenFromMemoShared(request, &result, &probe, &status);
      ASSERT_EQ(complete, round == 1);
      if (!complete) {
        ASSERT_TRUE(ops_->AeadOpenFreshShared(&request, probe, &result).ok());
        EXPECT_TRUE(request.envelope().empty());  // moved into the memo entry
        fresh_buffer = result.plaintext->data();
      } else {
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_EQ(result.plaintext->data(), fresh_buffer);  // the same bytes, not a copy
      }
      EXPECT_EQ(result.memo_hit, round == 1);
      v1::AeadOpenResponse expected;
      expected.set_plaintext(plaintext);
      expected.set_key_version(1);
      expected.set_memo_hit(round == 1);
      EXPECT_EQ(wire(result), expected.SerializeAsString());
      v1::AeadOpenResponse parsed;
      ASSERT_TRUE(parsed.ParseFromString(wire(result)));
      EXPECT_EQ(parsed.plaintext(), plaintext);
    }
    EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 1u);
    if (size == 0) continue;
    for (int i = 0; i < 2; ++i) {
      v1::AeadOpenRequest request;
      request.set_key_id("k");
      request.set_envelope(tampered);
      request.set_associated_data("aad");
      Operations::OpenResult result;
      Operations::OpenProbe probe;
      absl::Status status;
      ASSERT_FALSE(ops_->AeadOpenFromMemoShared(request, &result, &probe, &status));
      EXPECT_EQ(ops_->AeadOpenFreshShared(&request, probe, &result).code(),
                absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(result.plaintext, nullptr);
    }
  }
}

// [issue 34] A request read where it lies: the fresh open moves the body buffer itself into the
// memo (cut after the tag), and a later hit, by view or by message, answers from it.
TEST_F(OperationsTest, SharedOpenOverAViewMovesTheBodyIntoTheMemo) {
  CreateKey("k", v1::KEY_TYPE_XCHACHA20_POLY1305);
  std::mt19937_64 rng(34);
  const std::string plaintext = RandomBytes(55000, rng);
  const std::string envelope = Seal("k", plaintext, "the aad");
  memo_->DropKey("k");
  // A body: some bytes before the fields (a frame header), the key id, the envelope, the aad.
  std::string body = std::string("\x00\x00\x01\x02\x03", 5) + "key:k;" + envelope + ";aad:the aad";
  const size_t at = body.find(envelope);
  auto view_of = [&](const std::string& b) {
    return Operations::OpenRequestView{absl::string_view(b).substr(9, 1),
                                       absl::string_view(b).substr(at, envelope.size()),
                                       absl::string_view(b).substr(b.size() - 7)};
  };
  ASSERT_EQ(view_of(body).key_id, "k");
  ASSERT_EQ(view_of(body).associated_data, "the aad");
  const uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
  Operations::OpenResult result;
  Operations::OpenProbe probe;
  absl::Status status;
  ASSERT_FALSE(ops_->AeadOpenFromMemoShared(view_of(body), &result, &probe, &status));
  ASSERT_TRUE(status.ok()) << status;
  const absl::Status fresh = ops_->AeadOpenFreshShared(view_of(body), &body, probe, &result);
  ASSERT_TRUE(fresh.ok()) << fresh;
  EXPECT_TRUE(body.empty());  // moved into the memo entry
  ASSERT_NE(result.plaintext, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(result.plaintext->data()),
                        result.plaintext->size()),
            plaintext);
  EXPECT_FALSE(result.memo_hit);
  // The same envelope again, as a message: a hit on the stored bytes.
  v1::AeadOpenRequest request;
  request.set_key_id("k");
  request.set_envelope(envelope);
  request.set_associated_data("the aad");
  Operations::OpenResult hit;
  ASSERT_TRUE(ops_->AeadOpenFromMemoShared(request, &hit, &probe, &status));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(hit.memo_hit);
  EXPECT_EQ(hit.plaintext->data(), result.plaintext->data());
  EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 1u);
  // Another associated data is another entry, and fails to open.
  std::string other = std::string("\x00\x00\x01\x02\x03", 5) + "key:k;" + envelope + ";aad:not thi";
  Operations::OpenResult failed;
  ASSERT_FALSE(ops_->AeadOpenFromMemoShared(view_of(other), &failed, &probe, &status));
  EXPECT_EQ(ops_->AeadOpenFreshShared(view_of(other), &other, probe, &failed).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(other.empty());  // nothing stored for a failed open
}

TEST_F(OperationsTest, Derive15PeersOver100RoundsRuns15X25519) {
  CreateKey("dev", v1::KEY_TYPE_X25519);
  std::vector<std::string> peers;
  for (int i = 0; i < 15; ++i) {
    std::string pk(32, '\0'), sk(32, '\0');
    crypto_box_keypair(reinterpret_cast<uint8_t*>(pk.data()), reinterpret_cast<uint8_t*>(sk.data()));
    peers.push_back(pk);
  }
  const uint64_t before = CryptoOpCount(CryptoOp::kX25519);
  std::vector<std::string> first(15);
  int hits = 0;
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < 15; ++i) {
      v1::DeriveRequest request;
      request.set_key_id("dev");
      request.set_peer_public_key(peers[i]);
      request.set_output(v1::DERIVE_OUTPUT_BOX_BEFORENM);
      v1::DeriveResponse response;
      ASSERT_TRUE(ops_->Derive(request, &response).ok());
      if (round == 0) first[i] = response.shared_key();
      ASSERT_EQ(response.shared_key(), first[i]);
      hits += response.memo_hit();
    }
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kX25519) - before, 15u);
  EXPECT_EQ(hits, 15 * 99);
}

// The gRPC Derive handler's two steps (hit on the transport thread, X25519 on a worker) give
// Derive's answers, with one lookup per call; a small-order peer fails in the second step.
TEST_F(OperationsTest, DeriveInTwoStepsAnswersAsDerive) {
  CreateKey("dev", v1::KEY_TYPE_X25519);
  std::string pk(32, '\0'), sk(32, '\0');
  crypto_box_keypair(reinterpret_cast<uint8_t*>(pk.data()), reinterpret_cast<uint8_t*>(sk.data()));
  auto two_steps = [&](const std::string& peer, bool* complete, v1::DeriveResponse* response) {
    v1::DeriveRequest request;
    request.set_key_id("dev");
    request.set_peer_public_key(peer);
    Operations::DeriveProbe probe;
    absl::Status status;
    *complete = ops_->DeriveFromMemo(request, response, &probe, &status);
    return *complete ? status : ops_->DeriveFresh(request, probe, response);
  };
  const memo::CacheStats start = memo_->derive_stats();
  const uint64_t before = CryptoOpCount(CryptoOp::kX25519);
  for (int i = 0; i < 3; ++i) {
    v1::DeriveResponse split, whole;
    bool complete = false;
    ASSERT_TRUE(two_steps(pk, &complete, &split).ok());
    EXPECT_EQ(complete, i > 0);
    EXPECT_EQ(split.memo_hit(), i > 0);
    v1::DeriveRequest request;
    request.set_key_id("dev");
    request.set_peer_public_key(pk);
    ASSERT_TRUE(ops_->Derive(request, &whole).ok());
    EXPECT_TRUE(whole.memo_hit());  // the split call recorded it
    whole.set_memo_hit(split.memo_hit());
    EXPECT_EQ(split.SerializeAsString(), whole.SerializeAsString());
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kX25519) - before, 1u);
  EXPECT_EQ(memo_->derive_stats().hits - start.hits, 5u);
  EXPECT_EQ(memo_->derive_stats().misses - start.misses, 1u);

  v1::DeriveResponse r;
  bool complete = false;
  EXPECT_EQ(two_steps(std::string(32, '\0'), &complete, &r).code(),
            absl::StatusCode::kInvalidArgument);  // all-zero secret, rejected by default
  EXPECT_FALSE(complete);
  EXPECT_EQ(two_steps(std::string(31, 'x'), &complete, &r).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(complete);
}

TEST_F(OperationsTest, RepeatedValidVerifiesOnceInvalidEveryTime) {
  CreateKey("signer", v1::KEY_TYPE_ED25519);
  v1::SignRequest sign;
  sign.set_key_id("signer");
  sign.set_message(std::string(64, 'm'));
  v1::SignResponse signed_;
  ASSERT_TRUE(ops_->Sign(sign, &signed_).ok());
  v1::VerifyRequest good;
  good.set_public_key(signed_.public_key());
  good.set_message(sign.message());
  good.set_signature(signed_.signature());
  v1::VerifyRequest bad = good;
  bad.mutable_message()->back() ^= 1;

  uint64_t before = CryptoOpCount(CryptoOp::kEd25519Verify);
  for (int i = 0; i < 10; ++i) {
    v1::VerifyResponse r;
    ASSERT_TRUE(ops_->Verify(good, &r).ok());
    EXPECT_TRUE(r.valid());
    EXPECT_EQ(r.memo_hit(), i > 0);
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kEd25519Verify) - before, 1u);
  before = CryptoOpCount(CryptoOp::kEd25519Verify);
  for (int i = 0; i < 10; ++i) {
    v1::VerifyResponse r;
    ASSERT_TRUE(ops_->Verify(bad, &r).ok());
    EXPECT_FALSE(r.valid());
    EXPECT_FALSE(r.memo_hit());
  }
  EXPECT_EQ(CryptoOpCount(CryptoOp::kEd25519Verify) - before, 10u);
}

TEST_F(OperationsTest, BatchVerifyReportsMemoHitsPerItem) {
  CreateKey("signer", v1::KEY_TYPE_ED25519);
  v1::BatchVerifyRequest batch;
  for (int i = 0; i < 64; ++i) {
    v1::SignRequest sign;
    sign.set_key_id("signer");
    sign.set_message("message " + std::to_string(i));
    v1::SignResponse s;
    ASSERT_TRUE(ops_->Sign(sign, &s).ok());
    v1::VerifyRequest* item = batch.add_items();
    item->set_public_key(s.public_key());
    item->set_message(sign.message());
    item->set_signature(s.signature());
  }
  for (int round = 0; round < 2; ++round) {
    v1::BatchVerifyResponse response;
    absl::Notification done;
    ops_->BatchVerify(batch, &response, [&](absl::Status s) {
      EXPECT_TRUE(s.ok());
      done.Notify();
    });
    done.WaitForNotification();
    ASSERT_EQ(response.results_size(), 64);
    for (const auto& r : response.results()) {
      EXPECT_EQ(r.status().code(), 0);
      EXPECT_TRUE(r.valid());
      EXPECT_EQ(r.memo_hit(), round == 1);
    }
  }
}

// The gRPC BatchVerify handler answers the leading memo hits with BatchVerifyFromMemo on its own
// thread and sends the rest to the pool with BatchVerifyFresh: same results as BatchVerify, one
// memo lookup per item, and no signature checked twice.
// BatchDerive's leading memo hits are answered by BatchDeriveFromMemo (no X25519), the rest on
// the pool; the answers are the unary Derive's and every item is looked up once.
TEST_F(OperationsTest, BatchDeriveInTwoStepsAnswersAsDerive) {
  CreateKey("dh", v1::KEY_TYPE_X25519);
  std::vector<std::string> peers;
  for (int i = 0; i < 70; ++i) {
    unsigned char pk[32], sk[32];
    crypto_box_keypair(pk, sk);
    peers.emplace_back(reinterpret_cast<char*>(pk), 32);
  }
  auto item = [&](int i) {
    v1::DeriveRequest r;
    r.set_key_id("dh");
    r.set_peer_public_key(peers[i]);
    return r;
  };
  auto run = [&](const v1::BatchDeriveRequest& batch, bool* complete, int* next) {
    v1::BatchDeriveResponse response;
    Operations::BatchDeriveProbe probe;
    absl::Status status;
    *complete = ops_->BatchDeriveFromMemo(batch, &response, &probe, &status);
    *next = probe.next;
    if (*complete) return response;
    absl::Notification done;
    ops_->BatchDeriveFresh(batch, probe, &response, [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      done.Notify();
    });
    done.WaitForNotification();
    return response;
  };
  for (int i : {0, 1, 3}) {
    v1::DeriveResponse r;
    ASSERT_TRUE(ops_->Derive(item(i), &r).ok());  // recorded: later lookups hit
  }
  // hit, hit, miss, hit, a size error, miss.
  v1::BatchDeriveRequest mixed;
  for (int i : {0, 1, 2, 3}) *mixed.add_items() = item(i);
  v1::DeriveRequest* bad = mixed.add_items();
  *bad = item(4);
  bad->mutable_peer_public_key()->pop_back();
  *mixed.add_items() = item(5);
  const uint64_t before = CryptoOpCount(CryptoOp::kX25519);
  bool complete = true;
  int next = -1;
  v1::BatchDeriveResponse split = run(mixed, &complete, &next);
  EXPECT_FALSE(complete);
  EXPECT_EQ(next, 2);
  EXPECT_EQ(CryptoOpCount(CryptoOp::kX25519) - before, 2u);  // items 2 and 5
  ASSERT_EQ(split.results_size(), 6);
  const bool hits[] = {true, true, false, true, false, false};
  for (int i = 0; i < 6; ++i) {
    const auto& r = split.results(i);
    EXPECT_EQ(r.response().memo_hit(), hits[i]) << i;
    EXPECT_EQ(r.status().code(), i == 4 ? static_cast<int>(absl::StatusCode::kInvalidArgument) : 0)
        << i;
    if (i == 4) continue;
    v1::DeriveResponse single;
    ASSERT_TRUE(ops_->Derive(i == 5 ? item(5) : mixed.items(i), &single).ok());
    EXPECT_EQ(r.response().shared_key(), single.shared_key()) << i;
  }
  // Every item hits now: answered inline.
  split = run(mixed, &complete, &next);
  EXPECT_TRUE(complete);
  EXPECT_EQ(next, 6);
  // Beyond kMaxInlineVerifyItems hits, the rest goes to the pool.
  v1::BatchDeriveRequest many;
  for (int i = 0; i < 70; ++i) {
    v1::DeriveResponse r;
    ASSERT_TRUE(ops_->Derive(item(i), &r).ok());
    *many.add_items() = item(i);
  }
  split = run(many, &complete, &next);
  EXPECT_FALSE(complete);
  EXPECT_EQ(next, Operations::kMaxInlineVerifyItems);
  ASSERT_EQ(split.results_size(), 70);
  for (const auto& r : split.results()) EXPECT_TRUE(r.response().memo_hit());
}

// A batch's items share one probe, so a key found for one item serves the next item naming the
// same id; an item naming another key, an unknown id, a key of another type or a missing version
// must still get its own answer, before and after such a run.
TEST_F(OperationsTest, BatchDeriveItemsNamingDifferentKeysEachGetTheirOwn) {
  CreateKey("dh", v1::KEY_TYPE_X25519);
  CreateKey("dh2", v1::KEY_TYPE_X25519);
  CreateKey("aead", v1::KEY_TYPE_CHACHA20_POLY1305);
  unsigned char pk[32], sk[32];
  crypto_box_keypair(pk, sk);
  const std::string peer(reinterpret_cast<char*>(pk), 32);
  struct Item {
    const char* key_id;
    uint32_t version;
    absl::StatusCode code;
  };
  const Item items[] = {{"dh", 0, absl::StatusCode::kOk},
                        {"dh", 0, absl::StatusCode::kOk},
                        {"dh2", 0, absl::StatusCode::kOk},
                        {"nosuch", 0, absl::StatusCode::kNotFound},
                        {"dh2", 0, absl::StatusCode::kOk},
                        {"aead", 0, absl::StatusCode::kFailedPrecondition},
                        {"dh2", 99, absl::StatusCode::kNotFound},
                        {"dh", 1, absl::StatusCode::kOk}};
  v1::BatchDeriveRequest batch;
  for (const Item& it : items) {
    v1::DeriveRequest* r = batch.add_items();
    r->set_key_id(it.key_id);
    r->set_key_version(it.version);
    r->set_peer_public_key(peer);
  }
  std::string dh, dh2;
  for (auto [id, out] : {std::pair{"dh", &dh}, std::pair{"dh2", &dh2}}) {
    v1::DeriveRequest r;
    r.set_key_id(id);
    r.set_peer_public_key(peer);
    v1::DeriveResponse response;
    ASSERT_TRUE(ops_->Derive(r, &response).ok());  // recorded: the batch's items all hit
    *out = response.shared_key();
  }
  ASSERT_NE(dh, dh2);
  v1::BatchDeriveResponse response;
  Operations::BatchDeriveProbe probe;
  absl::Status status;
  ASSERT_TRUE(ops_->BatchDeriveFromMemo(batch, &response, &probe, &status));  // no miss
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(response.results_size(), batch.items_size());
  for (int i = 0; i < batch.items_size(); ++i) {
    const auto& r = response.results(i);
    EXPECT_EQ(r.status().code(), static_cast<int>(items[i].code)) << i;
    if (items[i].code != absl::StatusCode::kOk) {
      EXPECT_FALSE(r.has_response()) << i;
      continue;
    }
    EXPECT_TRUE(r.response().memo_hit()) << i;
    EXPECT_EQ(r.response().shared_key(), items[i].key_id == std::string("dh") ? dh : dh2) << i;
  }
}

TEST_F(OperationsTest, BatchVerifyInTwoStepsAnswersAsBatchVerify) {
  CreateKey("signer", v1::KEY_TYPE_ED25519);
  std::vector<v1::VerifyRequest> signed_items;
  for (int i = 0; i < 70; ++i) {
    v1::SignRequest sign;
    sign.set_key_id("signer");
    sign.set_message("message " + std::to_string(i));
    v1::SignResponse s;
    ASSERT_TRUE(ops_->Sign(sign, &s).ok());
    v1::VerifyRequest item;
    item.set_public_key(s.public_key());
    item.set_message(sign.message());
    item.set_signature(s.signature());
    signed_items.push_back(item);
  }
  auto run = [&](const v1::BatchVerifyRequest& batch, bool* complete, int* next) {
    v1::BatchVerifyResponse response;
    Operations::BatchVerifyProbe probe;
    absl::Status status;
    *complete = ops_->BatchVerifyFromMemo(batch, &response, &probe, &status);
    *next = probe.next;
    if (*complete) {
      EXPECT_TRUE(status.ok()) << status;
      return response;
    }
    absl::Notification done;
    ops_->BatchVerifyFresh(batch, probe, &response, [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      done.Notify();
    });
    done.WaitForNotification();
    return response;
  };
  auto verified = [&](const v1::VerifyRequest& item) {
    v1::VerifyResponse r;
    EXPECT_TRUE(ops_->Verify(item, &r).ok());  // records it: later lookups hit
  };
  verified(signed_items[0]);
  verified(signed_items[1]);
  verified(signed_items[3]);

  // hit, hit, miss, hit, a size error, miss: two answered inline, the rest on the pool.
  v1::BatchVerifyRequest mixed;
  for (int i : {0, 1, 2, 3}) *mixed.add_items() = signed_items[i];
  v1::VerifyRequest* bad = mixed.add_items();
  *bad = signed_items[4];
  bad->mutable_signature()->pop_back();
  *mixed.add_items() = signed_items[5];
  const memo::CacheStats start = memo_->verify_stats();
  const uint64_t before = CryptoOpCount(CryptoOp::kEd25519Verify);
  bool complete = true;
  int next = -1;
  v1::BatchVerifyResponse split = run(mixed, &complete, &next);
  EXPECT_FALSE(complete);
  EXPECT_EQ(next, 2);
  EXPECT_EQ(CryptoOpCount(CryptoOp::kEd25519Verify) - before, 2u);  // items 2 and 5
  EXPECT_EQ(memo_->verify_stats().hits - start.hits, 3u);
  EXPECT_EQ(memo_->verify_stats().misses - start.misses, 2u);  // the size error looks nothing up
  ASSERT_EQ(split.results_size(), 6);
  const bool hits[] = {true, true, false, true, false, false};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(split.results(i).memo_hit(), hits[i]) << i;
    EXPECT_EQ(split.results(i).valid(), i != 4) << i;
    EXPECT_EQ(split.results(i).status().code(),
              i == 4 ? static_cast<int>(absl::StatusCode::kInvalidArgument) : 0)
        << i;
  }

  // Now every item hits: the whole batch is answered inline.
  split = run(mixed, &complete, &next);
  EXPECT_TRUE(complete);
  EXPECT_EQ(next, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(split.results(i).memo_hit(), i != 4) << i;

  // Beyond kMaxInlineVerifyItems hits, the rest goes to the pool without a digest in hand.
  v1::BatchVerifyRequest many;
  for (int i = 0; i < 70; ++i) verified(signed_items[i]);
  for (int i = 0; i < 70; ++i) *many.add_items() = signed_items[i];
  split = run(many, &complete, &next);
  EXPECT_FALSE(complete);
  EXPECT_EQ(next, Operations::kMaxInlineVerifyItems);
  ASSERT_EQ(split.results_size(), 70);
  for (const auto& r : split.results()) EXPECT_TRUE(r.valid() && r.memo_hit());
}

TEST_F(OperationsTest, DeleteAndRecreateNeverServesTheOldKeysEntries) {
  CreateKey("k", v1::KEY_TYPE_X25519);
  std::string peer(32, '\0'), sk(32, '\0');
  crypto_box_keypair(reinterpret_cast<uint8_t*>(peer.data()), reinterpret_cast<uint8_t*>(sk.data()));
  v1::DeriveRequest request;
  request.set_key_id("k");
  request.set_peer_public_key(peer);
  v1::DeriveResponse old_response;
  ASSERT_TRUE(ops_->Derive(request, &old_response).ok());
  EXPECT_GT(memo_->derive_stats().entries, 0u);
  ASSERT_TRUE(keys_->DeleteKey("k").ok());
  EXPECT_EQ(memo_->derive_stats().entries, 0u);  // dropped at once
  v1::DeriveResponse response;
  EXPECT_EQ(ops_->Derive(request, &response).code(), absl::StatusCode::kNotFound);
  // Same id, same version number (1), new secret: a fresh computation, a new answer.
  CreateKey("k", v1::KEY_TYPE_X25519);
  ASSERT_TRUE(ops_->Derive(request, &response).ok());
  EXPECT_FALSE(response.memo_hit());
  EXPECT_EQ(response.key_version(), 1u);
  EXPECT_NE(response.shared_key(), old_response.shared_key());
}

TEST_F(OperationsTest, RotationDropsEntriesAndOldVersionStillOpens) {
  CreateKey("k", v1::KEY_TYPE_XCHACHA20_POLY1305);
  const std::string v1_envelope = Seal("k", "version one");
  EXPECT_EQ(memo_->open_stats().entries, 1u);
  ASSERT_TRUE(keys_->RotateKey("k").ok());
  EXPECT_EQ(memo_->open_stats().entries, 0u);
  v1::AeadOpenResponse response;
  ASSERT_TRUE(Open("k", v1_envelope, &response).ok());
  EXPECT_EQ(response.plaintext(), "version one");
  EXPECT_FALSE(response.memo_hit());
  EXPECT_EQ(response.key_version(), 1u);
  const std::string v2_envelope = Seal("k", "version two");
  ASSERT_TRUE(Open("k", v2_envelope, &response).ok());
  EXPECT_EQ(response.key_version(), 2u);
  EXPECT_TRUE(response.memo_hit());
}

TEST_F(OperationsTest, DisabledKeyAndVersionRefuseEvenMemoHits) {
  CreateKey("k", v1::KEY_TYPE_AES256_GCM);
  const std::string v1_envelope = Seal("k", "one");
  v1::AeadOpenResponse response;
  ASSERT_TRUE(Open("k", v1_envelope, &response).ok());
  ASSERT_TRUE(response.memo_hit());
  ASSERT_TRUE(keys_->DisableKey("k").ok());
  EXPECT_EQ(memo_->open_stats().entries, 0u) << "dropped at once";
  absl::Status s = Open("k", v1_envelope, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  v1::AeadSealRequest seal;
  seal.set_key_id("k");
  v1::AeadSealResponse sealed;
  EXPECT_EQ(ops_->AeadSeal(seal, &sealed).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(keys_->EnableKey("k").ok());
  ASSERT_TRUE(Open("k", v1_envelope, &response).ok());
  EXPECT_EQ(response.plaintext(), "one");

  ASSERT_TRUE(keys_->RotateKey("k").ok());
  v1::KeyVersionRequest version;
  version.set_key_id("k");
  version.set_version(1);
  ASSERT_TRUE(keys_->DisableKeyVersion(version).ok());
  s = Open("k", v1_envelope, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("disabled"), std::string::npos) << s;
}

TEST_F(OperationsTest, RewrapMovesAnEnvelopeToTheCurrentVersion) {
  CreateKey("k", v1::KEY_TYPE_XCHACHA20_POLY1305);
  const std::string old = Seal("k", "the plaintext");
  ASSERT_TRUE(keys_->RotateKey("k").ok());
  ASSERT_TRUE(keys_->RotateKey("k").ok());
  v1::AeadRewrapRequest request;
  request.set_key_id("k");
  request.set_envelope(old);
  v1::AeadRewrapResponse rewrapped;
  ASSERT_TRUE(ops_->AeadRewrap(request, &rewrapped).ok());
  EXPECT_EQ(rewrapped.key_version(), 3u);
  EXPECT_EQ(rewrapped.previous_key_version(), 1u);
  v1::AeadOpenResponse response;
  ASSERT_TRUE(Open("k", rewrapped.envelope(), &response).ok());
  EXPECT_EQ(response.plaintext(), "the plaintext");
  EXPECT_EQ(response.key_version(), 3u);

  v1::SetMinDecryptionVersionRequest min;
  min.set_key_id("k");
  min.set_min_decryption_version(2);
  ASSERT_TRUE(keys_->SetMinDecryptionVersion(min).ok());
  EXPECT_EQ(ops_->AeadRewrap(request, &rewrapped).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Open("k", old, &response).code(), absl::StatusCode::kFailedPrecondition);
  request.set_envelope(old.substr(0, 10));
  EXPECT_EQ(ops_->AeadRewrap(request, &rewrapped).code(), absl::StatusCode::kInvalidArgument);
  request.set_envelope(rewrapped.envelope());
  request.set_associated_data("not the same");
  EXPECT_EQ(ops_->AeadRewrap(request, &rewrapped).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(OperationsTest, HitNeverCrossesKeys) {
  // Two keys with the same secret: equal ciphertexts, yet each key has its own entries.
  std::string secret(32, 's');
  for (const char* id : {"a", "b"}) {
    v1::ImportKeyRequest request;
    request.set_key_id(id);
    request.set_type(v1::KEY_TYPE_CHACHA20_POLY1305);
    request.set_secret(secret);
    ASSERT_TRUE(keys_->ImportKey(request).ok());
  }
  const std::string envelope = Seal("a", "payload");
  v1::AeadOpenResponse response;
  ASSERT_TRUE(Open("b", envelope, &response).ok());
  EXPECT_FALSE(response.memo_hit());
  EXPECT_EQ(response.plaintext(), "payload");
  ASSERT_TRUE(Open("a", envelope, &response).ok());
  EXPECT_TRUE(response.memo_hit());
}

TEST_F(OperationsTest, FloodOfUniqueInputsStaysWithinBounds) {
  memo::MemoOptions small;
  small.verify_bytes = 64 * 1024;
  small.open_bytes_per_key = 256 * 1024;
  small.open_bytes_total = 256 * 1024;
  TearDown();
  Start(small);
  CreateKey("k", v1::KEY_TYPE_CHACHA20_POLY1305);
  std::mt19937_64 rng(99);
  for (int i = 0; i < 2000; ++i) {
    v1::AeadOpenResponse response;
    ASSERT_TRUE(Open("k", Seal("k", RandomBytes(1 + rng() % 4000, rng)), &response).ok());
  }
  const memo::CacheStats open = memo_->open_stats();
  EXPECT_LE(open.bytes, small.open_bytes_per_key);
  EXPECT_GT(open.evictions, 0u);
  CreateKey("s", v1::KEY_TYPE_ED25519);
  for (int i = 0; i < 2000; ++i) {
    v1::SignRequest sign;
    sign.set_key_id("s");
    sign.set_message(RandomBytes(32, rng));
    v1::SignResponse s;
    ASSERT_TRUE(ops_->Sign(sign, &s).ok());
    v1::VerifyRequest verify;
    verify.set_public_key(s.public_key());
    verify.set_message(sign.message());
    verify.set_signature(s.signature());
    v1::VerifyResponse r;
    ASSERT_TRUE(ops_->Verify(verify, &r).ok());
  }
  const memo::CacheStats verify = memo_->verify_stats();
  EXPECT_LE(verify.bytes, small.verify_bytes);
  EXPECT_GT(verify.evictions, 0u);
  EXPECT_EQ(verify.entries * memo::LruCache<int>::EntryCost(0), verify.bytes);
}

}  // namespace
}  // namespace offload::ops
