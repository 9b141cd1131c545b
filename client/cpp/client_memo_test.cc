// The C++ client's memos against a real offload_server on loopback, every "no RPC" counted at the
// server (offload_requests_total and offload_items_total from its /metrics), not only by the
// client's own counters:
// - repeated verifies (single, auto-batched, explicit batches) make no RPC; invalid signatures
//   are checked every time;
// - opt-in derive and open memos: repeats make no RPC, AeadSeal's envelope opens with none, a
//   tampered envelope fails every time and is never remembered, a wrong associated data never
//   hits, batches send only what missed;
// - a refusal about a key (FAILED_PRECONDITION after another client disabled it, PERMISSION_DENIED
//   for a caller without a grant, a batch item's error) drops that key's entries at once, and this
//   client's own DisableKey too; an item error about one envelope does not;
// - an entry past its maximum age is never used (the test sleeps past a short age, then sees the
//   server called; it never asserts the reverse under a tight time);
// - under a byte bound smaller than the set, re-read entries stay and the least recently used go;
// - a token provider is asked again once on UNAUTHENTICATED (EdDSA tokens minted here with
//   libsodium against the server's --jwks_file);
// - refusals that carry a google.rpc.RetryInfo are retried after at least its delay, and
//   RESOURCE_EXHAUSTED without one is returned as is (from a gRPC peer that refuses as an
//   overloaded server does: RefusingPeer in test_server.h).
#include <sodium.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/test_server.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

using testing::ServerProcess;

std::string Bytes(const unsigned char* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

std::string RandomPeer() {
  unsigned char pk[32], sk[32];
  crypto_box_keypair(pk, sk);
  sodium_memzero(sk, sizeof(sk));
  return Bytes(pk, 32);
}

// offload_requests_total of `methods` at the server, `after` minus `before`.
double Delta(const std::map<std::string, double>& before,
             const std::map<std::string, double>& after, std::vector<std::string> methods) {
  double d = 0;
  for (const std::string& m : methods) {
    auto b = before.find(m), a = after.find(m);
    d += (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
  }
  return d;
}

// Options for a client with the derive and open memos on (ages long enough for any busy machine).
ClientOptions Remembering(const std::string& address,
                          absl::Duration max_age = absl::Minutes(10)) {
  ClientOptions o;
  o.endpoints = address;
  o.timeout = absl::Seconds(30);
  o.derive_memo = true;
  o.derive_memo_max_age = max_age;
  o.open_memo = true;
  o.open_memo_max_age = max_age;
  return o;
}

std::unique_ptr<Client> Make(const ClientOptions& o) {
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

class ClientMemoTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_GE(sodium_init(), 0);
    server_ = new ServerProcess("memo");
    server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_->running()); }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", server_->LogTail().c_str());
  }
  // Runs `fn` and returns the RPCs of `methods` the server counted meanwhile.
  template <typename Fn>
  double ServerRpcs(std::vector<std::string> methods, Fn fn) {
    const auto before = server_->Requests();
    fn();
    return Delta(before, server_->Requests(), methods);
  }
  static ServerProcess* server_;
};
ServerProcess* ClientMemoTest::server_ = nullptr;

const std::vector<std::string> kVerify = {"Verify", "BatchVerify"};
const std::vector<std::string> kDerive = {"Derive", "BatchDerive"};
const std::vector<std::string> kOpen = {"Open", "BatchOpen"};

TEST_F(ClientMemoTest, CreateRefusesAMemoWithoutAMaximumAge) {
  ClientOptions o;
  o.endpoints = server_->address();
  o.derive_memo = true;
  auto c = Client::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("derive_memo_max_age"), std::string::npos) << c.status();
  o = ClientOptions();
  o.endpoints = server_->address();
  o.open_memo = true;
  o.open_memo_max_age = absl::InfiniteDuration();
  c = Client::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("open_memo_max_age"), std::string::npos) << c.status();
  o.open_memo_max_age = absl::Seconds(1);
  o.open_memo_bytes = 0;
  c = Client::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("open_memo_bytes"), std::string::npos) << c.status();
}

