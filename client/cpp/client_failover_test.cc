// The C++ client's connection handling and failover against real offload_server processes on
// loopback ports (bounds are outcomes with generous margins, never latencies):
// - a call made while nothing listens succeeds once the server starts 1 s later, on one RPC
//   (default options but a long deadline), and with no server a short deadline fails at it, not
//   at once and not much later;
// - a port that accepts TCP and never answers ends calls by their deadline, and beside a live
//   endpoint its keys fail over;
// - one server SIGKILLed and restarted under load: no caller sees an error;
// - three replicas, one killed and restarted under load: a survivor's keys never leave it (each
//   such key exists on its own replica only, so a call served anywhere else would fail, and each
//   server's item counters are checked), and the victim's keys come back to it once it serves
//   again (the time is printed);
// - an auto-batch grouped for a survivor while the victim was down goes to that survivor, even
//   when its first item's key has returned to the victim before the batch leaves;
// - the test harness replaces a first start's ports that another process took meanwhile.
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/rendezvous.h"
#include "client/cpp/test_server.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

using testing::FreePort;
using testing::ReplicasFixture;
using testing::ServerProcess;
using testing::FaultyListener;

// Slack on top of a deadline, for an ASan build on 2 busy cores: the bounds below prove that a
// call ends by its deadline instead of hanging, not that it is quick.
constexpr absl::Duration kSlack = absl::Seconds(5);

std::string Bytes(const unsigned char* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

// A deterministic 32-byte secret for key `i`.
std::string Secret(int i, char tag) {
  std::string s(32, '\0');
  for (int k = 0; k < 32; ++k) s[k] = static_cast<char>(tag + 11 * i + 5 * k);
  return s;
}

std::unique_ptr<Client> MakeClient(const std::string& endpoints, ClientOptions o = {}) {
  o.endpoints = endpoints;
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A valid Ed25519 signature of `message` under a fixed key, made with libsodium.
struct Signed {
  std::string public_key, message, signature;
};
Signed SignLocally(const std::string& message) {
  unsigned char pk[32], sk[64], sig[64];
  const std::string seed = Secret(99, 's');
  crypto_sign_seed_keypair(pk, sk, reinterpret_cast<const unsigned char*>(seed.data()));
  crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(message.data()),
                       message.size(), sk);
  sodium_memzero(sk, sizeof(sk));
  return {Bytes(pk, 32), message, Bytes(sig, 64)};
}

bool DeadlineOrUnavailable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kUnavailable;
}

class ConnectTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_GE(sodium_init(), 0); }
};

TEST_F(ConnectTest, CallMadeBeforeTheServerStartsSucceedsOnceItListens) {
  ServerProcess server("late");
  server.Prepare();  // its port is known, nothing listens on it yet
  ASSERT_FALSE(HasFatalFailure());
  // Default options but the deadline: 4 attempts, and a deadline that an ASan server, started
  // 1 s after the calls on a busy machine, cannot miss.
  ClientOptions o;
  o.timeout = absl::Seconds(60);
  auto client = MakeClient(server.address(), o);
  ASSERT_NE(client, nullptr);
  const Signed sig = SignLocally("late");

  const absl::Time start = absl::Now();
  std::atomic<int> finished{0};
  absl::StatusOr<v1::ListKeysResponse> list;
  absl::StatusOr<v1::VerifyResponse> verify;
  absl::Duration list_took, verify_took;
  std::thread a([&] {
    list = client->ListKeys();
    list_took = absl::Now() - start;
    finished++;
  });
  std::thread b([&] {
    verify = client->Verify(sig.public_key, sig.message, sig.signature);  // auto-batched
    verify_took = absl::Now() - start;
    finished++;
  });
  absl::SleepFor(absl::Seconds(1));
  const int finished_before_server = finished.load();
  server.Launch();
  server.WaitUntilServing();
  const absl::Time serving = absl::Now();
  a.join();
  b.join();
  std::printf("server launched 1 s after the calls: ListKeys %s after %s, Verify %s after %s\n",
              list.status().ToString().c_str(), absl::FormatDuration(list_took).c_str(),
              verify.status().ToString().c_str(), absl::FormatDuration(verify_took).c_str());
  EXPECT_EQ(finished_before_server, 0) << "a call gave up before the server started";
  ASSERT_TRUE(list.ok()) << list.status() << "\n" << server.LogTail();
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_TRUE(verify->valid());
  // Picked up by the channel's redialling, whose backoff is at most max_backoff (+20 % jitter)
  // after the server listens; the slack is for a busy machine.
  const absl::Time latest = serving + o.max_backoff * 1.2 + kSlack;
  EXPECT_LE(start + list_took, latest);
  EXPECT_LE(start + verify_took, latest);
  // They waited for the connection rather than spending attempts on it: one RPC each.
  const ClientStats stats = client->Stats();
  EXPECT_EQ(stats.rpcs, 2);
  EXPECT_EQ(stats.retries, 0);
  EXPECT_EQ(stats.failed_calls, 0);
}

