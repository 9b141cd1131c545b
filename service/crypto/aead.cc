#include "service/crypto/aead.h"


#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/crypto/op_counts.h"
#include "service/common/secret_bytes.h"
#include "service/common/secure_memory.h"
#include "service/common/status_macros.h"
#include "service/crypto/internal/size_check.h"
#include "service/crypto/internal/ssl_util.h"

namespace offload::crypto {
namespace {

using internal::CheckSize;
using internal::FitsInt;
using internal::OpenSslError;
using internal::SslUniquePtr;

constexpr size_t kXChaChaNonceSize = 24;
constexpr size_t kIetfNonceSize = 12;

absl::Status CheckSealArgs(AeadAlgorithm algorithm, absl::Span<const uint8_t> nonce,
                           absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("nonce", nonce.size(), AeadNonceSize(algorithm)));
  return CheckSize("out", out.size(), plaintext.size() + kAeadTagSize);
}

absl::Status CheckOpenArgs(AeadAlgorithm algorithm, absl::Span<const uint8_t> nonce,
                           absl::Span<const uint8_t> ciphertext_and_tag, absl::Span<uint8_t> out) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("nonce", nonce.size(), AeadNonceSize(algorithm)));
  if (ciphertext_and_tag.size() < kAeadTagSize) {
    return absl::InvalidArgumentError(absl::StrCat("ciphertext_and_tag: expected at least ",
                                                   kAeadTagSize, " bytes, got ",
                                                   ciphertext_and_tag.size()));
  }
  return CheckSize("out", out.size(), ciphertext_and_tag.size() - kAeadTagSize);
}

absl::Status AuthenticationFailed(absl::Span<uint8_t> out) {
  if (!out.empty()) sodium_memzero(out.data(), out.size());
  return absl::InvalidArgumentError("authentication failed");
}

// ---------------------------------------------------------------------------------------------
// libsodium

// ChaCha20-Poly1305 IETF and XChaCha20-Poly1305 IETF (combined mode: ciphertext || tag).
class SodiumChaChaAead final : public Aead {
 public:
  SodiumChaChaAead(AeadAlgorithm algorithm, KeyBytes key)
      : algorithm_(algorithm), key_(std::move(key)) {}

  absl::Status Seal(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out) const override {
    internal::CountOp(CryptoOp::kAeadSeal);
    OFFLOAD_RETURN_IF_ERROR(CheckSealArgs(algorithm_, nonce, plaintext, out));
    unsigned long long out_len = 0;  // NOLINT(runtime/int): libsodium's type
    int rc = algorithm_ == AeadAlgorithm::kChaCha20Poly1305
                 ? crypto_aead_chacha20poly1305_ietf_encrypt(
                       out.data(), &out_len, plaintext.data(), plaintext.size(), aad.data(),
                       aad.size(), nullptr, nonce.data(), key_.data())
                 : crypto_aead_xchacha20poly1305_ietf_encrypt(
                       out.data(), &out_len, plaintext.data(), plaintext.size(), aad.data(),
                       aad.size(), nullptr, nonce.data(), key_.data());
    if (rc != 0 || out_len != out.size()) {
      return absl::InternalError(absl::StrCat("libsodium ", AeadName(algorithm_), " encrypt failed"));
    }
    return absl::OkStatus();
  }

  absl::Status Open(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> ciphertext_and_tag,
                    absl::Span<uint8_t> out) const override {
    internal::CountOp(CryptoOp::kAeadOpen);
    OFFLOAD_RETURN_IF_ERROR(CheckOpenArgs(algorithm_, nonce, ciphertext_and_tag, out));
    unsigned long long out_len = 0;  // NOLINT(runtime/int): libsodium's type
    int rc = algorithm_ == AeadAlgorithm::kChaCha20Poly1305
                 ? crypto_aead_chacha20poly1305_ietf_decrypt(
                       out.data(), &out_len, nullptr, ciphertext_and_tag.data(),
                       ciphertext_and_tag.size(), aad.data(), aad.size(), nonce.data(), key_.data())
                 : crypto_aead_xchacha20poly1305_ietf_decrypt(
                       out.data(), &out_len, nullptr, ciphertext_and_tag.data(),
                       ciphertext_and_tag.size(), aad.data(), aad.size(), nonce.data(), key_.data());
    if (rc != 0 || out_len != out.size()) return AuthenticationFailed(out);
    return absl::OkStatus();
  }

  AeadAlgorithm algorithm() const override { return algorithm_; }