TEST_F(ClientMemoTest, RepeatedVerifiesMakeNoRpc) {
  ClientOptions o;
  o.endpoints = server_->address();
  auto client = Make(o);  // the verify memo is on by default
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("mv-ed", v1::KEY_TYPE_ED25519).ok());
  std::vector<v1::SignResponse> sigs;
  for (int i = 0; i < 6; ++i) {
    auto s = client->Sign("mv-ed", absl::StrCat("message ", i));
    ASSERT_TRUE(s.ok()) << s.status();
    sigs.push_back(*s);
  }
  const std::string pk = sigs[0].public_key();

  // The first verify asks the server; the next nine ask nobody.
  EXPECT_EQ(ServerRpcs(kVerify, [&] {
              auto r = client->Verify(pk, "message 0", sigs[0].signature());
              ASSERT_TRUE(r.ok()) << r.status();
              EXPECT_TRUE(r->valid());
            }), 1);
  const ClientStats before = client->Stats();
  EXPECT_EQ(ServerRpcs(kVerify, [&] {
              for (int k = 0; k < 9; ++k) {
                auto r = client->Verify(pk, "message 0", sigs[0].signature());
                ASSERT_TRUE(r.ok()) << r.status();
                EXPECT_TRUE(r->valid());
                EXPECT_TRUE(r->memo_hit());
              }
            }), 0);
  const ClientStats after = client->Stats();
  EXPECT_EQ(after.rpcs, before.rpcs);
  EXPECT_EQ(after.verify_memo.hits - before.verify_memo.hits, 9);
  EXPECT_GT(after.memo_bytes_not_sent, before.memo_bytes_not_sent);

  // An invalid signature is never remembered: every try is an RPC.
  std::string bad = sigs[1].signature();
  bad[3] ^= 1;
  EXPECT_EQ(ServerRpcs(kVerify, [&] {
              for (int k = 0; k < 3; ++k) {
                auto r = client->Verify(pk, "message 1", bad);
                ASSERT_TRUE(r.ok()) << r.status();
                EXPECT_FALSE(r->valid());
                EXPECT_FALSE(r->memo_hit());
              }
            }), 3);

  // Explicit batches: only what missed is sent; a batch that all hits sends nothing.
  v1::BatchVerifyRequest batch;
  for (int i = 0; i < 6; ++i) {
    auto* item = batch.add_items();
    item->set_public_key(pk);
    item->set_message(absl::StrCat("message ", i));
    item->set_signature(i == 5 ? bad : sigs[i].signature());  // 5: invalid
  }
  const auto items_before = server_->Items();
  absl::StatusOr<v1::BatchVerifyResponse> first;
  EXPECT_EQ(ServerRpcs(kVerify, [&] { first = client->BatchVerify(batch); }), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  const auto items_after = server_->Items();
  auto items = [&](const char* result) {
    auto key = std::make_pair(std::string("BatchVerify"), std::string(result));
    auto b = items_before.find(key), a = items_after.find(key);
    return (a == items_after.end() ? 0 : a->second) - (b == items_before.end() ? 0 : b->second);
  };
  EXPECT_EQ(items("ok") + items("invalid") + items("error"), 5) << "item 0 was remembered";
  ASSERT_EQ(first->results_size(), 6);
  EXPECT_TRUE(first->results(0).memo_hit());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(first->results(i).valid(), i != 5) << i;
  batch.mutable_items()->DeleteSubrange(5, 1);  // without the invalid one
  absl::StatusOr<v1::BatchVerifyResponse> second;
  EXPECT_EQ(ServerRpcs(kVerify, [&] { second = client->BatchVerify(batch); }), 0);
  ASSERT_TRUE(second.ok()) << second.status();
  for (const auto& r : second->results()) {
    EXPECT_TRUE(r.valid());
    EXPECT_TRUE(r.memo_hit());
  }

  // Auto-batched concurrent verifies of remembered signatures: no batch is formed at all.
  const int64_t batches_before = client->Stats().auto_batches;
  EXPECT_EQ(ServerRpcs(kVerify, [&] {
              std::vector<std::thread> threads;
              for (int t = 0; t < 16; ++t) {
                threads.emplace_back([&, t] {
                  const int i = t % 5;
                  auto r = client->Verify(pk, absl::StrCat("message ", i), sigs[i].signature());
                  EXPECT_TRUE(r.ok() && r->valid() && r->memo_hit());
                });
              }
              for (auto& t : threads) t.join();
            }), 0);
  EXPECT_EQ(client->Stats().auto_batches, batches_before);

  // Off: every verify is an RPC.
  o.verify_memo_bytes = 0;
  auto forgetful = Make(o);
  ASSERT_NE(forgetful, nullptr);
  EXPECT_EQ(ServerRpcs(kVerify, [&] {
              for (int k = 0; k < 3; ++k) {
                ASSERT_TRUE(forgetful->Verify(pk, "message 0", sigs[0].signature()).ok());
              }
            }), 3);
}

