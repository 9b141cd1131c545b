// The C++ client against real offload_server processes on loopback ports:
// - the API end to end (keys, sign/verify, derive, box, AEAD, explicit batches, errors), and the
//   key lifecycle: disable / enable, scheduled deletion and its cancellation, version disable /
//   destroy / restore, min_decryption_version, Rewrap (the server wipes after 2 s, so real
//   destructions are seen);
// - retries: an unreachable endpoint costs no attempt (the call waits for it until its
//   deadline), a peer that drops every call gets exactly `max_attempts` RPCs;
// - 1,000 concurrent single Verify calls go out as exactly 4 full BatchVerify RPCs (and 200
//   Derive + 200 AeadOpen as 4 + 4), each sent as soon as it is full, with the answers of
//   individual Verify calls (counted by the server's /metrics and the client's own counters);
// - three replicas: every request for one key id lands on one replica, keys spread over all
//   three, and when one is SIGKILLed under load its keys move to the others with no error
//   surfacing to any caller.
// Restarts, late servers and silent ports: client_failover_test.cc.
#include <pthread.h>
#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/rendezvous.h"
#include "client/cpp/test_server.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

using testing::ReplicasFixture;
using testing::ServerProcess;

std::string Bytes(const unsigned char* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

// A deterministic 32-byte secret for key `i` (the same on every replica).
std::string Secret(int i, char tag) {
  std::string s(32, '\0');
  for (int k = 0; k < 32; ++k) s[k] = static_cast<char>(tag + 7 * i + 13 * k);
  return s;
}

// Options for tests that are not about deadlines: a call deadline that an ASan server on a busy
// machine cannot miss (the 5 s default once marked a live, slow server down).
ClientOptions Patient() {
  ClientOptions o;
  o.timeout = absl::Seconds(30);
  return o;
}

std::unique_ptr<Client> MakeClient(const std::string& endpoints, ClientOptions o = Patient());

// An auto-batching client for counting batches exactly: its window is longer than any spread of
// "concurrent" calls on a busy machine, and a test makes `batch_items` divide its calls, so every
// batch fills and leaves at once.
constexpr absl::Duration kLongWindow = absl::Seconds(20);
std::unique_ptr<Client> FullBatchClient(const std::string& endpoints, int batch_items) {
  ClientOptions o = Patient();
  o.batch_window = kLongWindow;
  o.max_batch_items = batch_items;
  return MakeClient(endpoints, o);
}

// offload_requests_total{method} at the server, `after` minus `before`.
double RequestsDelta(const std::map<std::string, double>& before,
                     const std::map<std::string, double>& after, const std::string& method) {
  auto b = before.find(method), a = after.find(method);
  return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
}

std::unique_ptr<Client> MakeClient(const std::string& endpoints, ClientOptions o) {
  o.endpoints = endpoints;
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

class ClientApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_GE(sodium_init(), 0);
    server_ = new ServerProcess("api");
    // Deletions and version destructions are carried out 2 s after they are asked for (the
    // reaper runs every second), so the lifecycle tests see them happen.
    server_->AddFlag("--key_deletion_wait=2s");
    server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(server_->running());
    client_ = MakeClient(server_->address());
    ASSERT_NE(client_, nullptr);
  }
  static ServerProcess* server_;
  std::unique_ptr<Client> client_;
};
ServerProcess* ClientApiTest::server_ = nullptr;

