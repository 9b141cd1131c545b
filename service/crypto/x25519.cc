#include "service/crypto/x25519.h"


#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/proverr.h>
#include <sodium.h>

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/crypto/op_counts.h"
#include "service/common/secret_bytes.h"
#include "service/common/secure_memory.h"
#include "service/common/status_macros.h"
#include "service/crypto/internal/secure_key.h"
#include "service/crypto/internal/size_check.h"
#include "service/crypto/internal/ssl_util.h"
#include "service/crypto/secure_heap.h"

namespace offload::crypto {
namespace {

using internal::CheckSize;
using internal::OpenSslError;
using internal::SslUniquePtr;

absl::Status CheckDeriveArgs(absl::Span<const uint8_t> peer, absl::Span<uint8_t> shared) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("peer_public_key", peer.size(), kX25519KeySize));
  return CheckSize("shared", shared.size(), kX25519KeySize);
}

// The all-zero result of a small-order peer key: an error unless the caller opted in.
absl::Status ZeroResult(bool allow_zero, absl::Span<uint8_t> shared) {
  std::fill(shared.begin(), shared.end(), 0);
  if (allow_zero) return absl::OkStatus();
  return absl::InvalidArgumentError("small-order peer public key");
}

class SodiumX25519PrivateKey final : public X25519PrivateKey {
 public:
  SodiumX25519PrivateKey(KeyBytes secret, const std::array<uint8_t, 32>& public_key)
      : secret_(std::move(secret)), public_key_(public_key) {}

  absl::Status Derive(absl::Span<const uint8_t> peer_public_key, bool allow_zero,
                      absl::Span<uint8_t> shared) const override {
    internal::CountOp(CryptoOp::kX25519);
    OFFLOAD_RETURN_IF_ERROR(CheckDeriveArgs(peer_public_key, shared));
    // crypto_scalarmult masks bit 255 of the u-coordinate and returns -1 for an all-zero result.
    if (crypto_scalarmult(shared.data(), secret_.data(), peer_public_key.data()) != 0) {
      if (sodium_is_zero(shared.data(), shared.size())) return ZeroResult(allow_zero, shared);
      sodium_memzero(shared.data(), shared.size());
      return absl::InternalError("crypto_scalarmult failed");
    }
    return absl::OkStatus();
  }

  const std::array<uint8_t, 32>& public_key() const override { return public_key_; }

 private:
  const KeyBytes secret_;  // locked memory (secure_memory.h)
  const std::array<uint8_t, 32> public_key_;
};

// The EVP_PKEY is built once; each Derive builds the peer key and an EVP_PKEY_CTX.
class OpenSslX25519PrivateKey final : public X25519PrivateKey {
 public:
  OpenSslX25519PrivateKey(SslUniquePtr<EVP_PKEY> key, const std::array<uint8_t, 32>& public_key)
      : key_(std::move(key)), public_key_(public_key) {}