TEST_F(ClientMemoTest, OptInDeriveAndOpenRepeatsMakeNoRpc) {
  auto client = Make(Remembering(server_->address()));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("md-x", v1::KEY_TYPE_X25519).ok());
  ASSERT_TRUE(client->CreateKey("md-aead", v1::KEY_TYPE_XCHACHA20_POLY1305).ok());
  const std::string peer = RandomPeer();

  absl::StatusOr<v1::DeriveResponse> raw, box;
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              raw = client->Derive("md-x", peer);
              box = client->Derive("md-x", peer, v1::DERIVE_OUTPUT_BOX_BEFORENM);
            }), 2);
  ASSERT_TRUE(raw.ok() && box.ok());
  EXPECT_NE(raw->shared_key(), box->shared_key());
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              for (int k = 0; k < 10; ++k) {
                auto r = client->Derive("md-x", peer);
                ASSERT_TRUE(r.ok()) << r.status();
                EXPECT_EQ(r->shared_key(), raw->shared_key());
                EXPECT_EQ(r->key_version(), raw->key_version());
                EXPECT_TRUE(r->memo_hit());
                auto b = client->Derive("md-x", peer, v1::DERIVE_OUTPUT_BOX_BEFORENM);
                ASSERT_TRUE(b.ok());
                EXPECT_EQ(b->shared_key(), box->shared_key());
              }
            }), 0);
  // Version 1 asked for explicitly is another entry: one RPC, then none.
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              for (int k = 0; k < 3; ++k) {
                auto r = client->Derive("md-x", peer, v1::DERIVE_OUTPUT_RAW, 1);
                ASSERT_TRUE(r.ok()) << r.status();
                EXPECT_EQ(r->shared_key(), raw->shared_key());
              }
            }), 1);

  // An envelope this client sealed opens with no RPC at all; one sealed elsewhere, after one.
  ClientOptions plain;
  plain.endpoints = server_->address();
  auto other = Make(plain);
  ASSERT_NE(other, nullptr);
  auto mine = client->AeadSeal("md-aead", "my blob", "ad");
  auto theirs = other->AeadSeal("md-aead", "their blob", "ad");
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              for (int k = 0; k < 5; ++k) {
                auto a = client->AeadOpen("md-aead", mine->envelope(), "ad");
                ASSERT_TRUE(a.ok()) << a.status();
                EXPECT_EQ(a->plaintext(), "my blob");
                EXPECT_TRUE(a->memo_hit());
                EXPECT_EQ(a->key_version(), mine->key_version());
                auto b = client->AeadOpen("md-aead", theirs->envelope(), "ad");
                ASSERT_TRUE(b.ok()) << b.status();
                EXPECT_EQ(b->plaintext(), "their blob");
              }
            }), 1);

  // A wrong associated data never hits: the server is asked, and refuses, every time.
  const int64_t hits = client->Stats().open_memo.hits;
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              for (int k = 0; k < 3; ++k) {
                EXPECT_EQ(client->AeadOpen("md-aead", mine->envelope(), "other ad").status().code(),
                          absl::StatusCode::kInvalidArgument);
              }
            }), 3);
  EXPECT_EQ(client->Stats().open_memo.hits, hits);

  // A tampered envelope fails every time and is never remembered; it drops nothing.
  std::string tampered = theirs->envelope();
  tampered[tampered.size() - 3] ^= 0x20;
  const int64_t entries = client->Stats().open_memo.entries;
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              for (int k = 0; k < 4; ++k) {
                EXPECT_EQ(client->AeadOpen("md-aead", tampered, "ad").status().code(),
                          absl::StatusCode::kInvalidArgument);
              }
            }), 4);
  EXPECT_EQ(client->Stats().open_memo.entries, entries);
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              EXPECT_TRUE(client->AeadOpen("md-aead", theirs->envelope(), "ad").ok());
            }), 0);

  // Explicit batches: the remembered items are answered here, only the others are sent, and a
  // tampered item's error is the server's.
  auto fresh = other->AeadSeal("md-aead", "fresh blob", "ad");
  ASSERT_TRUE(fresh.ok());
  v1::BatchAeadOpenRequest batch;
  for (const std::string& envelope : {mine->envelope(), fresh->envelope(), tampered,
                                      theirs->envelope()}) {
    auto* item = batch.add_items();
    item->set_key_id("md-aead");
    item->set_envelope(envelope);
    item->set_associated_data("ad");
  }
  const auto items_before = server_->Items();
  absl::StatusOr<v1::BatchAeadOpenResponse> opened;
  EXPECT_EQ(ServerRpcs(kOpen, [&] { opened = client->BatchAeadOpen(batch); }), 1);
  const auto items_after = server_->Items();
  double sent_items = 0;
  for (const auto& [k, v] : items_after) {
    if (k.first == "BatchOpen") sent_items += v - (items_before.count(k) ? items_before.at(k) : 0);
  }
  EXPECT_EQ(sent_items, 2) << "the fresh and the tampered envelope";
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->results_size(), 4);
  EXPECT_EQ(opened->results(0).response().plaintext(), "my blob");
  EXPECT_TRUE(opened->results(0).response().memo_hit());
  EXPECT_EQ(opened->results(1).response().plaintext(), "fresh blob");
  EXPECT_EQ(opened->results(2).status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(opened->results(3).response().plaintext(), "their blob");
  batch.mutable_items()->DeleteSubrange(2, 1);
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              auto again = client->BatchAeadOpen(batch);
              ASSERT_TRUE(again.ok()) << again.status();
              for (const auto& r : again->results()) EXPECT_TRUE(r.response().memo_hit());
            }), 0);

  v1::BatchDeriveRequest derives;
  for (int i = 0; i < 3; ++i) {
    auto* item = derives.add_items();
    item->set_key_id("md-x");
    item->set_peer_public_key(i == 1 ? RandomPeer() : peer);
  }
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              auto r = client->BatchDerive(derives);
              ASSERT_TRUE(r.ok()) << r.status();
              EXPECT_EQ(r->results(0).response().shared_key(), raw->shared_key());
              EXPECT_TRUE(r->results(0).response().memo_hit());
              EXPECT_EQ(r->results(1).status().code(), 0);
              EXPECT_EQ(r->results(2).response().shared_key(), raw->shared_key());
            }), 1);

  // Without opting in, nothing of the kind is remembered.
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              for (int k = 0; k < 3; ++k) ASSERT_TRUE(other->Derive("md-x", peer).ok());
            }), 3);
  EXPECT_EQ(other->Stats().derive_memo.entries, 0);

  // ResetMemos wipes every memo: the next open asks the server again.
  client->ResetMemos();
  EXPECT_EQ(client->Stats().open_memo.entries, 0);
  EXPECT_EQ(client->Stats().derive_memo.entries, 0);
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              EXPECT_TRUE(client->AeadOpen("md-aead", mine->envelope(), "ad").ok());
            }), 1);
}

