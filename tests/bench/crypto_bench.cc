// Per-operation cost of every crypto primitive on each backend (libsodium, OpenSSL 3).
//
//   build-crypto/tests/bench/crypto_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
//
// The first argument of each benchmark is the backend (0 = libsodium, 1 = OpenSSL); AEAD
// benchmarks take the message size in bytes as the second. Keys are built once, outside the
// timed loop, as the service does.
#include <benchmark/benchmark.h>
#include <sodium.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "service/common/secret_bytes.h"
#include "service/crypto/aead.h"
#include "service/crypto/backend.h"
#include "service/crypto/ed25519.h"
#include "service/crypto/x25519.h"

namespace offload::crypto {
namespace {

Backend BackendArg(const benchmark::State& state) {
  return state.range(0) == 0 ? Backend::kLibsodium : Backend::kOpenSsl;
}

std::vector<uint8_t> RandomBytes(size_t n) {
  std::vector<uint8_t> v(n);
  randombytes_buf(v.data(), v.size());
  return v;
}

void SetLabel(benchmark::State& state) { state.SetLabel(std::string(BackendName(BackendArg(state)))); }

void BM_Ed25519Sign(benchmark::State& state) {
  auto signer = Ed25519Signer::FromSeed(BackendArg(state), RandomBytes(32));
  if (!signer.ok()) return state.SkipWithError("FromSeed failed");
  const std::vector<uint8_t> msg = RandomBytes(64);
  std::array<uint8_t, 64> sig;
  for (auto _ : state) {
    if (!(*signer)->Sign(msg, absl::MakeSpan(sig)).ok()) return state.SkipWithError("Sign failed");
    benchmark::DoNotOptimize(sig);
  }
  SetLabel(state);
}

void BM_Ed25519Verify(benchmark::State& state) {
  auto signer = Ed25519Signer::FromSeed(Backend::kLibsodium, RandomBytes(32));
  if (!signer.ok()) return state.SkipWithError("FromSeed failed");
  const std::vector<uint8_t> msg = RandomBytes(64);
  std::array<uint8_t, 64> sig;
  if (!(*signer)->Sign(msg, absl::MakeSpan(sig)).ok()) return state.SkipWithError("Sign failed");
  const Backend backend = BackendArg(state);
  for (auto _ : state) {
    bool ok = Ed25519Verify(backend, (*signer)->public_key(), msg, sig);
    if (!ok) return state.SkipWithError("verify rejected a valid signature");
    benchmark::DoNotOptimize(ok);
  }
  SetLabel(state);
}

void BM_X25519Derive(benchmark::State& state) {
  auto key = X25519PrivateKey::FromBytes(BackendArg(state), RandomBytes(32));
  auto peer = X25519PublicKey(RandomBytes(32));
  if (!key.ok() || !peer.ok()) return state.SkipWithError("key setup failed");
  SecretBytes shared(32);
  for (auto _ : state) {
    if (!(*key)->Derive(*peer, false, absl::MakeSpan(shared)).ok()) {
      return state.SkipWithError("Derive failed");
    }
    benchmark::DoNotOptimize(shared.data());
  }
  SetLabel(state);
}

// crypto_box_beforenm: X25519 on the backend, then HSalsa20.
void BM_BoxBeforenm(benchmark::State& state) {
  auto key = X25519PrivateKey::FromBytes(BackendArg(state), RandomBytes(32));
  auto peer = X25519PublicKey(RandomBytes(32));
  if (!key.ok() || !peer.ok()) return state.SkipWithError("key setup failed");
  SecretBytes shared(32), box_key(32);
  for (auto _ : state) {
    if (!(*key)->Derive(*peer, false, absl::MakeSpan(shared)).ok()) {
      return state.SkipWithError("Derive failed");
    }
    BoxKeyFromShared(shared, absl::MakeSpan(box_key));
    benchmark::DoNotOptimize(box_key.data());
  }
  SetLabel(state);
}

template <AeadAlgorithm kAlgorithm>
void BM_AeadSeal(benchmark::State& state) {
  auto aead = Aead::Create(BackendArg(state), kAlgorithm, RandomBytes(32));
  if (!aead.ok()) return state.SkipWithError(aead.status().ToString().c_str());
  const size_t size = static_cast<size_t>(state.range(1));
  const std::vector<uint8_t> nonce = RandomBytes(AeadNonceSize(kAlgorithm));
  const std::vector<uint8_t> aad = RandomBytes(16);
  const std::vector<uint8_t> msg = RandomBytes(size);
  std::vector<uint8_t> out(size + kAeadTagSize);
  for (auto _ : state) {
    if (!(*aead)->Seal(nonce, aad, msg, absl::MakeSpan(out)).ok()) {
      return state.SkipWithError("Seal failed");
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
  SetLabel(state);
}

template <AeadAlgorithm kAlgorithm>
void BM_AeadOpen(benchmark::State& state) {
  auto aead = Aead::Create(BackendArg(state), kAlgorithm, RandomBytes(32));
  if (!aead.ok()) return state.SkipWithError(aead.status().ToString().c_str());
  const size_t size = static_cast<size_t>(state.range(1));
  const std::vector<uint8_t> nonce = RandomBytes(AeadNonceSize(kAlgorithm));
  const std::vector<uint8_t> aad = RandomBytes(16);
  const std::vector<uint8_t> msg = RandomBytes(size);
  std::vector<uint8_t> sealed(size + kAeadTagSize), out(size);
  if (!(*aead)->Seal(nonce, aad, msg, absl::MakeSpan(sealed)).ok()) {
    return state.SkipWithError("Seal failed");
  }
  for (auto _ : state) {
    if (!(*aead)->Open(nonce, aad, sealed, absl::MakeSpan(out)).ok()) {
      return state.SkipWithError("Open failed");
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
  SetLabel(state);
}

void CurveArgs(benchmark::internal::Benchmark* b) {
  b->ArgName("backend")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
}

void AeadArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"backend", "bytes"})->Unit(benchmark::kMicrosecond);
  for (int64_t size : {int64_t{1024}, int64_t{55 * 1024}}) {
    b->Args({0, size})->Args({1, size});
  }
}

BENCHMARK(BM_Ed25519Sign)->Apply(CurveArgs);
BENCHMARK(BM_Ed25519Verify)->Apply(CurveArgs);
BENCHMARK(BM_X25519Derive)->Apply(CurveArgs);
BENCHMARK(BM_BoxBeforenm)->Apply(CurveArgs);
BENCHMARK(BM_AeadSeal<AeadAlgorithm::kChaCha20Poly1305>)->Name("BM_ChaCha20Poly1305Seal")->Apply(AeadArgs);
BENCHMARK(BM_AeadOpen<AeadAlgorithm::kChaCha20Poly1305>)->Name("BM_ChaCha20Poly1305Open")->Apply(AeadArgs);
BENCHMARK(BM_AeadSeal<AeadAlgorithm::kXChaCha20Poly1305>)->Name("BM_XChaCha20Poly1305Seal")->Apply(AeadArgs);
BENCHMARK(BM_AeadOpen<AeadAlgorithm::kXChaCha20Poly1305>)->Name("BM_XChaCha20Poly1305Open")->Apply(AeadArgs);
BENCHMARK(BM_AeadSeal<AeadAlgorithm::kAes256Gcm>)->Name("BM_Aes256GcmSeal")->Apply(AeadArgs);
BENCHMARK(BM_AeadOpen<AeadAlgorithm::kAes256Gcm>)->Name("BM_Aes256GcmOpen")->Apply(AeadArgs);

}  // namespace
}  // namespace offload::crypto

int main(int argc, char** argv) {
  if (!offload::crypto::InitCrypto().ok()) {
    std::fprintf(stderr, "InitCrypto failed\n");
    return 1;
  }
  benchmark::AddCustomContext("offload_build_type", OFFLOAD_BUILD_TYPE);
  benchmark::AddCustomContext("offload_cxx_flags", OFFLOAD_CXX_FLAGS);
  benchmark::AddCustomContext("libsodium", sodium_version_string());
  benchmark::AddCustomContext("backend_choice", offload::crypto::BackendChoice::Measure().ToString());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