TEST_F(ClientApiTest, KeyLifecycle) {
  auto created = client_->CreateKey("life-1", v1::KEY_TYPE_ED25519);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->current_version(), 1u);
  EXPECT_EQ(client_->CreateKey("life-1", v1::KEY_TYPE_ED25519).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto got = client_->GetKey("life-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->versions(0).public_key(), created->versions(0).public_key());
  auto rotated = client_->RotateKey("life-1");
  ASSERT_TRUE(rotated.ok());
  EXPECT_EQ(rotated->current_version(), 2u);
  auto list = client_->ListKeys();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(std::any_of(list->keys().begin(), list->keys().end(),
                          [](const v1::KeyInfo& k) { return k.key_id() == "life-1"; }));

  // Disabled: every operation refused, the material kept.
  auto disabled = client_->DisableKey("life-1");
  ASSERT_TRUE(disabled.ok()) << disabled.status();
  EXPECT_EQ(disabled->state(), v1::KEY_STATE_DISABLED);
  EXPECT_EQ(client_->Sign("life-1", "m").status().code(), absl::StatusCode::kFailedPrecondition);
  auto enabled = client_->EnableKey("life-1");
  ASSERT_TRUE(enabled.ok()) << enabled.status();
  EXPECT_EQ(enabled->state(), v1::KEY_STATE_ENABLED);
  auto sig = client_->Sign("life-1", "m");
  ASSERT_TRUE(sig.ok()) << sig.status();

  // DeleteKey schedules; until the time comes the key refuses everything and can come back.
  EXPECT_EQ(client_->DeleteKey("life-1", absl::Seconds(-1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->DeleteKey("life-1", absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument)  // shorter than the server's 2 s
      << "a request may ask for a longer wait, never a shorter one";
  const int64_t before = absl::ToUnixSeconds(absl::Now());
  auto deleted = client_->DeleteKey("life-1", absl::Hours(1));
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_GE(deleted->deletion_unix_seconds(), before + 3600);
  EXPECT_LE(deleted->deletion_unix_seconds(), before + 3600 + 60);
  EXPECT_EQ(deleted->key().state(), v1::KEY_STATE_PENDING_DELETION);
  auto pending = client_->GetKey("life-1");
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_EQ(pending->state(), v1::KEY_STATE_PENDING_DELETION);
  EXPECT_EQ(pending->deletion_unix_seconds(), deleted->deletion_unix_seconds());
  EXPECT_EQ(client_->Sign("life-1", "m").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->DeleteKey("life-1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->EnableKey("life-1").status().code(), absl::StatusCode::kFailedPrecondition);
  auto cancelled = client_->CancelKeyDeletion("life-1");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::KEY_STATE_ENABLED);
  EXPECT_EQ(cancelled->deletion_unix_seconds(), 0);
  auto again = client_->Sign("life-1", "m");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->signature(), sig->signature());
  EXPECT_EQ(client_->CancelKeyDeletion("life-1").status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The old form: the server's wait (2 s here), then the key is gone and its id free.
  EXPECT_TRUE(client_->DeleteKey("life-1").ok());
  absl::StatusCode code = absl::StatusCode::kOk;
  for (absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
    code = client_->GetKey("life-1").status().code();
    if (code == absl::StatusCode::kNotFound) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(code, absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Sign("life-1", "m").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->CreateKey("life-1", v1::KEY_TYPE_ED25519).ok());
}

TEST_F(ClientApiTest, KeyVersionsAndRewrap) {
  ASSERT_TRUE(client_->CreateKey("life-aead", v1::KEY_TYPE_AES256_GCM).ok());
  auto sealed = client_->AeadSeal("life-aead", "old secret", "ad");
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  ASSERT_TRUE(client_->RotateKey("life-aead").ok());

  // Rewrap: the same plaintext under version 2, opened by the client.
  auto rewrapped = client_->AeadRewrap("life-aead", sealed->envelope(), "ad");
  ASSERT_TRUE(rewrapped.ok()) << rewrapped.status();
  EXPECT_EQ(rewrapped->key_version(), 2u);
  EXPECT_EQ(rewrapped->previous_key_version(), 1u);
  EXPECT_NE(rewrapped->envelope(), sealed->envelope());
  auto opened = client_->AeadOpen("life-aead", rewrapped->envelope(), "ad");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plaintext(), "old secret");
  EXPECT_EQ(opened->key_version(), 2u);
  EXPECT_EQ(client_->AeadRewrap("life-aead", sealed->envelope(), "other ad").status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::BatchAeadRewrapRequest batch;
  for (const std::string& envelope : {sealed->envelope(), std::string("junk")}) {
    auto* item = batch.add_items();
    item->set_key_id("life-aead");
    item->set_envelope(envelope);
    item->set_associated_data("ad");
  }
  auto batched = client_->BatchAeadRewrap(batch);
  ASSERT_TRUE(batched.ok()) << batched.status();
  ASSERT_EQ(batched->results_size(), 2);
  EXPECT_EQ(batched->results(0).status().code(), 0);
  EXPECT_EQ(batched->results(0).response().key_version(), 2u);
  EXPECT_NE(batched->results(1).status().code(), 0);
  opened = client_->AeadOpen("life-aead", batched->results(0).response().envelope(), "ad");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plaintext(), "old secret");

  // Version 1 disabled: its envelopes are refused, the current version's are not.
  EXPECT_EQ(client_->DisableKeyVersion("life-aead", 2).status().code(),
            absl::StatusCode::kFailedPrecondition);  // the current version
  auto info = client_->DisableKeyVersion("life-aead", 1);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).state(), v1::KEY_VERSION_STATE_DISABLED);
  EXPECT_EQ(client_->AeadOpen("life-aead", sealed->envelope(), "ad").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->AeadOpen("life-aead", rewrapped->envelope(), "ad").ok());
  ASSERT_TRUE(client_->EnableKeyVersion("life-aead", 1).ok());
  EXPECT_TRUE(client_->AeadOpen("life-aead", sealed->envelope(), "ad").ok());

  // Retired below min_decryption_version 2, then back.
  info = client_->SetMinDecryptionVersion("life-aead", 2);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->min_decryption_version(), 2u);
  EXPECT_EQ(client_->AeadOpen("life-aead", sealed->envelope(), "ad").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->AeadRewrap("life-aead", sealed->envelope(), "ad").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client_->SetMinDecryptionVersion("life-aead", 1).ok());

  // Destroy: scheduled (restorable), then carried out after the server's 2 s.
  EXPECT_EQ(client_->DestroyKeyVersion("life-aead", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);  // only a disabled version
  ASSERT_TRUE(client_->DisableKeyVersion("life-aead", 1).ok());
  info = client_->DestroyKeyVersion("life-aead", 1);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).state(), v1::KEY_VERSION_STATE_DESTROY_SCHEDULED);
  EXPECT_GT(info->versions(0).destroy_unix_seconds(), 0);
  info = client_->RestoreKeyVersion("life-aead", 1);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).state(), v1::KEY_VERSION_STATE_DISABLED);
  ASSERT_TRUE(client_->DestroyKeyVersion("life-aead", 1, absl::Seconds(2)).ok());
  v1::KeyVersionState state = v1::KEY_VERSION_STATE_UNSPECIFIED;
  for (absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
    auto got = client_->GetKey("life-aead");
    ASSERT_TRUE(got.ok()) << got.status();
    state = got->versions(0).state();
    if (state == v1::KEY_VERSION_STATE_DESTROYED) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(state, v1::KEY_VERSION_STATE_DESTROYED);
  EXPECT_EQ(client_->RestoreKeyVersion("life-aead", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->AeadOpen("life-aead", sealed->envelope(), "ad").status().code(),
            absl::StatusCode::kFailedPrecondition);
  opened = client_->AeadOpen("life-aead", rewrapped->envelope(), "ad");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plaintext(), "old secret");
}