// Another client disables the key: within the maximum age the remembered answers are still used
// (that is the documented bound), until this client sees a refusal about the key, which drops its
// entries at once.
TEST_F(ClientMemoTest, ARefusalAboutAKeyDropsItsEntries) {
  auto client = Make(Remembering(server_->address()));
  ClientOptions plain;
  plain.endpoints = server_->address();
  auto admin = Make(plain);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(admin, nullptr);
  ASSERT_TRUE(admin->CreateKey("mr-x", v1::KEY_TYPE_X25519).ok());
  ASSERT_TRUE(admin->CreateKey("mr-y", v1::KEY_TYPE_X25519).ok());
  ASSERT_TRUE(admin->CreateKey("mr-aead", v1::KEY_TYPE_AES256_GCM).ok());
  const std::string p1 = RandomPeer(), p2 = RandomPeer();
  ASSERT_TRUE(client->Derive("mr-x", p1).ok());
  ASSERT_TRUE(client->Derive("mr-y", p1).ok());
  auto sealed = client->AeadSeal("mr-aead", "blob", "");
  ASSERT_TRUE(sealed.ok());

  ASSERT_TRUE(admin->DisableKey("mr-x").ok());
  EXPECT_EQ(ServerRpcs(kDerive, [&] { EXPECT_TRUE(client->Derive("mr-x", p1).ok()); }), 0)
      << "remembered, and no refusal seen yet";
  // A refusal about mr-x (for another peer) drops all of mr-x's entries, and nothing else.
  EXPECT_EQ(client->Derive("mr-x", p2).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_GE(client->Stats().derive_memo.dropped, 1);
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              EXPECT_EQ(client->Derive("mr-x", p1).status().code(),
                        absl::StatusCode::kFailedPrecondition);
              EXPECT_TRUE(client->Derive("mr-y", p1).ok());
            }), 1);

  // As a batch item's error: mr-x enabled and remembered again, disabled, then a batch with a
  // new mr-x item and a remembered mr-y item.
  ASSERT_TRUE(admin->EnableKey("mr-x").ok());
  ASSERT_TRUE(client->Derive("mr-x", p1).ok());
  ASSERT_TRUE(admin->DisableKey("mr-x").ok());
  v1::BatchDeriveRequest batch;
  for (const auto& [key, peer] : {std::make_pair("mr-x", p2), std::make_pair("mr-y", p1),
                                  std::make_pair("mr-y", std::string("short"))}) {
    auto* item = batch.add_items();
    item->set_key_id(key);
    item->set_peer_public_key(peer);
  }
  auto answered = client->BatchDerive(batch);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->results(0).status().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(answered->results(1).response().memo_hit());
  EXPECT_EQ(answered->results(2).status().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              EXPECT_EQ(client->Derive("mr-x", p1).status().code(),
                        absl::StatusCode::kFailedPrecondition);  // dropped by the item error
              auto y = client->Derive("mr-y", p1);  // an INVALID_ARGUMENT item dropped nothing
              ASSERT_TRUE(y.ok());
              EXPECT_TRUE(y->memo_hit());
            }), 1);

  // This client's own DisableKey drops the key's entries at once.
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              EXPECT_TRUE(client->AeadOpen("mr-aead", sealed->envelope(), "").ok());
            }), 0);
  ASSERT_TRUE(client->DisableKey("mr-aead").ok());
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              EXPECT_EQ(client->AeadOpen("mr-aead", sealed->envelope(), "").status().code(),
                        absl::StatusCode::kFailedPrecondition);
            }), 1);
  ASSERT_TRUE(client->EnableKey("mr-aead").ok());
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              for (int k = 0; k < 2; ++k) {
                EXPECT_TRUE(client->AeadOpen("mr-aead", sealed->envelope(), "").ok());
              }
            }), 1);
}

// This client's own RotateKey: a derive asked as "current" means the new version from then on,
// not the old version's remembered key (the TypeScript client does the same). Without the drop
// the second derive was a memo hit answering key_version 1.
TEST_F(ClientMemoTest, ThisClientsOwnRotationDropsTheKeysEntries) {
  auto client = Make(Remembering(server_->address()));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("mr-rot", v1::KEY_TYPE_X25519).ok());
  const std::string peer = RandomPeer();
  auto first = client->Derive("mr-rot", peer);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->key_version(), 1u);
  auto rotated = client->RotateKey("mr-rot");
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              auto second = client->Derive("mr-rot", peer);
              ASSERT_TRUE(second.ok()) << second.status();
              EXPECT_FALSE(second->memo_hit());
              EXPECT_EQ(second->key_version(), 2u);
              EXPECT_NE(second->shared_key(), first->shared_key());
            }), 1);
}