 private:
  const AeadAlgorithm algorithm_;
  const KeyBytes key_;  // locked memory (secure_memory.h)
};

// AES-256-GCM with the key schedule expanded once (crypto_aead_aes256gcm_beforenm).
class SodiumAesGcmAead final : public Aead {
 public:
  // The expanded key schedule lives in locked memory (secure_memory.h), wiped on free.
  struct StateDeleter {
    void operator()(crypto_aead_aes256gcm_state* state) const {
      secure::Free(secure::Region::kLocked, state, sizeof(*state));
    }
  };
  using StatePtr = std::unique_ptr<crypto_aead_aes256gcm_state, StateDeleter>;
  static StatePtr NewState() {
    static_assert(alignof(crypto_aead_aes256gcm_state) <= 16, "arena slots are 16-byte aligned");
    return StatePtr(new (secure::Allocate(secure::Region::kLocked,
                                          sizeof(crypto_aead_aes256gcm_state)))
                        crypto_aead_aes256gcm_state);
  }

  explicit SodiumAesGcmAead(StatePtr state) : state_(std::move(state)) {}

  absl::Status Seal(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out) const override {
    internal::CountOp(CryptoOp::kAeadSeal);
    OFFLOAD_RETURN_IF_ERROR(CheckSealArgs(AeadAlgorithm::kAes256Gcm, nonce, plaintext, out));
    unsigned long long out_len = 0;  // NOLINT(runtime/int): libsodium's type
    if (crypto_aead_aes256gcm_encrypt_afternm(out.data(), &out_len, plaintext.data(),
                                              plaintext.size(), aad.data(), aad.size(), nullptr,
                                              nonce.data(), state_.get()) != 0 ||
        out_len != out.size()) {
      return absl::InternalError("libsodium AES-256-GCM encrypt failed");
    }
    return absl::OkStatus();
  }

  absl::Status Open(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> ciphertext_and_tag,
                    absl::Span<uint8_t> out) const override {
    internal::CountOp(CryptoOp::kAeadOpen);
    OFFLOAD_RETURN_IF_ERROR(CheckOpenArgs(AeadAlgorithm::kAes256Gcm, nonce, ciphertext_and_tag, out));
    unsigned long long out_len = 0;  // NOLINT(runtime/int): libsodium's type
    if (crypto_aead_aes256gcm_decrypt_afternm(out.data(), &out_len, nullptr,
                                              ciphertext_and_tag.data(), ciphertext_and_tag.size(),
                                              aad.data(), aad.size(), nonce.data(),
                                              state_.get()) != 0 ||
        out_len != out.size()) {
      return AuthenticationFailed(out);
    }
    return absl::OkStatus();
  }

  AeadAlgorithm algorithm() const override { return AeadAlgorithm::kAes256Gcm; }

 private:
  const StatePtr state_;  // 16-byte aligned (the type is CRYPTO_ALIGN(16)), locked memory
};

// ---------------------------------------------------------------------------------------------
// OpenSSL

// Fetched once per process and never freed (the provider outlives every Aead object).
const EVP_CIPHER* FetchedCipher(AeadAlgorithm algorithm) {
  static const EVP_CIPHER* const kChaCha = EVP_CIPHER_fetch(nullptr, "ChaCha20-Poly1305", nullptr);
  static const EVP_CIPHER* const kAesGcm = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return algorithm == AeadAlgorithm::kAes256Gcm ? kAesGcm : kChaCha;
}

// One AEAD seal with a fresh EVP_CIPHER_CTX: writes ciphertext || tag to `out`.
// REQUIRES: `key` 32 bytes, `iv` 12 bytes, `out.size() == plaintext.size() + 16`.
absl::Status EvpSeal(const EVP_CIPHER* cipher, const uint8_t* key, const uint8_t* iv,
                     absl::Span<const uint8_t> aad, absl::Span<const uint8_t> plaintext,
                     absl::Span<uint8_t> out) {
  if (!FitsInt(aad.size()) || !FitsInt(plaintext.size())) {
    return absl::InvalidArgumentError("plaintext or aad: larger than 2^31 - 1 bytes");
  }
  SslUniquePtr<EVP_CIPHER_CTX> ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr) return OpenSslError("EVP_CIPHER_CTX_new");
  if (EVP_EncryptInit_ex2(ctx.get(), cipher, key, iv, nullptr) != 1) {
    return OpenSslError("EVP_EncryptInit_ex2");
  }
  int len = 0;
  if (!aad.empty() &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) != 1) {
    return OpenSslError("EVP_EncryptUpdate(aad)");
  }
  size_t written = 0;
  if (!plaintext.empty()) {
    if (EVP_EncryptUpdate(ctx.get(), out.data(), &len, plaintext.data(),
                          static_cast<int>(plaintext.size())) != 1) {
      return OpenSslError("EVP_EncryptUpdate");
    }
    written = static_cast<size_t>(len);
  }
  uint8_t* tag = out.data() + plaintext.size();
  if (EVP_EncryptFinal_ex(ctx.get(), out.data() + written, &len) != 1) {
    return OpenSslError("EVP_EncryptFinal_ex");
  }
  written += static_cast<size_t>(len);
  if (written != plaintext.size()) return absl::InternalError("EVP_Encrypt: short output");
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kAeadTagSize), tag) != 1) {
    return OpenSslError("EVP_CTRL_AEAD_GET_TAG");
  }
  return absl::OkStatus();
}

