#include "service/main/server.h"

#include <signal.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"
#include "service/crypto/backend.h"
#include "service/keys/file_key_store.h"
#include "service/keys/kek.h"
#include "service/keys/key_manager.h"
#include "service/memo/memo.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"
#include "service/rpc/services.h"

namespace offload {
namespace {

absl::StatusOr<crypto::BackendChoice> ChooseBackends(const std::string& backend) {
  if (backend == "auto") return crypto::BackendChoice::Measure();
  OFFLOAD_ASSIGN_OR_RETURN(crypto::Backend forced, crypto::ParseBackend(backend));
  return crypto::BackendChoice::All(forced);
}

absl::Status CheckConfig(const ServerConfig& config) {
  if (config.max_batch_items < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_items: expected at least 1, got ", config.max_batch_items));
  }
  for (int64_t bound : {config.memo_verify_bytes, config.memo_derive_bytes,
                        config.memo_open_bytes_per_key, config.memo_open_bytes_total}) {
    if (bound < 0) {
      return absl::InvalidArgumentError(absl::StrCat("memo bounds: expected >= 0, got ", bound));
    }
  }
  if (config.max_message_bytes < 1024 || config.max_message_bytes > (1LL << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected 1024 to 1073741824, got ", config.max_message_bytes));
  }
  return absl::OkStatus();
}

int WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  return signal_number;
}

}  // namespace

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

absl::Status RunServer(const ServerConfig& config) {
  OFFLOAD_RETURN_IF_ERROR(CheckConfig(config));
  OFFLOAD_RETURN_IF_ERROR(crypto::InitCrypto());
  OFFLOAD_ASSIGN_OR_RETURN(crypto::BackendChoice backends, ChooseBackends(config.backend));
  Log(LogLevel::kInfo, "crypto_backends",
      {{"mode", config.backend}, {"choice", backends.ToString()}});

  const absl::Time load_start = absl::Now();
  keys::KekOrigin kek_origin;
  OFFLOAD_ASSIGN_OR_RETURN(
      SecretBytes kek,
      keys::LoadKek({config.kek_file, config.kek_env, config.data_dir}, &kek_origin));
  if (kek_origin.generated) {
    Log(LogLevel::kWarning, "kek_generated",
        {{"source", kek_origin.description},
         {"advice", "supply the key-encryption key by --kek_file or an environment variable in "
                    "production; whoever reads this file can decrypt every key"}});
  }
  OFFLOAD_ASSIGN_OR_RETURN(auto store, keys::FileKeyStore::Open(config.data_dir, std::move(kek)));
  const std::string store_description = store->Describe();
  OFFLOAD_ASSIGN_OR_RETURN(auto key_manager,
                           keys::KeyManager::Create(std::move(store), backends));
  Log(LogLevel::kInfo, "keys_loaded",
      {{"store", store_description},
       {"kek", kek_origin.description},
       {"keys", key_manager->size()},
       {"seconds", absl::ToDoubleSeconds(absl::Now() - load_start)}});

  memo::MemoOptions memo_options;
  memo_options.enabled = config.memo_enabled;
  memo_options.verify_bytes = static_cast<size_t>(config.memo_verify_bytes);
  memo_options.derive_bytes = static_cast<size_t>(config.memo_derive_bytes);
  memo_options.open_bytes_per_key = static_cast<size_t>(config.memo_open_bytes_per_key);
  memo_options.open_bytes_total = static_cast<size_t>(config.memo_open_bytes_total);
  memo::Memo memo(memo_options);
  // A rotated or deleted key's entries go at once (they could never be served again anyway:
  // entries are named by key version instances that are never reused).
  key_manager->AddChangeListener([&memo](absl::string_view key_id) { memo.DropKey(key_id); });

  // Declared before the server so that it outlives it: the server's calls finish on the pool.
  ops::WorkerPool pool(config.workers);
  ops::Operations operations(key_manager.get(), &memo, &pool, backends,
                             ops::Operations::Options{config.max_batch_items});
  rpc::Services services(&operations, key_manager.get(), &pool);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.grpc_address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  services.RegisterAll(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("grpc_address: cannot listen on ", config.grpc_address));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  Log(LogLevel::kInfo, "server_started",
      {{"grpc_address", config.grpc_address},
       {"grpc_port", port},
       {"workers", pool.size()},
       {"max_batch_items", config.max_batch_items},
       {"max_message_bytes", config.max_message_bytes},
       {"memo", {{"enabled", config.memo_enabled},
                 {"verify_bytes", config.memo_verify_bytes},
                 {"derive_bytes", config.memo_derive_bytes},
                 {"open_bytes_per_key", config.memo_open_bytes_per_key},
                 {"open_bytes_total", config.memo_open_bytes_total}}}});

  const int signal_number = WaitForStopSignal();
  Log(LogLevel::kInfo, "server_draining",
      {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"},
       {"drain_timeout_seconds", absl::ToDoubleSeconds(config.drain_timeout)}});
  server->GetHealthCheckService()->SetServingStatus(false);
  // Refuses new calls at once; waits for in-flight calls until the deadline, then cancels them.
  server->Shutdown(absl::ToChronoTime(absl::Now() + config.drain_timeout));
  server->Wait();
  Log(LogLevel::kInfo, "server_stopped");
  return absl::OkStatus();
}

}  // namespace offload