// A key deleted elsewhere and created again under the same id by this client is another key: a
// successful CreateKey (or ImportKey) drops what the memos kept for the id, as DeleteKey does.
// Without that, the new key's derives and opens were answered with the old key's results.
TEST(ClientMemoRecreatedKeyTest, CreatingAKeyDropsTheEntriesOfTheKeyThatHadItsId) {
  ASSERT_GE(sodium_init(), 0);
  ServerProcess server("recreated");
  server.AddFlag("--key_deletion_wait=0s");  // a deleted key is gone at once
  server.Start();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto client = Make(Remembering(server.address()));
  ClientOptions plain;
  plain.endpoints = server.address();
  plain.timeout = absl::Seconds(30);
  auto admin = Make(plain);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(admin, nullptr);
  const std::string peer = RandomPeer();
  ASSERT_TRUE(client->CreateKey("rc-x", v1::KEY_TYPE_X25519).ok());
  ASSERT_TRUE(client->CreateKey("rc-aead", v1::KEY_TYPE_XCHACHA20_POLY1305).ok());
  auto old_shared = client->Derive("rc-x", peer);
  auto old_sealed = client->AeadSeal("rc-aead", "old blob", "ad");
  ASSERT_TRUE(old_shared.ok() && old_sealed.ok());

  // Deleted by someone else (this client sees nothing), then created again by this client.
  ASSERT_TRUE(admin->DeleteKey("rc-x").ok());
  ASSERT_TRUE(admin->DeleteKey("rc-aead").ok());
  ASSERT_TRUE(client->CreateKey("rc-x", v1::KEY_TYPE_X25519).ok());
  auto imported = client->ImportKey("rc-aead", v1::KEY_TYPE_XCHACHA20_POLY1305,
                                    std::string(32, '\x5a'));
  ASSERT_TRUE(imported.ok()) << imported.status();

  auto truth = admin->Derive("rc-x", peer);
  ASSERT_TRUE(truth.ok()) << truth.status();
  ASSERT_NE(truth->shared_key(), old_shared->shared_key());
  auto derived = client->Derive("rc-x", peer);
  ASSERT_TRUE(derived.ok()) << derived.status();
  EXPECT_EQ(derived->shared_key(), truth->shared_key()) << "the deleted key's shared key";
  const absl::StatusCode refused =
      admin->AeadOpen("rc-aead", old_sealed->envelope(), "ad").status().code();
  ASSERT_NE(refused, absl::StatusCode::kOk);
  EXPECT_EQ(client->AeadOpen("rc-aead", old_sealed->envelope(), "ad").status().code(), refused)
      << "the deleted key's plaintext";
}

// Sleep past a short maximum age, then the server is asked again. (The reverse - no call before
// the age - is asserted by the other tests with ages of minutes, never under a tight time.)
TEST_F(ClientMemoTest, AnEntryPastItsMaximumAgeIsNeverUsed) {
  const absl::Duration age = absl::Milliseconds(500);
  auto client = Make(Remembering(server_->address(), age));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("ma-x", v1::KEY_TYPE_X25519).ok());
  ASSERT_TRUE(client->CreateKey("ma-aead", v1::KEY_TYPE_CHACHA20_POLY1305).ok());
  const std::string peer = RandomPeer();
  auto first = client->Derive("ma-x", peer);
  ASSERT_TRUE(first.ok());
  auto sealed = client->AeadSeal("ma-aead", "blob", "");
  ASSERT_TRUE(sealed.ok());
  absl::SleepFor(age + absl::Milliseconds(200));
  EXPECT_EQ(ServerRpcs(kDerive, [&] {
              auto again = client->Derive("ma-x", peer);
              ASSERT_TRUE(again.ok());
              EXPECT_EQ(again->shared_key(), first->shared_key());
            }), 1);
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              EXPECT_TRUE(client->AeadOpen("ma-aead", sealed->envelope(), "").ok());
            }), 1);
  EXPECT_GE(client->Stats().derive_memo.expired, 1);
  EXPECT_GE(client->Stats().open_memo.expired, 1);
  EXPECT_EQ(client->Stats().derive_memo.hits, 0);
  EXPECT_EQ(client->Stats().open_memo.hits, 0);
}