TEST_F(ClientApiTest, SignVerifyAndImportedKeyMatchesLibsodium) {
  const std::string seed = Secret(1, 'a');
  ASSERT_TRUE(client_->ImportKey("ed-import", v1::KEY_TYPE_ED25519, seed).ok());
  auto sig = client_->Sign("ed-import", "hello");
  ASSERT_TRUE(sig.ok()) << sig.status();
  unsigned char pk[32], sk[64], expected[64];
  crypto_sign_seed_keypair(pk, sk, reinterpret_cast<const unsigned char*>(seed.data()));
  crypto_sign_detached(expected, nullptr, reinterpret_cast<const unsigned char*>("hello"), 5, sk);
  EXPECT_EQ(sig->public_key(), Bytes(pk, 32));
  EXPECT_EQ(sig->signature(), Bytes(expected, 64));
  auto ok = client_->Verify(sig->public_key(), "hello", sig->signature());
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->valid());
  auto bad = client_->Verify(sig->public_key(), "hellO", sig->signature());
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->valid());
  EXPECT_EQ(client_->Verify("short", "m", sig->signature()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientApiTest, DeriveAndBoxInteroperateWithLibsodium) {
  ASSERT_TRUE(client_->CreateKey("x-dh", v1::KEY_TYPE_X25519).ok());
  auto info = client_->GetKey("x-dh");
  ASSERT_TRUE(info.ok());
  const std::string service_pk = info->versions(0).public_key();
  unsigned char peer_pk[32], peer_sk[32];
  crypto_box_keypair(peer_pk, peer_sk);
  const std::string peer = Bytes(peer_pk, 32);

  auto raw = client_->Derive("x-dh", peer);
  ASSERT_TRUE(raw.ok()) << raw.status();
  unsigned char expected_raw[32];
  ASSERT_EQ(crypto_scalarmult(expected_raw, peer_sk,
                              reinterpret_cast<const unsigned char*>(service_pk.data())), 0);
  EXPECT_EQ(raw->shared_key(), Bytes(expected_raw, 32));
  auto box_key = client_->Derive("x-dh", peer, v1::DERIVE_OUTPUT_BOX_BEFORENM);
  ASSERT_TRUE(box_key.ok());
  unsigned char expected_box[32];
  ASSERT_EQ(crypto_box_beforenm(expected_box,
                                reinterpret_cast<const unsigned char*>(service_pk.data()), peer_sk),
            0);
  EXPECT_EQ(box_key->shared_key(), Bytes(expected_box, 32));

  auto sealed = client_->BoxSeal("x-dh", peer, "to the peer");
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  std::string plain(sealed->ciphertext().size() - crypto_box_MACBYTES, '\0');
  ASSERT_EQ(crypto_box_open_easy(reinterpret_cast<unsigned char*>(plain.data()),
                                 reinterpret_cast<const unsigned char*>(sealed->ciphertext().data()),
                                 sealed->ciphertext().size(),
                                 reinterpret_cast<const unsigned char*>(sealed->nonce().data()),
                                 reinterpret_cast<const unsigned char*>(service_pk.data()), peer_sk),
            0);
  EXPECT_EQ(plain, "to the peer");
  unsigned char nonce[24], ct[crypto_box_MACBYTES + 4];
  randombytes_buf(nonce, sizeof(nonce));
  ASSERT_EQ(crypto_box_easy(ct, reinterpret_cast<const unsigned char*>("ping"), 4, nonce,
                            reinterpret_cast<const unsigned char*>(service_pk.data()), peer_sk),
            0);
  auto opened = client_->BoxOpen("x-dh", peer, Bytes(nonce, 24), Bytes(ct, sizeof(ct)));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plaintext(), "ping");
  ct[0] ^= 1;
  EXPECT_EQ(client_->BoxOpen("x-dh", peer, Bytes(nonce, 24), Bytes(ct, sizeof(ct))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Derive("x-dh", "short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Derive("x-none", peer).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientApiTest, AeadSealOpen) {
  ASSERT_TRUE(client_->CreateKey("blobs", v1::KEY_TYPE_XCHACHA20_POLY1305).ok());
  auto sealed = client_->AeadSeal("blobs", "state", "user-42");
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  auto opened = client_->AeadOpen("blobs", sealed->envelope(), "user-42");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plaintext(), "state");
  EXPECT_EQ(client_->AeadOpen("blobs", sealed->envelope(), "user-43").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->AeadOpen("blobs", "tiny").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An explicit batch larger than the server's limit is split, and answered in request order.
TEST_F(ClientApiTest, ExplicitBatchesAreSplitAndKeepOrder) {
  ASSERT_TRUE(client_->CreateKey("batch-ed", v1::KEY_TYPE_ED25519).ok());
  v1::BatchSignRequest sreq;
  for (int i = 0; i < 1500; ++i) {
    auto* item = sreq.add_items();
    item->set_key_id(i == 7 ? "batch-none" : "batch-ed");
    item->set_message(absl::StrCat("m", i));
  }
  const int64_t rpcs_before = client_->Stats().rpcs;
  auto signed_batch = client_->BatchSign(sreq);
  ASSERT_TRUE(signed_batch.ok()) << signed_batch.status();
  ASSERT_EQ(signed_batch->results_size(), 1500);
  EXPECT_EQ(client_->Stats().rpcs - rpcs_before, 2);  // 1024 + 476
  EXPECT_EQ(signed_batch->results(7).status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  v1::BatchVerifyRequest vreq;
  for (int i = 0; i < 1500; ++i) {
    if (i == 7) continue;
    auto* item = vreq.add_items();
    item->set_public_key(signed_batch->results(i).response().public_key());
    item->set_message(absl::StrCat("m", i % 3 == 0 ? i + 1 : i));  // every third is wrong
    item->set_signature(signed_batch->results(i).response().signature());
  }
  auto verified = client_->BatchVerify(vreq);
  ASSERT_TRUE(verified.ok()) << verified.status();
  ASSERT_EQ(verified->results_size(), vreq.items_size());
  for (int j = 0, i = 0; i < 1500; ++i) {
    if (i == 7) continue;
    EXPECT_EQ(verified->results(j).status().code(), 0);
    EXPECT_EQ(verified->results(j).valid(), i % 3 != 0) << i;
    ++j;
  }
  EXPECT_EQ(client_->BatchVerify(v1::BatchVerifyRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);  // the server's answer to an empty batch
}

// Nothing listens and there is nowhere else to go: the call waits for a connection until its
// deadline (a server starting meanwhile would be reached: client_failover_test.cc), sending no
// RPC, so no attempt is spent.
TEST_F(ClientApiTest, UnreachableEndpointFailsAtTheDeadlineWithoutSpendingAttempts) {
  ClientOptions o;
  o.max_attempts = 3;
  o.initial_backoff = absl::Milliseconds(1);
  o.timeout = absl::Milliseconds(600);
  auto c = MakeClient(absl::StrCat("127.0.0.1:", testing::FreePort()), o);
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  EXPECT_EQ(c->Sign("k", "m").status().code(), absl::StatusCode::kDeadlineExceeded);
  // Ended by its deadline rather than hanging (the slack is for an ASan build on busy cores).
  EXPECT_LE(absl::Now() - start, o.timeout + absl::Seconds(5));
  EXPECT_EQ(c->Stats().rpcs, 0);
  EXPECT_EQ(c->Stats().connect_failures, 1);
  EXPECT_EQ(c->Stats().failed_calls, 1);
}

// A peer that completes the HTTP/2 handshake and then drops every call: each attempt is a real
// RPC that fails UNAVAILABLE, and the call gives up after `max_attempts` of them, well before its
// deadline.
TEST_F(ClientApiTest, CallsDroppedByTheServerAreRetriedMaxAttemptsTimes) {
  testing::FaultyListener dropping(testing::FaultyListener::Mode::kDropCalls);
  ClientOptions o;
  o.max_attempts = 3;
  o.initial_backoff = absl::Milliseconds(1);
  o.timeout = absl::Seconds(20);
  auto c = MakeClient(dropping.address(), o);
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  const absl::Status s = c->Sign("k", "m").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, o.timeout);
  EXPECT_EQ(c->Stats().rpcs, 3);
  EXPECT_EQ(c->Stats().retries, 2);
  EXPECT_EQ(c->Stats().failed_calls, 1);
  EXPECT_EQ(dropping.calls(), 3);
}

// ---------------------------------------------------------------------------------------------
// 1,000 concurrent single Verify calls.

struct Signer {
  unsigned char pk[32];
  unsigned char sk[64];
};

struct VerifyCase {
  std::string public_key, message, signature;
};

// Answers compared between paths: the status code and, when OK, validity.
std::string Outcome(const absl::StatusOr<v1::VerifyResponse>& r) {
  if (!r.ok()) return absl::StrCat("error ", absl::StatusCodeToString(r.status().code()));
  return r->valid() ? "valid" : "invalid";
}

TEST_F(ClientApiTest, ThousandConcurrentVerifiesGoOutAsFewBatches) {
  constexpr int kCalls = 1000;
  std::vector<Signer> signers(20);
  for (size_t i = 0; i < signers.size(); ++i) {
    const std::string seed = Secret(static_cast<int>(i), 's');
    crypto_sign_seed_keypair(signers[i].pk, signers[i].sk,
                             reinterpret_cast<const unsigned char*>(seed.data()));
  }
  std::vector<VerifyCase> cases(kCalls);
  int expected_valid = 0;
  for (int i = 0; i < kCalls; ++i) {
    const Signer& s = signers[i % signers.size()];
    VerifyCase& c = cases[i];
    c.public_key = Bytes(s.pk, 32);
    c.message = absl::StrCat("message ", i);
    unsigned char sig[64];
    crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(c.message.data()),
                         c.message.size(), s.sk);
    c.signature = Bytes(sig, 64);
    switch (i % 5) {
      case 1: c.signature[10] ^= 0x40; break;         // invalid signature
      case 2: c.message += "!"; break;                // invalid: other message
      case 3: if (i % 50 == 3) c.signature.pop_back(); break;  // wrong size: item error
      default: break;
    }
    if (i % 5 == 0 || i % 5 == 4 || (i % 5 == 3 && i % 50 != 3)) ++expected_valid;
  }

  // 1,000 threads, released together, one single Verify each, through one auto-batching client.
  // How many batches a given window yields depends on how fast 1,000 OS threads get through the
  // client's lock, which on 2 shared cores under ASan varies from 50 ms to far over a second (a
  // CI run with a 10 ms window once saw 43 batches). So the window here is longer than any such
  // spread and the batch size divides the calls: every batch fills and leaves at once, and the
  // count is exact - 4 batches of 250 - with no wait for a window to close.
  auto batching_client = FullBatchClient(server_->address(), 250);
  ASSERT_NE(batching_client, nullptr);
  Client* client = batching_client.get();
  const auto before = server_->Requests();
  const ClientStats stats_before = client->Stats();
  std::vector<std::string> batched(kCalls);
  std::vector<absl::Time> started(kCalls);
  // A barrier releases every thread with one futex broadcast (a mutex-based gate would wake them
  // one after the other, spreading the "concurrent" calls over a long time on a small machine).
  pthread_barrier_t go;
  ASSERT_EQ(pthread_barrier_init(&go, nullptr, kCalls), 0);
  std::vector<std::thread> threads;
  threads.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      pthread_barrier_wait(&go);
      started[i] = absl::Now();
      batched[i] = Outcome(client->Verify(cases[i].public_key, cases[i].message,
                                           cases[i].signature));
    });
  }
  for (auto& t : threads) t.join();
  const absl::Time all_answered = absl::Now();
  pthread_barrier_destroy(&go);
  const auto after = server_->Requests();
  const ClientStats stats = client->Stats();
  const auto [first, last] = std::minmax_element(started.begin(), started.end());
  std::printf("1000 Verify calls started within %s\n", absl::FormatDuration(*last - *first).c_str());

  // The reference afterwards (so the batched calls found no memo entries): each case on its own
  // Verify RPC.
  ClientOptions single;
  single.auto_batch = false;
  auto reference_client = MakeClient(server_->address(), single);
  ASSERT_NE(reference_client, nullptr);
  std::vector<std::string> reference(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    reference[i] = Outcome(reference_client->Verify(cases[i].public_key, cases[i].message,
                                                    cases[i].signature));
  }
  EXPECT_EQ(std::count(reference.begin(), reference.end(), "valid"), expected_valid);
  EXPECT_EQ(std::count(reference.begin(), reference.end(), "error INVALID_ARGUMENT"), 20);

  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(batched[i], reference[i]) << "case " << i;
  auto delta = [&](const char* method) { return RequestsDelta(before, after, method); };
  const double server_rpcs = delta("BatchVerify") + delta("Verify");
  const int64_t client_rpcs = stats.rpcs - stats_before.rpcs;
  std::printf("1000 concurrent Verify calls: %.0f RPCs at the server (BatchVerify %.0f, Verify %.0f)"
              ", %lld RPCs / %lld auto-batches / %lld items by the client's counters\n",
              server_rpcs, delta("BatchVerify"), delta("Verify"),
              static_cast<long long>(client_rpcs),
              static_cast<long long>(stats.auto_batches - stats_before.auto_batches),
              static_cast<long long>(stats.auto_batched_items - stats_before.auto_batched_items));
  EXPECT_EQ(server_rpcs, 4);  // 1,000 / max_batch_items
  // A full batch leaves at once: nobody waited for the (20 s) window to close.
  EXPECT_LT(all_answered - *first, kLongWindow);
  EXPECT_EQ(delta("Verify"), 0);
  EXPECT_EQ(server_rpcs, static_cast<double>(client_rpcs));
  EXPECT_EQ(stats.auto_batched_items - stats_before.auto_batched_items, kCalls);
  EXPECT_EQ(stats.retries - stats_before.retries, 0);
}

TEST_F(ClientApiTest, ConcurrentDeriveAndOpenAreCoalescedToo) {
  ASSERT_TRUE(client_->CreateKey("co-x", v1::KEY_TYPE_X25519).ok());
  ASSERT_TRUE(client_->CreateKey("co-aead", v1::KEY_TYPE_CHACHA20_POLY1305).ok());
  constexpr int kCalls = 200;
  std::vector<std::string> peers(kCalls), envelopes(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    unsigned char pk[32], sk[32];
    crypto_box_keypair(pk, sk);
    peers[i] = Bytes(pk, 32);
    auto s = client_->AeadSeal("co-aead", absl::StrCat("plain ", i));
    ASSERT_TRUE(s.ok());
    envelopes[i] = s->envelope();
  }
  ClientOptions single;
  single.auto_batch = false;
  auto reference = MakeClient(server_->address(), single);
  std::vector<std::string> want(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    auto d = reference->Derive("co-x", peers[i]);
    ASSERT_TRUE(d.ok());
    want[i] = d->shared_key();
  }
  // As above: a window longer than the threads' spread and a batch size that divides the calls,
  // so that the count of batches is exact: 4 BatchDerive, then 4 BatchOpen, of 50 items each.
  auto batching = FullBatchClient(server_->address(), 50);
  ASSERT_NE(batching, nullptr);
  Client* client = batching.get();
  const auto server_before = server_->Requests();
  std::vector<std::string> derived(kCalls), opened(kCalls);
  absl::Notification go;
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      auto d = client->Derive("co-x", peers[i]);
      derived[i] = d.ok() ? d->shared_key() : d.status().ToString();
      auto o = client->AeadOpen("co-aead", envelopes[i]);
      opened[i] = o.ok() ? o->plaintext() : o.status().ToString();
    });
  }
  const absl::Time released = absl::Now();
  go.Notify();
  for (auto& t : threads) t.join();
  EXPECT_LT(absl::Now() - released, kLongWindow);  // full batches left at once
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(derived[i], want[i]) << i;
    EXPECT_EQ(opened[i], absl::StrCat("plain ", i)) << i;
  }
  const ClientStats stats = client->Stats();
  EXPECT_EQ(stats.auto_batched_items, 2 * kCalls);
  EXPECT_EQ(stats.auto_batches, 8);
  EXPECT_EQ(stats.rpcs, 8);
  const auto server_after = server_->Requests();
  for (const char* method : {"BatchDerive", "BatchOpen"}) {
    EXPECT_EQ(RequestsDelta(server_before, server_after, method), 4) << method;
  }
}

