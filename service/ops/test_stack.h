// For tests: the operations as the server builds them - a file key store in a temporary folder
// (random KEK), the key manager, the memo (dropping a key's entries when the key changes), a
// worker pool of two threads - torn down in order, the folder removed.
//
//   auto stack = ops::TestStack::Create();
//   ASSERT_TRUE(stack.ok()) << stack.status();
//   (*stack)->ops->Sign(request, &response);
#ifndef SERVICE_OPS_TEST_STACK_H_
#define SERVICE_OPS_TEST_STACK_H_

#include <sodium.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "service/crypto/backend.h"
#include "service/keys/file_key_store.h"
#include "service/keys/key_manager.h"
#include "service/memo/memo.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"

namespace offload::ops {

struct TestStack {
  static absl::StatusOr<std::unique_ptr<TestStack>> Create(memo::MemoOptions memo_options = {}) {
    if (absl::Status s = crypto::InitCrypto(); !s.ok()) return s;
    char tmpl[] = "/tmp/offload-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
    auto stack = std::make_unique<TestStack>();
    stack->dir = tmpl;
    SecretBytes kek(32);
    randombytes_buf(kek.data(), kek.size());
    auto store = keys::FileKeyStore::Open(stack->dir, std::move(kek));
    if (!store.ok()) return store.status();
    // DeleteKey destroys at once here; service/keys/key_lifecycle_test.cc covers the wait.
    keys::KeyManager::Options key_options;
    key_options.deletion_wait = absl::ZeroDuration();
    auto manager =
        keys::KeyManager::Create(*std::move(store), crypto::BackendChoice{}, key_options);
    if (!manager.ok()) return manager.status();
    stack->keys = *std::move(manager);
    stack->memo = std::make_unique<memo::Memo>(memo_options);
    memo::Memo* memo = stack->memo.get();
    stack->keys->AddChangeListener([memo](absl::string_view id) { memo->DropKey(id); });
    stack->pool = std::make_unique<WorkerPool>(2);
    stack->ops = std::make_unique<Operations>(stack->keys.get(), stack->memo.get(),
                                              stack->pool.get(), crypto::BackendChoice{},
                                              Operations::Options{});
    return stack;
  }

  ~TestStack() {
    ops.reset();
    pool.reset();
    keys.reset();
    memo.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  std::string dir;
  std::unique_ptr<keys::KeyManager> keys;
  std::unique_ptr<memo::Memo> memo;
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<Operations> ops;
};

}  // namespace offload::ops

#endif  // SERVICE_OPS_TEST_STACK_H_