// Under a byte bound smaller than the set, a blob re-read between new ones stays (a hit moves it
// to the newest end) and the least recently used one goes: the mobile app's resume pattern.
TEST_F(ClientMemoTest, TheByteBoundKeepsWhatIsReread) {
  constexpr size_t kBlob = 20000;
  ClientOptions o = Remembering(server_->address());
  o.open_memo_bytes = 3 * Memo::EntryCost(kBlob, 7) + 1000;  // room for three blobs of key "mb-aead"
  auto client = Make(o);
  ClientOptions plain;
  plain.endpoints = server_->address();
  plain.timeout = absl::Seconds(30);
  auto sealer = Make(plain);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(sealer, nullptr);
  ASSERT_TRUE(sealer->CreateKey("mb-aead", v1::KEY_TYPE_XCHACHA20_POLY1305).ok());
  std::vector<std::string> blobs;
  for (int i = 0; i < 5; ++i) {
    auto s = sealer->AeadSeal("mb-aead", std::string(kBlob, static_cast<char>('a' + i)), "");
    ASSERT_TRUE(s.ok());
    blobs.push_back(s->envelope());
  }
  auto open = [&](int i) {
    auto r = client->AeadOpen("mb-aead", blobs[i], "");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->plaintext() == std::string(kBlob, static_cast<char>('a' + i));
  };
  // 0, 1, 2 remembered; 0 re-read (now the newest); 3 pushes out 1, the least recently used.
  EXPECT_EQ(ServerRpcs(kOpen, [&] {
              for (int i : {0, 1, 2}) EXPECT_TRUE(open(i));
            }), 3);
  EXPECT_EQ(ServerRpcs(kOpen, [&] { EXPECT_TRUE(open(0)); }), 0);
  EXPECT_EQ(ServerRpcs(kOpen, [&] { EXPECT_TRUE(open(3)); }), 1);
  const ClientStats s = client->Stats();
  EXPECT_EQ(s.open_memo.evictions, 1);
  EXPECT_EQ(s.open_memo.entries, 3);
  EXPECT_LE(s.open_memo.bytes, static_cast<int64_t>(o.open_memo_bytes));
  EXPECT_EQ(ServerRpcs(kOpen, [&] { EXPECT_TRUE(open(0)); }), 0) << "re-read, so kept";
  EXPECT_EQ(ServerRpcs(kOpen, [&] { EXPECT_TRUE(open(2)); }), 0);
  EXPECT_EQ(ServerRpcs(kOpen, [&] { EXPECT_TRUE(open(1)); }), 1) << "the least recently used";
  EXPECT_LE(client->Stats().open_memo.bytes, static_cast<int64_t>(o.open_memo_bytes));
}

// ---------------------------------------------------------------------------------------------
// Tokens: a server that requires them (EdDSA, checked against its JWKS file), with a policy.

std::string B64Url(absl::string_view s) { return absl::WebSafeBase64Escape(s); }

class TokenMemoTest : public ::testing::Test {
 protected:
  static constexpr char kIssuer[] = "https://id.memo-test.example";
  static constexpr char kAudience[] = "crypto-offload";

  static void SetUpTestSuite() {
    ASSERT_GE(sodium_init(), 0);
    crypto_sign_keypair(pk_, sk_);
    server_ = new ServerProcess("tokens");
    server_->Prepare();
    char dir[] = "/tmp/offload-memo-tokens-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    std::ofstream(dir_ + "/jwks.json")
        << R"({"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":")"
        << B64Url(Bytes(pk_, 32)) << R"("}]})";
    std::ofstream(dir_ + "/policy.json")
        << R"({"admins":["tester"],"grants":[{"client":"tester","keys":["*"],"operations":["*"]}]})";
    server_->AddFlag("--jwks_file=" + dir_ + "/jwks.json");
    server_->AddFlag(absl::StrCat("--token_issuer=", kIssuer));
    server_->AddFlag(absl::StrCat("--token_audience=", kAudience));
    server_->AddFlag("--policy_file=" + dir_ + "/policy.json");
    server_->AddFlag("--require_identity");
    server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    sodium_memzero(sk_, sizeof(sk_));
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", server_->LogTail().c_str());
  }

  // An EdDSA JWT for `sub`, valid for `lifetime` from now (negative: expired).
  static std::string Token(const std::string& sub, absl::Duration lifetime = absl::Minutes(10)) {
    const int64_t now = absl::ToUnixSeconds(absl::Now());
    const std::string header = B64Url(R"({"alg":"EdDSA","kid":"k1","typ":"JWT"})");
    const std::string payload = B64Url(absl::StrCat(
        R"({"iss":")", kIssuer, R"(","aud":")", kAudience, R"(","sub":")", sub, R"(","iat":)",
        now - 5, R"(,"exp":)", now + absl::ToInt64Seconds(lifetime), "}"));
    const std::string input = absl::StrCat(header, ".", payload);
    unsigned char sig[crypto_sign_BYTES];
    crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(input.data()),
                         input.size(), sk_);
    return absl::StrCat(input, ".", B64Url(Bytes(sig, sizeof(sig))));
  }

  static ServerProcess* server_;
  static std::string dir_;
  static unsigned char pk_[crypto_sign_PUBLICKEYBYTES];
  static unsigned char sk_[crypto_sign_SECRETKEYBYTES];
};
ServerProcess* TokenMemoTest::server_ = nullptr;
std::string TokenMemoTest::dir_;
unsigned char TokenMemoTest::pk_[crypto_sign_PUBLICKEYBYTES];
unsigned char TokenMemoTest::sk_[crypto_sign_SECRETKEYBYTES];