// The test harness itself: a port picked by FreePort and taken by someone else before the server
// binds it (the server refuses to share it) is replaced, on a first start, by fresh ports.
TEST_F(ConnectTest, HarnessStartsAgainOnFreshPortsWhenItsPortIsTaken) {
  ServerProcess server("port-taken");
  server.Prepare();
  ASSERT_FALSE(HasFatalFailure());
  const std::string taken = server.address();
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  absl::Cleanup close_holder = [holder] { close(holder); };
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(taken.substr(taken.rfind(':') + 1), &port));
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(holder, 1), 0);
  server.Start();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_NE(server.address(), taken);
  auto client = MakeClient(server.address());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->ListKeys().ok());
}

TEST_F(ConnectTest, ShortDeadlineWithNoServerFailsCloseToIt) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());  // nothing listens
  ClientOptions o;
  o.timeout = absl::Milliseconds(800);
  o.max_attempts = 30;
  auto client = MakeClient(address, o);
  ASSERT_NE(client, nullptr);
  const Signed sig = SignLocally("nobody");
  constexpr int kCalls = 20;
  std::vector<absl::Status> status(kCalls + 1);
  std::vector<absl::Duration> took(kCalls + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i <= kCalls; ++i) {
    threads.emplace_back([&, i] {
      const absl::Time start = absl::Now();
      status[i] = i == kCalls ? client->ListKeys().status()
                              : client->Verify(sig.public_key, sig.message, sig.signature).status();
      took[i] = absl::Now() - start;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i <= kCalls; ++i) {
    EXPECT_TRUE(DeadlineOrUnavailable(status[i])) << i << ": " << status[i];
    EXPECT_LE(took[i], o.timeout + kSlack) << i;
    // It waited for the server (nothing to fail over to) instead of giving up at once.
    EXPECT_GE(took[i], o.timeout - absl::Milliseconds(100)) << i << ": " << status[i];
  }
  std::printf("no server, 800 ms deadline: ListKeys %s after %s\n",
              status[kCalls].ToString().c_str(), absl::FormatDuration(took[kCalls]).c_str());
}

TEST_F(ConnectTest, PortThatAcceptsButNeverAnswers) {
  FaultyListener silent(FaultyListener::Mode::kSilent);
  ASSERT_FALSE(silent.address().empty());
  const Signed sig = SignLocally("silent");
  {
    // Alone: every call ends by its deadline.
    ClientOptions o;
    o.timeout = absl::Milliseconds(1500);
    auto client = MakeClient(silent.address(), o);
    ASSERT_NE(client, nullptr);
    constexpr int kCalls = 10;
    std::vector<absl::Status> status(kCalls + 1);
    std::vector<absl::Duration> took(kCalls + 1);
    std::vector<std::thread> threads;
    for (int i = 0; i <= kCalls; ++i) {
      threads.emplace_back([&, i] {
        const absl::Time start = absl::Now();
        status[i] = i == kCalls
                        ? client->ListKeys().status()
                        : client->Verify(sig.public_key, sig.message, sig.signature).status();
        took[i] = absl::Now() - start;
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i <= kCalls; ++i) {
      EXPECT_TRUE(DeadlineOrUnavailable(status[i])) << i << ": " << status[i];
      EXPECT_LE(took[i], o.timeout + kSlack) << i;
    }
    std::printf("silent port alone, 1.5 s deadline: ListKeys %s after %s; %d TCP connections\n",
                status[kCalls].ToString().c_str(), absl::FormatDuration(took[kCalls]).c_str(),
                silent.accepted());
    EXPECT_GE(silent.accepted(), 1);  // the client did reach the port
  }

  // Beside a live server: the keys whose first choice is the silent port fail over to it.
  ServerProcess server("beside-silent");
  server.Start();
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::string> all = {silent.address(), server.address()};
  std::sort(all.begin(), all.end());
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 8; ++i) {
    const std::string k = absl::StrCat("silent-", i);
    if (all[RankEndpoints(k, all)[0]] == silent.address()) keys.push_back(k);
  }
  // A long first down mark: the check below that the silent port is marked down must not depend
  // on how long the calls took.
  ClientOptions beside;
  beside.endpoint_down_initial = absl::Minutes(10);
  beside.endpoint_down_max = absl::Minutes(10);
  auto client = MakeClient(absl::StrCat(silent.address(), ",", server.address()), beside);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  std::vector<absl::Status> status(keys.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < keys.size(); ++i) {
    threads.emplace_back([&, i] {
      status[i] = client->CreateKey(keys[i], v1::KEY_TYPE_ED25519).status();
      if (status[i].ok()) status[i] = client->Sign(keys[i], "m").status();
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(status[i].ok()) << keys[i] << status[i];
  EXPECT_LT(took, beside.timeout);  // failed over, rather than waiting for a deadline
  EXPECT_TRUE(client->IsEndpointDown(silent.address()));
  EXPECT_GE(client->Stats().connect_failures, 1);
  EXPECT_EQ(client->Stats().rpcs_by_endpoint[silent.address()], 0);  // no RPC was sent there
  std::printf("silent port beside a live server: %zu keys created and used in %s\n", keys.size(),
              absl::FormatDuration(took).c_str());
}

TEST_F(ConnectTest, SingleServerRestartedUnderLoadLosesNoCall) {
  ServerProcess server("restarted");
  server.Start();
  ASSERT_FALSE(HasFatalFailure());
  // Default options but the deadline, which must cover the kill, the restart of an ASan server on
  // a busy machine and the reconnection: a call may wait, but none may fail.
  ClientOptions o;
  o.timeout = absl::Seconds(60);
  auto client = MakeClient(server.address(), o);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateKey("restart-ed", v1::KEY_TYPE_ED25519).ok());  // kept on disk
  auto sig = client->Sign("restart-ed", "m");
  ASSERT_TRUE(sig.ok()) << sig.status();

  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok_calls{0}, ok_after_restart{0};
  std::atomic<bool> restarted{false};
  absl::Mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> load;
  for (int t = 0; t < 6; ++t) {
    load.emplace_back([&, t] {
      for (int n = 0; !stop.load(); ++n) {
        absl::Status s;
        if ((n + t) % 2 == 0) {
          s = client->Sign("restart-ed", absl::StrCat("load ", n)).status();
        } else {
          auto v = client->Verify(sig->public_key(), "m", sig->signature());
          s = v.status();
          if (v.ok() && !v->valid()) s = absl::InternalError("valid signature rejected");
        }
        if (s.ok()) {
          ok_calls++;
          if (restarted.load()) ok_after_restart++;
        } else {
          absl::MutexLock lock(&mu);
          errors.push_back(s.ToString());
        }
      }
    });
  }
  auto wait_for = [](std::atomic<int64_t>& counter, int64_t n) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (counter.load() < n && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return counter.load() >= n;
  };
  EXPECT_TRUE(wait_for(ok_calls, 200));
  server.Kill();
  absl::SleepFor(absl::Milliseconds(500));
  server.Start();  // same port and data
  restarted = true;
  EXPECT_TRUE(wait_for(ok_after_restart, 200));
  stop = true;
  for (auto& t : load) t.join();
  const ClientStats stats = client->Stats();
  std::printf("one server killed, restarted 0.5 s later: %lld calls ok (%lld after), %zu errors, "
              "%lld retries\n",
              static_cast<long long>(ok_calls.load()),
              static_cast<long long>(ok_after_restart.load()), errors.size(),
              static_cast<long long>(stats.retries));
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, first: " << errors.front();
}

// ---------------------------------------------------------------------------------------------
// Three replicas. Keys whose first choice is the victim exist on every replica (they fail over
// and come back); every other key exists on its own replica only.

class ReplicaRestartTest : public ReplicasFixture {
 protected:
  static constexpr int kKeys = 24;

  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    StartReplicas(3);
    ASSERT_FALSE(HasFatalFailure());
    std::vector<std::string> all;
    for (const auto& s : servers_) all.push_back(s->address());
    std::sort(all.begin(), all.end());
    std::map<std::string, int> per_server;
    for (int i = 0; i < kKeys; ++i) {
      const std::vector<int> rank = RankEndpoints(Key(i), all);
      home_.push_back(all[rank[0]]);
      second_.push_back(all[rank[1]]);
      per_server[home_.back()]++;
    }
    for (const auto& [address, n] : per_server) {
      if (victim_.empty() || n > per_server[victim_]) victim_ = address;
    }
    ASSERT_EQ(per_server.size(), 3u) << "a replica has no key; change kKeys";
    unsigned char peer_pk[32], peer_sk[32];
    crypto_box_keypair(peer_pk, peer_sk);
    peer_ = Bytes(peer_pk, 32);
    for (int i = 0; i < kKeys; ++i) {
      const std::string secret = Secret(i, 'x');
      unsigned char pub[32], shared[32];
      crypto_scalarmult_base(pub, reinterpret_cast<const unsigned char*>(secret.data()));
      ASSERT_EQ(crypto_scalarmult(shared, peer_sk, pub), 0);
      expected_.push_back(Bytes(shared, 32));
    }
    for (const auto& s : servers_) {
      auto direct = MakeClient(s->address());
      ASSERT_NE(direct, nullptr);
      for (int i = 0; i < kKeys; ++i) {
        if (home_[i] != victim_ && home_[i] != s->address()) continue;
        ASSERT_TRUE(direct->ImportKey(Key(i), v1::KEY_TYPE_X25519, Secret(i, 'x')).ok());
      }
    }
  }

  static std::string Key(int i) { return absl::StrCat("x-", i); }
  // Derive / BatchDerive items counted by `server` with `result` ("ok", "error", ...).
  static double DeriveItems(const ServerProcess& server, const std::string& result) {
    const auto items = server.Items();
    double sum = 0;
    for (const char* method : {"Derive", "BatchDerive"}) {
      auto it = items.find({method, result});
      if (it != items.end()) sum += it->second;
    }
    return sum;
  }

  std::vector<std::string> home_, second_;  // by key index
  std::vector<std::string> expected_;       // shared key with peer_, by key index
  std::string victim_;
  std::string peer_;
};

TEST_F(ReplicaRestartTest, SurvivorsKeepTheirKeysAndTheVictimGetsItsBack) {
  // Default options but the deadline: a call may wait out the victim's restart on a busy machine,
  // but none may fail.
  ClientOptions o;
  o.timeout = absl::Seconds(60);
  auto client = MakeClient(Endpoints(), o);
  ASSERT_NE(client, nullptr);
  ServerProcess* victim = ByAddress(victim_);
  ASSERT_NE(victim, nullptr);
  std::map<std::string, double> ok_before;
  for (const auto& s : servers_) {
    if (s->address() != victim_) ok_before[s->address()] = DeriveItems(*s, "ok");
  }

  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok_calls{0};
  absl::Mutex mu;
  std::vector<std::string> errors;
  std::map<std::string, int64_t> ok_by_home;  // guarded by mu
  std::vector<std::thread> load;
  for (int t = 0; t < 8; ++t) {
    load.emplace_back([&, t] {
      for (int n = 0; !stop.load(); ++n) {
        const int i = (n * 5 + t * 3) % kKeys;
        auto d = client->Derive(Key(i), peer_);  // auto-batched: batches mix keys
        absl::MutexLock lock(&mu);
        if (d.ok() && d->shared_key() == expected_[i]) {
          ok_calls++;
          ok_by_home[home_[i]]++;
        } else {
          errors.push_back(absl::StrCat(Key(i), ": ", d.ok() ? "wrong key" : d.status().ToString()));
        }
      }
    });
  }
  auto wait_for = [&](int64_t n) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (ok_calls.load() < n && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return ok_calls.load() >= n;
  };
  EXPECT_TRUE(wait_for(300));
  victim->Kill();
  EXPECT_TRUE(wait_for(ok_calls.load() + 300));
  const absl::Time launched = absl::Now();
  victim->Start();  // same port and data: it still holds its keys
  const absl::Time up = absl::Now();
  // Its keys come back once its channel has reconnected (about max_backoff = 1 s on a quiet
  // machine; printed, not asserted).
  bool back = false;
  while (!back && absl::Now() < up + absl::Seconds(60)) {
    back = true;
    for (int i = 0; i < kKeys; ++i) {
      if (home_[i] == victim_ && client->RouteFor(Key(i)) != victim_) back = false;
    }
    if (!back) absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration back_after = absl::Now() - up;
  EXPECT_TRUE(wait_for(ok_calls.load() + 300));
  // The load goes on until the victim has served some of it (asserted below), or 30 s: its
  // routes came back, but on a busy machine its first calls may come after any fixed count.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       DeriveItems(*victim, "ok") == 0 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  stop = true;
  for (auto& t : load) t.join();

  std::printf("victim %s: restarted, serving after %s, its keys back %s later; %lld calls ok, "
              "%zu errors\n",
              victim_.c_str(), absl::FormatDuration(up - launched).c_str(),
              absl::FormatDuration(back_after).c_str(),
              static_cast<long long>(ok_calls.load()), errors.size());
  EXPECT_TRUE(back);
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, first: " << errors.front();
  // Counted by the servers: no item failed anywhere (a survivor's key served by another replica
  // would be NOT_FOUND there), each survivor served at least every call of its own keys, and the
  // victim served calls again after its restart.
  for (const auto& s : servers_) {
    EXPECT_EQ(DeriveItems(*s, "error"), 0) << s->address();
    const double ok = DeriveItems(*s, "ok");
    absl::MutexLock lock(&mu);
    if (s->address() == victim_) {
      EXPECT_GT(ok, 0) << "the restarted victim served nothing";
    } else {
      EXPECT_GE(ok - ok_before[s->address()], static_cast<double>(ok_by_home[s->address()]))
          << s->address();
    }
    std::printf("  %s%s: %.0f derive items ok, %lld calls of its own keys\n",
                s->address().c_str(), s->address() == victim_ ? " (victim)" : "",
                ok - ok_before[s->address()], static_cast<long long>(ok_by_home[s->address()]));
  }
}

TEST_F(ReplicaRestartTest, BatchGoesWhereItWasGroupedAfterItsFirstKeyReturned) {
  // The batch stays open while the victim restarts, whatever that takes on a busy machine: a
  // window and deadline longer than any restart, and two items fill it, so it is sent as soon as
  // the second joins. The victim's down mark is long too; its return must come from its channel
  // reconnecting, not from a mark running out.
  constexpr absl::Duration kWindow = absl::Seconds(100);
  ClientOptions o;
  o.batch_window = kWindow;
  o.max_batch_items = 2;
  o.timeout = absl::Seconds(120);
  o.endpoint_down_initial = absl::Minutes(10);
  o.endpoint_down_max = absl::Minutes(10);
  auto client = MakeClient(Endpoints(), o);
  ASSERT_NE(client, nullptr);
  ServerProcess* victim = ByAddress(victim_);
  ASSERT_NE(victim, nullptr);
  int kv = -1;  // a key of the victim, and one of its second choice (held there only)
  for (int i = 0; i < kKeys && kv < 0; ++i) {
    if (home_[i] == victim_) kv = i;
  }
  ASSERT_GE(kv, 0);
  const std::string survivor = second_[kv];
  int ks = -1;
  for (int i = 0; i < kKeys && ks < 0; ++i) {
    if (home_[i] == survivor) ks = i;
  }
  ASSERT_GE(ks, 0) << "no key of " << survivor;
  ServerProcess* s = ByAddress(survivor);

  victim->Kill();
  // A unary call of the victim's key finds no connection, fails over, marks the victim down.
  ASSERT_TRUE(client->GetKey(Key(kv)).ok());
  ASSERT_TRUE(client->IsEndpointDown(victim_));
  ASSERT_EQ(client->RouteFor(Key(kv)), survivor);
  const double survivor_ok_before = DeriveItems(*s, "ok");

  // The victim's key leads a batch grouped for the survivor.
  absl::StatusOr<v1::DeriveResponse> first, second;
  const int64_t calls_before = client->Stats().calls;
  const absl::Time opened = absl::Now();
  std::thread leader([&] { first = client->Derive(Key(kv), peer_); });
  while (client->Stats().calls == calls_before) absl::SleepFor(absl::Milliseconds(1));

  // Meanwhile the victim comes back and its key routes to it again (unary calls to the survivor
  // keep gRPC polling, which moves the victim's reconnection along).
  victim->Start();
  absl::Time returned = absl::InfiniteFuture();
  while (absl::Now() < opened + absl::Seconds(60)) {
    if (client->RouteFor(Key(kv)) == victim_) {
      returned = absl::Now();
      break;
    }
    if (auto k = client->GetKey(Key(ks)); !k.ok()) {
      ADD_FAILURE() << "GetKey on the survivor: " << k.status();
      break;  // the leader still needs its follower to finish
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Only now does the survivor's own key join, which fills the batch and sends it.
  std::thread follower([&] { second = client->Derive(Key(ks), peer_); });
  leader.join();
  follower.join();
  std::printf("victim's key routed back %s after the batch opened\n",
              absl::FormatDuration(returned - opened).c_str());
  ASSERT_NE(returned, absl::InfiniteFuture())
      << "the victim's key did not route back within 60 s: the test proves nothing";
  // Sent to the survivor: both answered, by the survivor (the survivor's key is unknown to the
  // victim, which would have failed it).
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->shared_key(), expected_[kv]);
  EXPECT_EQ(second->shared_key(), expected_[ks]);
  EXPECT_EQ(DeriveItems(*s, "ok") - survivor_ok_before, 2);
  EXPECT_EQ(DeriveItems(*victim, "ok") + DeriveItems(*victim, "error"), 0);
}

}  // namespace
}  // namespace offload::client