// One AEAD open with a fresh EVP_CIPHER_CTX; wipes `out` on any failure.
// REQUIRES: `key` 32 bytes, `iv` 12 bytes, `out.size() == ciphertext_and_tag.size() - 16`.
absl::Status EvpOpen(const EVP_CIPHER* cipher, const uint8_t* key, const uint8_t* iv,
                     absl::Span<const uint8_t> aad, absl::Span<const uint8_t> ciphertext_and_tag,
                     absl::Span<uint8_t> out) {
  if (!FitsInt(aad.size()) || !FitsInt(ciphertext_and_tag.size())) {
    return absl::InvalidArgumentError("ciphertext or aad: larger than 2^31 - 1 bytes");
  }
  const size_t ct_size = ciphertext_and_tag.size() - kAeadTagSize;
  std::array<uint8_t, kAeadTagSize> tag;
  std::copy(ciphertext_and_tag.begin() + ct_size, ciphertext_and_tag.end(), tag.begin());
  SslUniquePtr<EVP_CIPHER_CTX> ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr) return OpenSslError("EVP_CIPHER_CTX_new");
  if (EVP_DecryptInit_ex2(ctx.get(), cipher, key, iv, nullptr) != 1) {
    return OpenSslError("EVP_DecryptInit_ex2");
  }
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kAeadTagSize),
                          tag.data()) != 1) {
    return OpenSslError("EVP_CTRL_AEAD_SET_TAG");
  }
  int len = 0;
  if (!aad.empty() &&
      EVP_DecryptUpdate(ctx.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) != 1) {
    return OpenSslError("EVP_DecryptUpdate(aad)");
  }
  size_t written = 0;
  if (ct_size != 0) {
    if (EVP_DecryptUpdate(ctx.get(), out.data(), &len, ciphertext_and_tag.data(),
                          static_cast<int>(ct_size)) != 1) {
      internal::ClearOpenSslErrors();
      return AuthenticationFailed(out);
    }
    written = static_cast<size_t>(len);
  }
  uint8_t final_block[EVP_MAX_BLOCK_LENGTH];
  if (EVP_DecryptFinal_ex(ctx.get(), written < out.size() ? out.data() + written : final_block,
                          &len) != 1) {
    internal::ClearOpenSslErrors();
    return AuthenticationFailed(out);
  }
  written += static_cast<size_t>(len);
  if (written != ct_size) {
    AuthenticationFailed(out).IgnoreError();
    return absl::InternalError("EVP_Decrypt: short output");
  }
  return absl::OkStatus();
}

// ChaCha20-Poly1305 and AES-256-GCM: OpenSSL directly. XChaCha20-Poly1305: libsodium's HChaCha20
// derives a subkey from the key and nonce[0..16], then ChaCha20-Poly1305 runs with the 12-byte
// nonce 00000000 || nonce[16..24] (as libsodium's crypto_aead_xchacha20poly1305_ietf does).
class OpenSslAead final : public Aead {
 public:
  OpenSslAead(AeadAlgorithm algorithm, const EVP_CIPHER* cipher, KeyBytes key)
      : algorithm_(algorithm), cipher_(cipher), key_(std::move(key)) {}

  absl::Status Seal(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out) const override {
    internal::CountOp(CryptoOp::kAeadSeal);
    OFFLOAD_RETURN_IF_ERROR(CheckSealArgs(algorithm_, nonce, plaintext, out));
    if (algorithm_ != AeadAlgorithm::kXChaCha20Poly1305) {
      return EvpSeal(cipher_, key_.data(), nonce.data(), aad, plaintext, out);
    }
    SubkeyAndIv derived(key_.data(), nonce);
    return EvpSeal(cipher_, derived.subkey.data(), derived.iv.data(), aad, plaintext, out);
  }