TEST_F(TokenMemoTest, TheProviderIsAskedOnceMoreOnUnauthenticated) {
  absl::Mutex mu;
  int asked = 0;
  std::string next = Token("tester");
  ClientOptions o;
  o.endpoints = server_->address();
  o.timeout = absl::Seconds(30);
  o.token_provider = [&]() -> absl::StatusOr<std::string> {
    absl::MutexLock lock(&mu);
    ++asked;
    return next;
  };
  // No token to start with: the provider is asked before the first RPC.
  auto client = Make(o);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("tk-ed", v1::KEY_TYPE_ED25519).ok());
  EXPECT_EQ(asked, 1);

  // An expired token: refused UNAUTHENTICATED, the provider asked once, the call sent once more.
  ASSERT_TRUE(client->SetBearerToken(Token("tester", absl::Minutes(-10))).ok());
  const int64_t rpcs = client->Stats().rpcs;
  auto sig = client->Sign("tk-ed", "m");
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(client->Stats().rpcs - rpcs, 2);
  EXPECT_EQ(client->Stats().token_refreshes, 2);

  // Many calls refused together with the same expired token ask the provider once.
  ASSERT_TRUE(client->SetBearerToken(Token("tester", absl::Minutes(-10))).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto r = client->Sign("tk-ed", absl::StrCat("m", t));
      EXPECT_TRUE(r.ok()) << r.status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(asked, 3);

  // A provider that only has an expired token: one more try, then UNAUTHENTICATED.
  {
    absl::MutexLock lock(&mu);
    next = Token("tester", absl::Minutes(-10));
  }
  ASSERT_TRUE(client->SetBearerToken(next).ok());
  const int64_t before = client->Stats().rpcs;
  EXPECT_EQ(client->Sign("tk-ed", "m").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(client->Stats().rpcs - before, 2);
  EXPECT_EQ(asked, 4);

  // A provider that fails: its error is the call's.
  ClientOptions failing = o;
  failing.token_provider = []() -> absl::StatusOr<std::string> {
    return absl::UnavailableError("identity provider down");
  };
  auto lost = Make(failing);
  ASSERT_NE(lost, nullptr);
  const absl::Status s = lost->Sign("tk-ed", "m").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("token provider: identity provider down"), std::string::npos) << s;
  EXPECT_EQ(lost->Stats().rpcs, 0);
}

// PERMISSION_DENIED is a refusal about the key: a caller whose token lost its grant drops that
// key's entries.
TEST_F(TokenMemoTest, PermissionDeniedDropsTheKeysEntries) {
  ClientOptions o = Remembering(server_->address());
  o.bearer_token = Token("tester");
  auto client = Make(o);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("tk-aead", v1::KEY_TYPE_AES256_GCM).ok());
  auto sealed = client->AeadSeal("tk-aead", "blob", "");
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  ASSERT_TRUE(client->AeadOpen("tk-aead", sealed->envelope(), "").ok());
  EXPECT_EQ(client->Stats().open_memo.entries, 1);
  ASSERT_TRUE(client->SetBearerToken(Token("nobody")).ok());
  EXPECT_EQ(client->AeadSeal("tk-aead", "other", "").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client->Stats().open_memo.entries, 0);
  EXPECT_EQ(client->AeadOpen("tk-aead", sealed->envelope(), "").status().code(),
            absl::StatusCode::kPermissionDenied);
}

// ---------------------------------------------------------------------------------------------
// Refusals that say when to come back (RetryInfo), from a peer that refuses as an overloaded
// server does (test_server.h: RefusingPeer).

ClientOptions Retrying(const std::string& address, int max_attempts = 4) {
  ClientOptions o;
  o.endpoints = address;
  o.timeout = absl::Seconds(30);
  o.max_attempts = max_attempts;
  o.initial_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(2);  // so that a pause of 200 ms is the server's doing
  return o;
}

TEST(RetryInfoPeerTest, ResourceExhaustedWithARetryDelayIsRetriedAfterIt) {
  const absl::Duration delay = absl::Milliseconds(200);
  testing::RefusingPeer peer(grpc::StatusCode::RESOURCE_EXHAUSTED, 2, delay);
  auto client = Make(Retrying(peer.address()));
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  auto r = client->Sign("k", "m");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(peer.calls(), 3);
  EXPECT_EQ(client->Stats().rpcs, 3);
  EXPECT_EQ(client->Stats().retry_info_waits, 2);
  EXPECT_GE(took, 2 * delay) << "waited at least the delay before each retry";
  EXPECT_FALSE(client->IsEndpointDown(peer.address())) << "an overloaded server is alive";
}

TEST(RetryInfoPeerTest, ResourceExhaustedWithoutARetryDelayIsReturnedAsIs) {
  testing::RefusingPeer peer(grpc::StatusCode::RESOURCE_EXHAUSTED, 1, std::nullopt);
  auto client = Make(Retrying(peer.address()));
  ASSERT_NE(client, nullptr);
  const absl::Status s = client->Sign("k", "m").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(), "overloaded");
  EXPECT_EQ(peer.calls(), 1);
  EXPECT_EQ(client->Stats().retry_info_waits, 0);
}

