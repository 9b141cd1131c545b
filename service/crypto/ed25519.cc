#include "service/crypto/ed25519.h"


#include <openssl/evp.h>
#include <sodium.h>

#include <utility>

#include "service/crypto/op_counts.h"
#include "service/common/secret_bytes.h"
#include "service/common/secure_memory.h"
#include "service/common/status_macros.h"
#include "service/crypto/internal/ed25519_policy.h"
#include "service/crypto/internal/ed25519_raw.h"
#include "service/crypto/secure_heap.h"
#include "service/crypto/internal/secure_key.h"
#include "service/crypto/internal/size_check.h"
#include "service/crypto/internal/ssl_util.h"

namespace offload::crypto {
namespace {

using internal::CheckSize;
using internal::OpenSslError;
using internal::SslUniquePtr;

// libsodium: keeps the 64-byte secret key (seed || public key) that crypto_sign_detached takes.
class SodiumEd25519Signer final : public Ed25519Signer {
 public:
  SodiumEd25519Signer(KeyBytes secret_key, const std::array<uint8_t, 32>& public_key)
      : secret_key_(std::move(secret_key)), public_key_(public_key) {}

  absl::Status Sign(absl::Span<const uint8_t> message, absl::Span<uint8_t> signature) const override {
    internal::CountOp(CryptoOp::kEd25519Sign);
    OFFLOAD_RETURN_IF_ERROR(CheckSize("signature", signature.size(), kEd25519SignatureSize));
    if (crypto_sign_detached(signature.data(), nullptr, message.data(), message.size(),
                             secret_key_.data()) != 0) {
      return absl::InternalError("crypto_sign_detached failed");
    }
    return absl::OkStatus();
  }

  const std::array<uint8_t, 32>& public_key() const override { return public_key_; }

 private:
  const KeyBytes secret_key_;  // 64 bytes, locked memory (secure_memory.h)
  const std::array<uint8_t, 32> public_key_;
};

// OpenSSL: the EVP_PKEY is built once from the seed; each Sign uses a fresh EVP_MD_CTX.
class OpenSslEd25519Signer final : public Ed25519Signer {
 public:
  OpenSslEd25519Signer(SslUniquePtr<EVP_PKEY> key, const std::array<uint8_t, 32>& public_key)
      : key_(std::move(key)), public_key_(public_key) {}

  absl::Status Sign(absl::Span<const uint8_t> message, absl::Span<uint8_t> signature) const override {
    internal::CountOp(CryptoOp::kEd25519Sign);
    OFFLOAD_RETURN_IF_ERROR(CheckSize("signature", signature.size(), kEd25519SignatureSize));
    SslUniquePtr<EVP_MD_CTX> ctx(EVP_MD_CTX_new());
    if (ctx == nullptr) return OpenSslError("EVP_MD_CTX_new");
    if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_.get()) != 1) {
      return OpenSslError("EVP_DigestSignInit");
    }
    size_t sig_len = signature.size();
    if (EVP_DigestSign(ctx.get(), signature.data(), &sig_len, internal::NonNull(message),
                       message.size()) != 1 ||
        sig_len != kEd25519SignatureSize) {
      return OpenSslError("EVP_DigestSign");
    }
    return absl::OkStatus();
  }

  const std::array<uint8_t, 32>& public_key() const override { return public_key_; }

 private:
  // Owns the private key, in OpenSSL's secure heap once SetUpLockedMemory ran; wiped on free.
  const SslUniquePtr<EVP_PKEY> key_;
  const std::array<uint8_t, 32> public_key_;
};

}  // namespace

namespace internal {

bool OpenSslEd25519VerifyRaw(absl::Span<const uint8_t> public_key,
                             absl::Span<const uint8_t> message,
                             absl::Span<const uint8_t> signature) {
  if (public_key.size() != kEd25519PublicKeySize || signature.size() != kEd25519SignatureSize) {
    return false;
  }
  SslUniquePtr<EVP_PKEY> key(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, public_key.data(), public_key.size()));
  SslUniquePtr<EVP_MD_CTX> ctx(EVP_MD_CTX_new());
  bool ok = key != nullptr && ctx != nullptr &&
            EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
            EVP_DigestVerify(ctx.get(), signature.data(), signature.size(), NonNull(message),
                             message.size()) == 1;
  if (!ok) ClearOpenSslErrors();
  return ok;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Ed25519Signer>> Ed25519Signer::FromSeed(
    Backend backend, absl::Span<const uint8_t> seed) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("seed", seed.size(), kEd25519SeedSize));
  switch (backend) {
    case Backend::kLibsodium: {
      KeyBytes secret_key(crypto_sign_SECRETKEYBYTES);
      std::array<uint8_t, 32> public_key;
      if (crypto_sign_seed_keypair(public_key.data(), secret_key.data(), seed.data()) != 0) {
        return absl::InternalError("crypto_sign_seed_keypair failed");
      }
      return std::unique_ptr<Ed25519Signer>(
          new SodiumEd25519Signer(std::move(secret_key), public_key));
    }
    case Backend::kOpenSsl: {
      SslUniquePtr<EVP_PKEY> key = internal::NewPrivateKey(EVP_PKEY_ED25519, seed);
      if (key == nullptr) {
        // OpenSSL's secure heap (secure_heap.h) is full: the same key on libsodium instead.
        if (internal::SecureHeapFallback()) return FromSeed(Backend::kLibsodium, seed);
        return OpenSslError("EVP_PKEY_new_raw_private_key(ED25519)");
      }
      std::array<uint8_t, 32> public_key;
      size_t len = public_key.size();
      if (EVP_PKEY_get_raw_public_key(key.get(), public_key.data(), &len) != 1 ||
          len != public_key.size()) {
        return OpenSslError("EVP_PKEY_get_raw_public_key(ED25519)");
      }
      return std::unique_ptr<Ed25519Signer>(new OpenSslEd25519Signer(std::move(key), public_key));
    }
  }
  return absl::InvalidArgumentError("backend: unknown value");
}

absl::StatusOr<std::array<uint8_t, 32>> Ed25519PublicKeyFromSeed(absl::Span<const uint8_t> seed) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("seed", seed.size(), kEd25519SeedSize));
  SecretBytes secret_key(crypto_sign_SECRETKEYBYTES);
  std::array<uint8_t, 32> public_key;
  if (crypto_sign_seed_keypair(public_key.data(), secret_key.data(), seed.data()) != 0) {
    return absl::InternalError("crypto_sign_seed_keypair failed");
  }
  return public_key;
}

bool Ed25519Verify(Backend backend, absl::Span<const uint8_t> public_key,
                   absl::Span<const uint8_t> message, absl::Span<const uint8_t> signature) {
  if (public_key.size() != kEd25519PublicKeySize || signature.size() != kEd25519SignatureSize) {
    return false;
  }
  internal::CountOp(CryptoOp::kEd25519Verify);
  switch (backend) {
    case Backend::kLibsodium:
      return crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                         public_key.data()) == 0;
    case Backend::kOpenSsl:
      // OpenSSL checks S < L and the cofactorless equation but accepts small-order A and R and
      // some non-canonical A: apply libsodium's encoding checks first.
      return internal::PassesEd25519EncodingPolicy(public_key, signature) &&
             internal::OpenSslEd25519VerifyRaw(public_key, message, signature);
  }
  return false;
}

}  // namespace offload::crypto