// ---------------------------------------------------------------------------------------------
// Three replicas: affinity and failover.

class ReplicasTest : public ReplicasFixture {
 protected:
  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    StartReplicas(3);
    ASSERT_FALSE(HasFatalFailure());
    // The same keys, from the same secrets, on every replica: any of them can serve any key.
    for (const auto& s : servers_) {
      auto direct = MakeClient(s->address());
      ASSERT_NE(direct, nullptr);
      for (int i = 0; i < kKeysPerType; ++i) {
        ASSERT_TRUE(direct->ImportKey(EdKey(i), v1::KEY_TYPE_ED25519, Secret(i, 'e')).ok());
        ASSERT_TRUE(direct->ImportKey(XKey(i), v1::KEY_TYPE_X25519, Secret(i, 'x')).ok());
      }
    }
    for (int i = 0; i < kKeysPerType; ++i) {
      unsigned char pk[32], sk[64];
      const std::string seed = Secret(i, 'e');
      crypto_sign_seed_keypair(pk, sk, reinterpret_cast<const unsigned char*>(seed.data()));
      public_keys_.push_back(Bytes(pk, 32));
    }
    unsigned char peer_pk[32], peer_sk[32];
    crypto_box_keypair(peer_pk, peer_sk);
    peer_ = Bytes(peer_pk, 32);
  }

  static constexpr int kKeysPerType = 18;
  static std::string EdKey(int i) { return absl::StrCat("ed-", i); }
  static std::string XKey(int i) { return absl::StrCat("x-", i); }

  // Runs `traffic` (which makes `calls` RPCs) and returns which live servers' request counters
  // moved, and by how much.
  template <typename Fn>
  std::map<std::string, double> CountersMovedBy(Fn traffic) {
    std::map<std::string, double> before;
    for (const auto& s : servers_) {
      if (s->running()) before[s->address()] = s->TotalRequests();
    }
    traffic();
    std::map<std::string, double> moved;
    for (const auto& s : servers_) {
      if (!s->running()) continue;
      const double d = s->TotalRequests() - before[s->address()];
      if (d != 0) moved[s->address()] = d;
    }
    return moved;
  }
  // For every key id and every signer's verify routing key: exactly one live server's counters
  // move for its traffic, by exactly the calls made, and it is the one the client routes to.
  // Returns routing key -> server address.
  std::map<std::string, std::string> CheckAffinity(Client& client) {
    std::map<std::string, std::string> placed;
    constexpr int kCallsPerKey = 3;
    for (int i = 0; i < kKeysPerType; ++i) {
      struct Case {
        std::string route;
        std::function<bool()> call;
      };
      const std::vector<Case> cases = {
          {EdKey(i), [&, i] { return client.Sign(EdKey(i), "affinity").ok(); }},
          {XKey(i), [&, i] { return client.Derive(XKey(i), peer_).ok(); }},
          {Client::VerifyRoutingKey(public_keys_[i]),
           [&, i] { return client.Verify(public_keys_[i], "m", std::string(64, '\1')).ok(); }},
      };
      for (const Case& c : cases) {
        const std::string expected = client.RouteFor(c.route);
        auto moved = CountersMovedBy([&] {
          for (int k = 0; k < kCallsPerKey; ++k) EXPECT_TRUE(c.call()) << c.route;
        });
        EXPECT_EQ(moved.size(), 1u) << c.route << " reached " << moved.size() << " servers";
        if (moved.size() == 1) {
          EXPECT_EQ(moved.begin()->first, expected) << c.route;
          EXPECT_EQ(moved.begin()->second, kCallsPerKey) << c.route;
        }
        placed[c.route] = expected;
      }
    }
    return placed;
  }

  std::vector<std::string> public_keys_;
  std::string peer_;
};