TEST(RetryInfoPeerTest, ADelayPastTheDeadlineOrTheAttemptsReturnsTheRefusal) {
  testing::RefusingPeer peer(grpc::StatusCode::RESOURCE_EXHAUSTED, 100, absl::Seconds(30));
  ClientOptions o = Retrying(peer.address());
  o.timeout = absl::Seconds(10);
  auto client = Make(o);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  const absl::Status s = client->Sign("k", "m").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_LT(absl::Now() - start, o.timeout) << "did not wait for a delay it could not keep";
  EXPECT_EQ(peer.calls(), 1);

  testing::RefusingPeer busy(grpc::StatusCode::RESOURCE_EXHAUSTED, 100, absl::Milliseconds(20));
  auto limited = Make(Retrying(busy.address(), /*max_attempts=*/3));
  ASSERT_NE(limited, nullptr);
  EXPECT_EQ(limited->Sign("k", "m").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(busy.calls(), 3);
  EXPECT_EQ(limited->Stats().retry_info_waits, 2);
}

TEST(RetryInfoPeerTest, UnavailableWithARetryDelayWaitsAtLeastThatLong) {
  const absl::Duration delay = absl::Milliseconds(300);
  testing::RefusingPeer peer(grpc::StatusCode::UNAVAILABLE, 1, delay);
  auto client = Make(Retrying(peer.address()));
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  auto r = client->Sign("k", "m");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(peer.calls(), 2);
  EXPECT_EQ(client->Stats().retry_info_waits, 1);
  EXPECT_GE(took, delay);
}

// A real server sized to refuse (--max_queued_items = --max_batch_items = 16: while a full batch
// runs, every other call is RESOURCE_EXHAUSTED with a RetryInfo): a client with no retries sees the refusal, a retrying
// client's calls all succeed, having waited as the server asked at least once.
TEST(OverloadTest, ARealServersRefusalsAreRetriedAfterItsDelay) {
  ASSERT_GE(sodium_init(), 0);
  ServerProcess server("overload");
  server.AddFlag("--max_batch_items=16");
  server.AddFlag("--max_queued_items=16");
  server.Start();
  ASSERT_TRUE(server.running());
  ClientOptions plain;
  plain.endpoints = server.address();
  plain.timeout = absl::Seconds(30);
  auto admin = Make(plain);
  ASSERT_NE(admin, nullptr);
  ASSERT_TRUE(admin->CreateKey("ol-ed", v1::KEY_TYPE_ED25519).ok());
  auto sig = admin->Sign("ol-ed", "m");
  ASSERT_TRUE(sig.ok()) << sig.status();

  // Load: full batches of invalid signatures (never remembered, so always computed) back to back.
  std::atomic<bool> load{true};
  ClientOptions loader_options = plain;
  loader_options.max_attempts = 1;
  loader_options.verify_memo_bytes = 0;
  loader_options.server_max_batch_items = 16;
  auto loader = Make(loader_options);
  ASSERT_NE(loader, nullptr);
  v1::BatchVerifyRequest big;
  for (int i = 0; i < 16; ++i) {
    auto* item = big.add_items();
    item->set_public_key(sig->public_key());
    item->set_message(absl::StrCat("load ", i));
    item->set_signature(sig->signature());
  }
  std::vector<std::thread> loaders;
  for (int t = 0; t < 2; ++t) {
    loaders.emplace_back([&] {
      while (load.load()) loader->BatchVerify(big).IgnoreError();
    });
  }
  auto stop_load = absl::MakeCleanup([&] {
    load = false;
    for (auto& t : loaders) t.join();
  });

  // No retries: the refusal itself.
  ClientOptions once = plain;
  once.max_attempts = 1;
  auto probe = Make(once);
  ASSERT_NE(probe, nullptr);
  absl::Status refused;
  for (absl::Time give_up = absl::Now() + absl::Seconds(60);
       absl::Now() < give_up && refused.code() != absl::StatusCode::kResourceExhausted;) {
    refused = probe->Sign("ol-ed", "probe").status();
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(probe->Stats().retry_info_waits, 0);

  // Retries: calls from 4 threads while the load runs, until one was refused and retried; then
  // the load stops, and every call has succeeded.
  ClientOptions patient = plain;
  patient.max_attempts = 100;
  patient.timeout = absl::Seconds(120);
  auto client = Make(patient);
  ASSERT_NE(client, nullptr);
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::vector<std::string> errors;
  int64_t calls = 0;
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int n = 0; !stop.load(); ++n) {
        const absl::Status s = client->Sign("ol-ed", absl::StrCat(t, ":", n)).status();
        absl::MutexLock lock(&mu);
        ++calls;
        if (!s.ok()) errors.push_back(s.ToString());
      }
    });
  }
  for (absl::Time give_up = absl::Now() + absl::Seconds(60);
       absl::Now() < give_up && client->Stats().retry_info_waits == 0;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::move(stop_load).Invoke();
  stop = true;
  for (auto& t : callers) t.join();
  const ClientStats stats = client->Stats();
  std::printf("overload: %lld calls, %lld retries after a RetryInfo, %zu errors\n",
              static_cast<long long>(calls), static_cast<long long>(stats.retry_info_waits),
              errors.size());
  EXPECT_GE(stats.retry_info_waits, 1);
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, first: " << errors.front();
}

}  // namespace
}  // namespace offload::client
