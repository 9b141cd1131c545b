// PooledAllocator: released messages come back cleared, the bounds on what waits for reuse hold
// (items, field sizes, unknown fields), and a response's secrets are wiped when it is released.

#include "service/rpc/message_pool.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace offload::rpc {
namespace {

using VerifyPool = PooledAllocator<v1::BatchVerifyRequest, v1::BatchVerifyResponse>;
using DerivePool = PooledAllocator<v1::BatchDeriveRequest, v1::BatchDeriveResponse>;

void Fill(v1::BatchVerifyRequest* request, int items, size_t message_size) {
  for (int i = 0; i < items; ++i) {
    v1::VerifyRequest* item = request->add_items();
    item->set_public_key(std::string(32, 'k'));
    item->set_signature(std::string(64, 's'));
    item->set_message(std::string(message_size, 'm'));
  }
}

TEST(PooledAllocatorTest, AReleasedHolderComesBackCleared) {
  VerifyPool pool;
  auto* holder = pool.AllocateMessages();
  Fill(holder->request(), 64, 40);
  holder->response()->add_results()->set_valid(true);
  holder->Release();
  EXPECT_EQ(pool.idle(), 1u);

  auto* again = pool.AllocateMessages();
  EXPECT_EQ(again, holder);  // reused, not a new one
  EXPECT_EQ(pool.idle(), 0u);
  EXPECT_EQ(again->request()->items_size(), 0);
  EXPECT_EQ(again->response()->results_size(), 0);
  EXPECT_EQ(again->request()->ByteSizeLong(), 0u);
  // Parsing into the reused request gives exactly what was sent.
  v1::BatchVerifyRequest sent;
  Fill(&sent, 3, 10);
  ASSERT_TRUE(again->request()->ParseFromString(sent.SerializeAsString()));
  EXPECT_EQ(again->request()->SerializeAsString(), sent.SerializeAsString());
  again->Release();
}

TEST(PooledAllocatorTest, LargeRequestsAreFreedNotKept) {
  VerifyPool pool;
  auto* many = pool.AllocateMessages();
  Fill(many->request(), kPoolMaxItems + 1, 10);
  many->Release();
  EXPECT_EQ(pool.idle(), 0u);

  auto* long_field = pool.AllocateMessages();
  Fill(long_field->request(), 1, kPoolMaxField + 1);
  long_field->Release();
  EXPECT_EQ(pool.idle(), 0u);

  auto* at_bounds = pool.AllocateMessages();
  Fill(at_bounds->request(), kPoolMaxItems, 10);
  at_bounds->Release();
  EXPECT_EQ(pool.idle(), 1u);
}

TEST(PooledAllocatorTest, RequestsWithUnknownFieldsAreFreedNotKept) {
  v1::BatchVerifyRequest sent;
  Fill(&sent, 2, 10);
  std::string wire = sent.SerializeAsString();
  wire += std::string("\xb8\x06\x01", 3);  // field 103, varint 1: not in the proto
  VerifyPool pool;
  auto* top = pool.AllocateMessages();
  ASSERT_TRUE(top->request()->ParseFromString(wire));
  ASSERT_TRUE(HasUnknownFields(*top->request()));
  top->Release();
  EXPECT_EQ(pool.idle(), 0u);

  v1::VerifyRequest item;
  item.set_public_key(std::string(32, 'k'));
  std::string item_wire = item.SerializeAsString() + std::string("\xb8\x06\x01", 3);
  std::string batch_wire = "\x0a" + std::string(1, static_cast<char>(item_wire.size())) + item_wire;
  auto* nested = pool.AllocateMessages();
  ASSERT_TRUE(nested->request()->ParseFromString(batch_wire));
  ASSERT_EQ(nested->request()->items_size(), 1);
  ASSERT_TRUE(HasUnknownFields(nested->request()->items(0)));
  nested->Release();
  EXPECT_EQ(pool.idle(), 0u);
}

TEST(PooledAllocatorTest, KeepsAtMostMaxIdle) {
  VerifyPool pool(/*max_idle=*/2);
  std::vector<grpc::MessageHolder<v1::BatchVerifyRequest, v1::BatchVerifyResponse>*> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool.AllocateMessages());
  for (auto* h : held) h->Release();
  EXPECT_EQ(pool.idle(), 2u);
}

TEST(PooledAllocatorTest, WipesSharedKeys) {
  v1::BatchDeriveResponse response;
  response.add_results()->mutable_response()->set_shared_key(std::string(32, '\xAA'));
  response.add_results()->mutable_status()->set_code(5);  // an item without a key
  const std::string* key = &response.results(0).response().shared_key();
  WipeSecrets(&response);
  EXPECT_EQ(*key, std::string(32, '\0'));
}

// Release wipes the shared keys at once; the wiped response stays in the idle holder's arena
// (still alive, so it may be read here) until the holder is handed out again.
TEST(PooledAllocatorTest, ReleaseWipesTheResponsesSharedKeys) {
  DerivePool pool;
  auto* holder = pool.AllocateMessages();
  holder->request()->add_items()->set_key_id("dh");
  for (int i = 0; i < 3; ++i) {
    holder->response()->add_results()->mutable_response()->set_shared_key(std::string(32, '\xAA'));
  }
  std::vector<const std::string*> keys;
  for (const auto& result : holder->response()->results()) {
    keys.push_back(&result.response().shared_key());
  }
  holder->Release();
  ASSERT_EQ(pool.idle(), 1u);
  for (const std::string* key : keys) EXPECT_EQ(*key, std::string(32, '\0'));
  auto* again = pool.AllocateMessages();
  ASSERT_EQ(again, holder);
  EXPECT_EQ(again->response()->results_size(), 0);
  again->Release();
}

TEST(PooledAllocatorTest, ManyThreadsAllocateAndRelease) {
  DerivePool pool(/*max_idle=*/4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        auto* h = pool.AllocateMessages();
        ASSERT_EQ(h->request()->items_size(), 0);
        ASSERT_EQ(h->response()->results_size(), 0);
        v1::DeriveRequest* item = h->request()->add_items();
        item->set_key_id("k" + std::to_string(t));
        item->set_peer_public_key(std::string(32, 'p'));
        h->response()->add_results()->mutable_response()->set_shared_key(std::string(32, 'x'));
        h->Release();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(pool.idle(), 4u);
  EXPECT_GE(pool.idle(), 1u);
}

}  // namespace
}  // namespace offload::rpc
