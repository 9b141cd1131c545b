#include "service/crypto/backend.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/common/secret_bytes.h"
#include "service/crypto/aead.h"
#include "service/crypto/ed25519.h"
#include "service/crypto/x25519.h"

namespace offload::crypto {
namespace {

// Measure(): iterations per timed batch and batches per backend. Batches of the two backends
// alternate and the fastest batch counts, which damps noise from other processes.
constexpr int kBatches = 8;
constexpr int kCurveIterations = 24;   // x 8 batches x 2 backends x 3 curve ops
constexpr int kAeadIterations = 4;     // x 8 batches x 2 backends x 3 ciphers, 16 KB each
constexpr size_t kAeadMessageSize = 16 * 1024;

using Clock = std::chrono::steady_clock;

// Seconds per call of the fastest batch of `iterations` calls.
double FastestBatch(const std::function<void()>& op, int iterations, double best) {
  auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) op();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  return std::min(best, seconds);
}

// Runs `make_op(backend)` on both backends and returns the faster. A backend whose op cannot be
// built (nullptr) loses; if neither can, `fallback` stays.
Backend Faster(const std::function<std::function<void()>(Backend)>& make_op, int iterations,
               Backend fallback) {
  std::function<void()> sodium_op = make_op(Backend::kLibsodium);
  std::function<void()> openssl_op = make_op(Backend::kOpenSsl);
  if (!sodium_op && !openssl_op) return fallback;
  if (!sodium_op) return Backend::kOpenSsl;
  if (!openssl_op) return Backend::kLibsodium;
  sodium_op();  // warm up caches and lazy initialisation
  openssl_op();
  double sodium = 1e9;
  double openssl = 1e9;
  for (int b = 0; b < kBatches; ++b) {
    sodium = FastestBatch(sodium_op, iterations, sodium);
    openssl = FastestBatch(openssl_op, iterations, openssl);
  }
  return openssl < sodium ? Backend::kOpenSsl : Backend::kLibsodium;
}

}  // namespace

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kLibsodium:
      return "libsodium";
    case Backend::kOpenSsl:
      return "openssl";
  }
  return "unknown";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "libsodium") return Backend::kLibsodium;
  if (name == "openssl") return Backend::kOpenSsl;
  return absl::InvalidArgumentError(
      absl::StrCat("backend: expected \"libsodium\" or \"openssl\", got \"", name, "\""));
}

absl::Status InitCrypto() {
  if (sodium_init() < 0) return absl::InternalError("sodium_init failed");
  return absl::OkStatus();
}

BackendChoice BackendChoice::All(Backend backend) {
  BackendChoice c;
  c.ed25519_sign = c.ed25519_verify = c.x25519 = backend;
  c.chacha20_poly1305 = c.xchacha20_poly1305 = c.aes256_gcm = backend;
  return c;
}

std::string BackendChoice::ToString() const {
  return absl::StrCat("ed25519_sign=", BackendName(ed25519_sign),
                      " ed25519_verify=", BackendName(ed25519_verify),
                      " x25519=", BackendName(x25519),
                      " chacha20_poly1305=", BackendName(chacha20_poly1305),
                      " xchacha20_poly1305=", BackendName(xchacha20_poly1305),
                      " aes256_gcm=", BackendName(aes256_gcm));
}

BackendChoice BackendChoice::Measure() {
  BackendChoice choice;  // the defaults stand if something cannot be measured
  if (!InitCrypto().ok()) return choice;

  // Fixed random keys and inputs, made fresh for this run.
  SecretBytes seed(32);
  SecretBytes x_secret(32);
  SecretBytes aead_key(kAeadKeySize);
  randombytes_buf(seed.data(), seed.size());
  randombytes_buf(x_secret.data(), x_secret.size());
  randombytes_buf(aead_key.data(), aead_key.size());
  std::array<uint8_t, 64> message;
  std::array<uint8_t, 32> peer_secret;
  randombytes_buf(message.data(), message.size());
  randombytes_buf(peer_secret.data(), peer_secret.size());
  absl::StatusOr<std::array<uint8_t, 32>> peer = X25519PublicKey(peer_secret);
  absl::StatusOr<std::unique_ptr<Ed25519Signer>> reference =
      Ed25519Signer::FromSeed(Backend::kLibsodium, seed);
  if (!peer.ok() || !reference.ok()) return choice;
  std::array<uint8_t, 64> signature;
  if (!(*reference)->Sign(message, absl::MakeSpan(signature)).ok()) return choice;
  const std::array<uint8_t, 32> public_key = (*reference)->public_key();

  choice.ed25519_sign = Faster(
      [&](Backend b) -> std::function<void()> {
        auto signer = Ed25519Signer::FromSeed(b, seed);
        if (!signer.ok()) return nullptr;
        std::shared_ptr<Ed25519Signer> s(std::move(*signer));
        return [s, &message] {
          std::array<uint8_t, 64> sig;
          s->Sign(message, absl::MakeSpan(sig)).IgnoreError();
        };
      },
      kCurveIterations, choice.ed25519_sign);

  choice.ed25519_verify = Faster(
      [&](Backend b) -> std::function<void()> {
        return [b, &public_key, &message, &signature] {
          Ed25519Verify(b, public_key, message, signature);
        };
      },
      kCurveIterations, choice.ed25519_verify);

  choice.x25519 = Faster(
      [&](Backend b) -> std::function<void()> {
        auto key = X25519PrivateKey::FromBytes(b, x_secret);
        if (!key.ok()) return nullptr;
        std::shared_ptr<X25519PrivateKey> k(std::move(*key));
        return [k, &peer] {
          SecretBytes shared(32);
          k->Derive(*peer, /*allow_zero=*/false, absl::MakeSpan(shared)).IgnoreError();
        };
      },
      kCurveIterations, choice.x25519);

  // AEAD: seal a 16 KB buffer (open costs the same work plus a comparison).
  std::vector<uint8_t> plaintext(kAeadMessageSize, 0x5a);
  auto aead_op = [&](AeadAlgorithm algorithm) {
    return [&, algorithm](Backend b) -> std::function<void()> {
      auto aead = Aead::Create(b, algorithm, aead_key);
      if (!aead.ok()) return nullptr;
      std::shared_ptr<Aead> a(std::move(*aead));
      auto out = std::make_shared<std::vector<uint8_t>>(plaintext.size() + kAeadTagSize);
      auto nonce = std::make_shared<std::vector<uint8_t>>(AeadNonceSize(algorithm), 0x01);
      return [a, out, nonce, &plaintext] {
        a->Seal(*nonce, {}, plaintext, absl::MakeSpan(*out)).IgnoreError();
      };
    };
  };
  choice.chacha20_poly1305 = Faster(aead_op(AeadAlgorithm::kChaCha20Poly1305), kAeadIterations,
                                    choice.chacha20_poly1305);
  choice.xchacha20_poly1305 = Faster(aead_op(AeadAlgorithm::kXChaCha20Poly1305), kAeadIterations,
                                     choice.xchacha20_poly1305);
  choice.aes256_gcm =
      Faster(aead_op(AeadAlgorithm::kAes256Gcm), kAeadIterations, choice.aes256_gcm);
  return choice;
}

}  // namespace offload::crypto