  absl::Status Derive(absl::Span<const uint8_t> peer_public_key, bool allow_zero,
                      absl::Span<uint8_t> shared) const override {
    internal::CountOp(CryptoOp::kX25519);
    OFFLOAD_RETURN_IF_ERROR(CheckDeriveArgs(peer_public_key, shared));
    SslUniquePtr<EVP_PKEY> peer(EVP_PKEY_new_raw_public_key(
        EVP_PKEY_X25519, nullptr, peer_public_key.data(), peer_public_key.size()));
    if (peer == nullptr) return OpenSslError("EVP_PKEY_new_raw_public_key(X25519)");
    SslUniquePtr<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, key_.get(), nullptr));
    if (ctx == nullptr) return OpenSslError("EVP_PKEY_CTX_new_from_pkey");
    if (EVP_PKEY_derive_init(ctx.get()) != 1) return OpenSslError("EVP_PKEY_derive_init");
    // No peer validation: for X25519 it only checks that a public key is present.
    if (EVP_PKEY_derive_set_peer_ex(ctx.get(), peer.get(), /*validate_peer=*/0) != 1) {
      return OpenSslError("EVP_PKEY_derive_set_peer_ex");
    }
    size_t len = shared.size();
    if (EVP_PKEY_derive(ctx.get(), shared.data(), &len) != 1) {
      // OpenSSL computes the result, then refuses an all-zero one with this reason.
      unsigned long err = ERR_peek_last_error();  // NOLINT(runtime/int): OpenSSL's type
      if (ERR_GET_LIB(err) == ERR_LIB_PROV &&
          ERR_GET_REASON(err) == PROV_R_FAILED_DURING_DERIVATION) {
        internal::ClearOpenSslErrors();
        return ZeroResult(allow_zero, shared);
      }
      sodium_memzero(shared.data(), shared.size());
      return OpenSslError("EVP_PKEY_derive(X25519)");
    }
    if (len != kX25519KeySize) {
      sodium_memzero(shared.data(), shared.size());
      return absl::InternalError("EVP_PKEY_derive(X25519) returned a wrong length");
    }
    if (sodium_is_zero(shared.data(), shared.size())) return ZeroResult(allow_zero, shared);
    return absl::OkStatus();
  }

  const std::array<uint8_t, 32>& public_key() const override { return public_key_; }

 private:
  // Owns the secret, in OpenSSL's secure heap once SetUpLockedMemory ran; wiped on free.
  const SslUniquePtr<EVP_PKEY> key_;
  const std::array<uint8_t, 32> public_key_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<X25519PrivateKey>> X25519PrivateKey::FromBytes(
    Backend backend, absl::Span<const uint8_t> secret) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("secret", secret.size(), kX25519KeySize));
  OFFLOAD_ASSIGN_OR_RETURN(auto public_key, X25519PublicKey(secret));
  switch (backend) {
    case Backend::kLibsodium:
      return std::unique_ptr<X25519PrivateKey>(
          new SodiumX25519PrivateKey(KeyBytes(secret.begin(), secret.end()), public_key));
    case Backend::kOpenSsl: {
      SslUniquePtr<EVP_PKEY> key = internal::NewPrivateKey(EVP_PKEY_X25519, secret);
      if (key == nullptr) {
        // OpenSSL's secure heap (secure_heap.h) is full: the same key on libsodium instead.
        if (internal::SecureHeapFallback()) return FromBytes(Backend::kLibsodium, secret);
        return OpenSslError("EVP_PKEY_new_raw_private_key(X25519)");
      }
      return std::unique_ptr<X25519PrivateKey>(
          new OpenSslX25519PrivateKey(std::move(key), public_key));
    }
  }
  return absl::InvalidArgumentError("backend: unknown value");
}

absl::StatusOr<std::array<uint8_t, 32>> X25519PublicKey(absl::Span<const uint8_t> secret) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("secret", secret.size(), kX25519KeySize));
  std::array<uint8_t, 32> public_key;
  if (crypto_scalarmult_base(public_key.data(), secret.data()) != 0) {
    return absl::InternalError("crypto_scalarmult_base failed");
  }
  return public_key;
}

void BoxKeyFromShared(absl::Span<const uint8_t> raw_shared, absl::Span<uint8_t> box_key) {
  assert(raw_shared.size() == kX25519KeySize && box_key.size() == crypto_box_BEFORENMBYTES);
  static const uint8_t kZeroNonce[16] = {0};
  crypto_core_hsalsa20(box_key.data(), kZeroNonce, raw_shared.data(), nullptr);
}

absl::Status BoxSealAfternm(absl::Span<const uint8_t> box_key, absl::Span<const uint8_t> nonce,
                            absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out) {
  internal::CountOp(CryptoOp::kBoxSeal);
  OFFLOAD_RETURN_IF_ERROR(CheckSize("box_key", box_key.size(), crypto_box_BEFORENMBYTES));
  OFFLOAD_RETURN_IF_ERROR(CheckSize("nonce", nonce.size(), kBoxNonceSize));
  OFFLOAD_RETURN_IF_ERROR(CheckSize("out", out.size(), plaintext.size() + kBoxTagSize));
  if (crypto_box_easy_afternm(out.data(), plaintext.data(), plaintext.size(), nonce.data(),
                              box_key.data()) != 0) {
    return absl::InternalError("crypto_box_easy_afternm failed");
  }
  return absl::OkStatus();
}

absl::Status BoxOpenAfternm(absl::Span<const uint8_t> box_key, absl::Span<const uint8_t> nonce,
                            absl::Span<const uint8_t> ciphertext, absl::Span<uint8_t> out) {
  internal::CountOp(CryptoOp::kBoxOpen);
  OFFLOAD_RETURN_IF_ERROR(CheckSize("box_key", box_key.size(), crypto_box_BEFORENMBYTES));
  OFFLOAD_RETURN_IF_ERROR(CheckSize("nonce", nonce.size(), kBoxNonceSize));
  if (ciphertext.size() < kBoxTagSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("ciphertext: expected at least ", kBoxTagSize, " bytes, got ",
                     ciphertext.size()));
  }
  OFFLOAD_RETURN_IF_ERROR(CheckSize("out", out.size(), ciphertext.size() - kBoxTagSize));
  if (crypto_box_open_easy_afternm(out.data(), ciphertext.data(), ciphertext.size(), nonce.data(),
                                   box_key.data()) != 0) {
    sodium_memzero(out.data(), out.size());
    return absl::InvalidArgumentError("authentication failed");
  }
  return absl::OkStatus();
}

}  // namespace offload::crypto