TEST_F(ReplicasTest, KeysStickToOneReplicaAndMoveWhenItDies) {
  ClientOptions o = Patient();
  o.endpoint_down_initial = absl::Minutes(10);  // the killed one stays out for the whole test
  // A first connection slower than the default 1 s (an ASan server on a busy machine) would fail
  // the call over and, with the mark above, move that replica's keys for the whole test.
  o.connect_timeout = absl::Seconds(20);
  auto client = MakeClient(Endpoints(), o);
  ASSERT_NE(client, nullptr);

  // 1. Affinity: one replica per routing key, and the keys spread over all three.
  const std::map<std::string, std::string> placed = CheckAffinity(*client);
  std::map<std::string, int> per_server;
  for (const auto& [route, address] : placed) per_server[address]++;
  for (const auto& s : servers_) {
    std::printf("%s (%s): %d of %zu routing keys\n", s->name().c_str(), s->address().c_str(),
                per_server[s->address()], placed.size());
    EXPECT_GT(per_server[s->address()], 0) << s->address() << " got no keys";
  }

  // 2. Load from 8 threads over every key; SIGKILL the replica holding the most keys mid-way.
  std::string victim_address;
  for (const auto& [address, n] : per_server) {
    if (victim_address.empty() || n > per_server[victim_address]) victim_address = address;
  }
  ServerProcess* victim = ByAddress(victim_address);
  ASSERT_NE(victim, nullptr);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok_calls{0};
  std::atomic<int64_t> ok_after_kill{0};
  std::atomic<bool> killed{false};
  absl::Mutex errors_mu;
  std::vector<std::string> errors;
  std::vector<std::thread> load;
  for (int t = 0; t < 8; ++t) {
    load.emplace_back([&, t] {
      for (int n = 0; !stop.load(); ++n) {
        const int i = (n * 8 + t) % kKeysPerType;
        absl::Status s;
        switch (n % 3) {
          case 0: s = client->Sign(EdKey(i), absl::StrCat("load ", n)).status(); break;
          case 1: s = client->Derive(XKey(i), peer_).status(); break;
          default: {
            auto v = client->Verify(public_keys_[i], "m", std::string(64, '\1'));
            s = v.status();
            if (v.ok() && v->valid()) s = absl::InternalError("bogus signature accepted");
          }
        }
        if (s.ok()) {
          ok_calls++;
          if (killed.load()) ok_after_kill++;
        } else {
          absl::MutexLock lock(&errors_mu);
          errors.push_back(s.ToString());
        }
      }
    });
  }
  auto wait_for = [&](std::atomic<int64_t>& counter, int64_t n) {
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    while (counter.load() < n && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return counter.load() >= n;
  };
  EXPECT_TRUE(wait_for(ok_calls, 300));
  const ClientStats before_kill = client->Stats();
  victim->Kill();
  killed = true;
  EXPECT_TRUE(wait_for(ok_after_kill, 600));
  stop = true;
  for (auto& t : load) t.join();
  const ClientStats after_kill = client->Stats();
  std::printf("load: %lld calls ok (%lld after the SIGKILL of %s), %zu errors; "
              "%lld retries and %lld endpoint marks after the kill\n",
              static_cast<long long>(ok_calls.load()), static_cast<long long>(ok_after_kill.load()),
              victim_address.c_str(), errors.size(),
              static_cast<long long>(after_kill.retries - before_kill.retries),
              static_cast<long long>(after_kill.endpoints_marked_down -
                                     before_kill.endpoints_marked_down));
  // Every call that was in flight on the victim, or sent to it before it was marked down, got
  // UNAVAILABLE and was retried on the key's next replica: no caller saw an error.
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, first: " << errors.front();
  EXPECT_TRUE(client->IsEndpointDown(victim_address));
  EXPECT_GE(after_kill.endpoints_marked_down - before_kill.endpoints_marked_down, 1);

  // 3. After the kill: the victim's keys went to their next replica, nobody else's moved, and
  //    affinity holds over the two survivors.
  const std::vector<std::string> all = client->Endpoints();
  for (const auto& [route, address] : placed) {
    const std::string now = client->RouteFor(route);
    if (address == victim_address) {
      const std::vector<int> rank = RankEndpoints(route, all);
      EXPECT_EQ(now, all[rank[0]] == victim_address ? all[rank[1]] : all[rank[0]]) << route;
    } else {
      EXPECT_EQ(now, address) << route << " moved though its replica is alive";
    }
  }
  const std::map<std::string, std::string> replaced = CheckAffinity(*client);
  std::map<std::string, int> survivors;
  for (const auto& [route, address] : replaced) {
    EXPECT_NE(address, victim_address);
    survivors[address]++;
  }
  for (const auto& [address, n] : survivors) {
    std::printf("after the kill: %s has %d of %zu routing keys\n", address.c_str(), n,
                replaced.size());
  }
}

}  // namespace
}  // namespace offload::client