  absl::Status Open(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                    absl::Span<const uint8_t> ciphertext_and_tag,
                    absl::Span<uint8_t> out) const override {
    internal::CountOp(CryptoOp::kAeadOpen);
    OFFLOAD_RETURN_IF_ERROR(CheckOpenArgs(algorithm_, nonce, ciphertext_and_tag, out));
    if (algorithm_ != AeadAlgorithm::kXChaCha20Poly1305) {
      return EvpOpen(cipher_, key_.data(), nonce.data(), aad, ciphertext_and_tag, out);
    }
    SubkeyAndIv derived(key_.data(), nonce);
    return EvpOpen(cipher_, derived.subkey.data(), derived.iv.data(), aad, ciphertext_and_tag, out);
  }

  AeadAlgorithm algorithm() const override { return algorithm_; }

 private:
  // XChaCha20's per-message subkey (wiped on scope exit) and 12-byte IETF nonce.
  struct SubkeyAndIv {
    SubkeyAndIv(const uint8_t* key, absl::Span<const uint8_t> nonce24) {
      crypto_core_hchacha20(subkey.data(), nonce24.data(), key, nullptr);
      std::copy(nonce24.begin() + 16, nonce24.end(), iv.begin() + 4);
    }
    ~SubkeyAndIv() { sodium_memzero(subkey.data(), subkey.size()); }
    SubkeyAndIv(const SubkeyAndIv&) = delete;
    SubkeyAndIv& operator=(const SubkeyAndIv&) = delete;

    std::array<uint8_t, 32> subkey;
    std::array<uint8_t, kIetfNonceSize> iv = {};
  };

  const AeadAlgorithm algorithm_;
  const EVP_CIPHER* const cipher_;  // not owned: process-wide, see FetchedCipher
  // Locked memory. Each call's EVP_CIPHER_CTX (with the expanded key) is on OpenSSL's ordinary
  // heap for the call's duration; OpenSSL wipes it on free.
  const KeyBytes key_;
};

}  // namespace

size_t AeadNonceSize(AeadAlgorithm algorithm) {
  return algorithm == AeadAlgorithm::kXChaCha20Poly1305 ? kXChaChaNonceSize : kIetfNonceSize;
}

absl::string_view AeadName(AeadAlgorithm algorithm) {
  switch (algorithm) {
    case AeadAlgorithm::kChaCha20Poly1305:
      return "chacha20-poly1305";
    case AeadAlgorithm::kXChaCha20Poly1305:
      return "xchacha20-poly1305";
    case AeadAlgorithm::kAes256Gcm:
      return "aes-256-gcm";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Aead>> Aead::Create(Backend backend, AeadAlgorithm algorithm,
                                                   absl::Span<const uint8_t> key) {
  OFFLOAD_RETURN_IF_ERROR(CheckSize("key", key.size(), kAeadKeySize));
  switch (backend) {
    case Backend::kLibsodium:
      if (algorithm != AeadAlgorithm::kAes256Gcm) {
        return std::unique_ptr<Aead>(new SodiumChaChaAead(algorithm, KeyBytes(key.begin(), key.end())));
      } else {
        if (sodium_init() < 0) return absl::InternalError("sodium_init failed");
        if (crypto_aead_aes256gcm_is_available() == 0) {
          return absl::UnimplementedError("libsodium AES-256-GCM needs AES-NI and PCLMUL");
        }
        SodiumAesGcmAead::StatePtr state = SodiumAesGcmAead::NewState();
        if (crypto_aead_aes256gcm_beforenm(state.get(), key.data()) != 0) {
          return absl::InternalError("crypto_aead_aes256gcm_beforenm failed");
        }
        return std::unique_ptr<Aead>(new SodiumAesGcmAead(std::move(state)));
      }
    case Backend::kOpenSsl: {
      const EVP_CIPHER* cipher = FetchedCipher(algorithm);
      if (cipher == nullptr) {
        return OpenSslError(absl::StrCat("EVP_CIPHER_fetch(", AeadName(algorithm), ")"));
      }
      return std::unique_ptr<Aead>(new OpenSslAead(algorithm, cipher, KeyBytes(key.begin(), key.end())));
    }
  }
  return absl::InvalidArgumentError("backend: unknown value");
}

}  // namespace offload::crypto
