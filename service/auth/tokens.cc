#include "service/auth/tokens.h"

#include <cjose/cjose.h>
#include <sodium.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "service/auth/tls.h"
#include "service/common/log.h"

namespace offload::auth {
namespace internal {

// One public key of the JWKS, and the only algorithm it may verify.
struct Key {
  enum class Kind { kEd25519, kP256, kRsa };
  std::string kid;
  Kind kind = Kind::kEd25519;
  std::array<uint8_t, crypto_sign_PUBLICKEYBYTES> ed25519{};
  struct JwkRelease {
    void operator()(cjose_jwk_t* jwk) const { cjose_jwk_release(jwk); }
  };
  std::unique_ptr<cjose_jwk_t, JwkRelease> jwk;  // P-256 and RSA keys
};

struct KeySet {
  std::vector<Key> keys;
  uint64_t generation = 0;
  const Key* Find(absl::string_view kid) const {
    for (const Key& k : keys) {
      if (k.kid == kid) return &k;
    }
    return nullptr;
  }
};

}  // namespace internal
namespace {

using internal::Key;
using internal::KeySet;
using Json = nlohmann::json;

constexpr size_t kMaxJwksBytes = 1 << 20;
constexpr size_t kMaxIdentityBytes = 256;
// What one remembered token is charged besides its identity: the map slot, the list node, the
// entry.
constexpr size_t kEntryOverheadBytes = 128;

const char* AlgorithmOf(Key::Kind kind) {
  switch (kind) {
    case Key::Kind::kEd25519: return "EdDSA";
    case Key::Kind::kP256: return "ES256";
    case Key::Kind::kRsa: return "RS256";
  }
  return "";
}

// base64url without padding (RFC 7515 section 2), strictly: no padding, no other characters.
std::optional<std::string> Base64UrlDecode(absl::string_view in) {
  std::string out(in.size() * 3 / 4 + 3, '\0');
  size_t len = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), in.data(),
                        in.size(), nullptr, &len, nullptr,
                        sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0) {
    return std::nullopt;
  }
  out.resize(len);
  return out;
}

std::optional<Json> JsonObject(absl::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

std::string CjoseError(const cjose_err& err) {
  return err.message != nullptr ? err.message : "unknown cjose error";
}

// One entry of the JWKS's "keys"; nullopt for a key meant for something else (use != sig).
absl::StatusOr<std::optional<Key>> ParseKey(const Json& j, size_t index) {
  const std::string where = absl::StrCat("jwks_file: keys[", index, "]");
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object"));
  if (j.contains("use") && j["use"] != "sig") return std::nullopt;
  for (const char* private_member : {"d", "p", "q", "dp", "dq", "qi", "k"}) {
    if (j.contains(private_member)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": holds private or symmetric key material (\"", private_member,
          "\"): a JWKS for token checks lists public keys only"));
    }
  }
  Key key;
  if (j.contains("kid")) {
    if (!j["kid"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": kid: expected a string"));
    }
    key.kid = j["kid"].get<std::string>();
  }
  const std::string kty = j.value("kty", "");
  const std::string crv = j.value("crv", "");
  if (kty == "OKP" && crv == "Ed25519") {
    key.kind = Key::Kind::kEd25519;
    std::optional<std::string> x =
        j.contains("x") && j["x"].is_string() ? Base64UrlDecode(j["x"].get<std::string>())
                                              : std::nullopt;
    if (!x.has_value() || x->size() != key.ed25519.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": x: expected 32 bytes of Ed25519 public key in base64url"));
    }
    std::copy(x->begin(), x->end(), key.ed25519.begin());
  } else if (kty == "EC" && crv == "P-256") {
    key.kind = Key::Kind::kP256;
  } else if (kty == "RSA") {
    key.kind = Key::Kind::kRsa;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected kty OKP (crv Ed25519), EC (crv P-256) or RSA, got kty \"", kty,
        "\"", crv.empty() ? "" : absl::StrCat(" crv \"", crv, "\"")));
  }
  if (j.contains("alg") && j["alg"] != AlgorithmOf(key.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": alg: a ", kty, " key verifies ",
                                                   AlgorithmOf(key.kind), " only"));
  }
  if (key.kind != Key::Kind::kEd25519) {
    const std::string text = j.dump();
    cjose_err err{};
    key.jwk.reset(cjose_jwk_import(text.data(), text.size(), &err));
    if (key.jwk == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a usable ", kty, " key (", CjoseError(err), ")"));
    }
    if (key.kind == Key::Kind::kRsa && cjose_jwk_get_keysize(key.jwk.get(), &err) < 2048) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an RSA key of ", cjose_jwk_get_keysize(key.jwk.get(), &err),
                       " bits; expected 2048 or more"));
    }
  }
  return key;
}

absl::StatusOr<std::shared_ptr<const KeySet>> ReadKeys(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("jwks_file: cannot read ", path));
  std::string text(kMaxJwksBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxJwksBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("jwks_file: ", path, " is over ", kMaxJwksBytes, " bytes"));
  }
  std::optional<Json> root = JsonObject(text);
  if (!root.has_value() || !root->contains("keys") || !(*root)["keys"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("jwks_file: ", path, ": expected a JSON object with a \"keys\" list"));
  }
  auto set = std::make_shared<KeySet>();
  const Json& keys = (*root)["keys"];
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::optional<Key>> key = ParseKey(keys[i], i);
    if (!key.ok()) return key.status();
    if (!key->has_value()) continue;
    if (set->Find((*key)->kid) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("jwks_file: keys[", i, "]: kid \"", (*key)->kid, "\" appears twice"));
    }
    set->keys.push_back(*std::move(*key));
  }
  if (set->keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("jwks_file: ", path, " lists no signature key"));
  }
  return set;
}

// A JSON number claim in seconds since the epoch.
std::optional<absl::Time> TimeClaim(const Json& claims, const char* name) {
  auto it = claims.find(name);
  if (it == claims.end() || !it->is_number()) return std::nullopt;
  return absl::FromUnixMicros(static_cast<int64_t>(it->get<double>() * 1e6));
}

}  // namespace

const char* TokenVerifier::RefusalName(Refusal refusal) {
  switch (refusal) {
    case Refusal::kMalformed: return "malformed";
    case Refusal::kTooLarge: return "too_large";
    case Refusal::kAlgorithm: return "algorithm";
    case Refusal::kUnknownKid: return "unknown_kid";
    case Refusal::kSignature: return "signature";
    case Refusal::kExpired: return "expired";
    case Refusal::kNotYetValid: return "not_yet_valid";
    case Refusal::kIssuer: return "issuer";
    case Refusal::kAudience: return "audience";
    case Refusal::kIdentity: return "identity";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<TokenVerifier>> TokenVerifier::Create(Options options) {
  if (options.issuer.empty()) {
    return absl::InvalidArgumentError("token_issuer: required with jwks_file");
  }
  if (options.audience.empty()) {
    return absl::InvalidArgumentError("token_audience: required with jwks_file");
  }
  if (options.identity_claim.empty()) {
    return absl::InvalidArgumentError("token_identity_claim: expected a claim name");
  }
  if (options.clock_skew < absl::ZeroDuration() || options.clock_skew > absl::Minutes(10)) {
    return absl::InvalidArgumentError("token_clock_skew: expected 0 to 10m");
  }
  if (options.max_token_bytes < 256) {
    return absl::InvalidArgumentError("max_token_bytes: expected 256 or more");
  }
  const int64_t stamp = FileFingerprint(options.jwks_file);
  absl::StatusOr<std::shared_ptr<const KeySet>> keys = ReadKeys(options.jwks_file);
  if (!keys.ok()) return keys.status();
  std::unique_ptr<TokenVerifier> v(new TokenVerifier(std::move(options)));
  absl::MutexLock lock(&v->keys_mu_);
  v->keys_ = *std::move(keys);
  v->keys_stamp_ = stamp;
  v->next_look_ns_.store(absl::ToUnixNanos(v->Now()) + 1'000'000'000);
  return v;
}

TokenVerifier::TokenVerifier(Options options) : options_(std::move(options)) {
  randombytes_buf(hash_key_.data(), hash_key_.size());
}

TokenVerifier::~TokenVerifier() { sodium_memzero(hash_key_.data(), hash_key_.size()); }

absl::Time TokenVerifier::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

TokenVerifier::Digest TokenVerifier::DigestOf(absl::string_view token) const {
  Digest d;
  crypto_generichash(d.data(), d.size(), reinterpret_cast<const unsigned char*>(token.data()),
                     token.size(), hash_key_.data(), hash_key_.size());
  return d;
}

void TokenVerifier::MaybeReload() {
  const int64_t now = absl::ToUnixNanos(Now());
  int64_t next = next_look_ns_.load(std::memory_order_relaxed);
  // One caller per second looks at the file; the others go on with the keys they have.
  if (now < next || !next_look_ns_.compare_exchange_strong(next, now + 1'000'000'000)) return;
  const int64_t stamp = FileFingerprint(options_.jwks_file);
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&keys_mu_);
    if (stamp == keys_stamp_) return;
    keys_stamp_ = stamp;
    absl::StatusOr<std::shared_ptr<const KeySet>> read = ReadKeys(options_.jwks_file);
    if (!read.ok()) {
      Log(LogLevel::kError, "jwks_reload_failed",
          {{"error", std::string(read.status().message())}, {"kept", "previous keys"}});
      return;
    }
    auto fresh = std::const_pointer_cast<KeySet>(*std::move(read));
    generation = fresh->generation = keys_->generation + 1;
    std::vector<std::string> kids;
    for (const Key& k : fresh->keys) kids.push_back(k.kid);
    keys_ = std::move(fresh);
    Log(LogLevel::kInfo, "jwks_reloaded", {{"jwks_file", options_.jwks_file}, {"kids", kids}});
  }
  // Tokens checked against the previous keys are checked again.
  absl::MutexLock lock(&memo_mu_);
  memo_.clear();
  lru_.clear();
  memo_bytes_ = 0;
  memo_generation_ = generation;
}

std::shared_ptr<const KeySet> TokenVerifier::CurrentKeys() {
  MaybeReload();
  absl::MutexLock lock(&keys_mu_);
  return keys_;
}

absl::Status TokenVerifier::Refuse(Refusal refusal, absl::string_view detail) {
  refused_[static_cast<int>(refusal)].fetch_add(1, std::memory_order_relaxed);
  return absl::UnauthenticatedError(absl::StrCat("token ", RefusalName(refusal), ": ", detail));
}

std::optional<std::string> TokenVerifier::Remembered(absl::string_view token) {
  if (token.size() > options_.max_token_bytes) return std::nullopt;
  MaybeReload();  // a changed JWKS forgets what was remembered
  const Digest digest = DigestOf(token);
  const absl::Time now = Now();
  absl::MutexLock lock(&memo_mu_);
  auto it = memo_.find(digest);
  if (it == memo_.end()) return std::nullopt;
  if (now > it->second.not_after) {
    EraseLocked(it);  // Verify then refuses it as expired, audited
    return std::nullopt;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  remembered_.fetch_add(1, std::memory_order_relaxed);
  return it->second.identity;
}

void TokenVerifier::EraseLocked(absl::flat_hash_map<Digest, Entry>::iterator it) {
  memo_bytes_ -= kEntryOverheadBytes + it->second.identity.size();
  lru_.erase(it->second.lru);
  memo_.erase(it);
}

void TokenVerifier::Remember(const Digest& digest, std::string identity, absl::Time not_after,
                             uint64_t generation) {
  const size_t bytes = kEntryOverheadBytes + identity.size();
  if (bytes > options_.remembered_bytes) return;
  absl::MutexLock lock(&memo_mu_);
  if (generation != memo_generation_) return;  // the keys changed meanwhile
  if (auto it = memo_.find(digest); it != memo_.end()) EraseLocked(it);
  while (memo_bytes_ + bytes > options_.remembered_bytes && !lru_.empty()) {
    EraseLocked(memo_.find(lru_.back()));
  }
  lru_.push_front(digest);
  memo_.emplace(digest, Entry{std::move(identity), not_after, generation, lru_.begin()});
  memo_bytes_ += bytes;
}

absl::StatusOr<std::string> TokenVerifier::Verify(absl::string_view token) {
  if (token.size() > options_.max_token_bytes) {
    return Refuse(Refusal::kTooLarge, absl::StrCat(token.size(), " bytes; at most ",
                                                   options_.max_token_bytes));
  }
  std::shared_ptr<const KeySet> keys = CurrentKeys();
  // header.claims.signature, each base64url.
  const size_t dot1 = token.find('.');
  const size_t dot2 = dot1 == absl::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == absl::string_view::npos || token.find('.', dot2 + 1) != absl::string_view::npos) {
    return Refuse(Refusal::kMalformed, "expected a JWS in compact form (three parts)");
  }
  std::optional<std::string> header_text = Base64UrlDecode(token.substr(0, dot1));
  std::optional<Json> header =
      header_text.has_value() ? JsonObject(*header_text) : std::optional<Json>();
  if (!header.has_value()) return Refuse(Refusal::kMalformed, "header is not a JSON object");
  const auto alg_it = header->find("alg");
  const std::string alg = alg_it != header->end() && alg_it->is_string() ? alg_it->get<std::string>()
                                                                         : std::string();
  if (alg != "EdDSA" && alg != "ES256" && alg != "RS256") {
    return Refuse(Refusal::kAlgorithm,
                  absl::StrCat("alg \"", alg.substr(0, 16), "\"; expected EdDSA, ES256 or RS256"));
  }
  if (header->contains("crit")) {
    return Refuse(Refusal::kMalformed, "crit header parameters are not understood");
  }
  const Key* key = nullptr;
  if (const auto kid = header->find("kid"); kid != header->end()) {
    if (!kid->is_string()) return Refuse(Refusal::kMalformed, "kid is not a string");
    key = keys->Find(kid->get<std::string>());
    if (key == nullptr) return Refuse(Refusal::kUnknownKid, "no key of that kid in the JWKS");
  } else if (keys->keys.size() == 1) {
    key = &keys->keys.front();
  } else {
    return Refuse(Refusal::kUnknownKid, "no kid, and the JWKS holds several keys");
  }
  if (alg != AlgorithmOf(key->kind)) {
    return Refuse(Refusal::kAlgorithm,
                  absl::StrCat("alg ", alg, " with a key for ", AlgorithmOf(key->kind)));
  }

  signature_checks_.fetch_add(1, std::memory_order_relaxed);
  std::string claims_text;
  if (key->kind == Key::Kind::kEd25519) {
    // cjose does not know EdDSA: the signature over "header.claims" by libsodium.
    std::optional<std::string> signature = Base64UrlDecode(token.substr(dot2 + 1));
    if (!signature.has_value() || signature->size() != crypto_sign_BYTES ||
        crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(signature->data()),
                                    reinterpret_cast<const unsigned char*>(token.data()), dot2,
                                    key->ed25519.data()) != 0) {
      return Refuse(Refusal::kSignature, "does not verify");
    }
    std::optional<std::string> claims = Base64UrlDecode(token.substr(dot1 + 1, dot2 - dot1 - 1));
    if (!claims.has_value()) return Refuse(Refusal::kMalformed, "claims are not base64url");
    claims_text = *std::move(claims);
  } else {
    cjose_err err{};
    std::unique_ptr<cjose_jws_t, void (*)(cjose_jws_t*)> jws(
        cjose_jws_import(token.data(), token.size(), &err), cjose_jws_release);
    if (jws == nullptr) return Refuse(Refusal::kMalformed, "not a JWS cjose can read");
    if (!cjose_jws_verify(jws.get(), key->jwk.get(), &err)) {
      return Refuse(Refusal::kSignature, "does not verify");
    }
    uint8_t* plaintext = nullptr;
    size_t plaintext_len = 0;
    if (!cjose_jws_get_plaintext(jws.get(), &plaintext, &plaintext_len, &err)) {
      return Refuse(Refusal::kMalformed, "claims are not readable");
    }
    claims_text.assign(reinterpret_cast<const char*>(plaintext), plaintext_len);
  }

  std::optional<Json> claims = JsonObject(claims_text);
  if (!claims.has_value()) return Refuse(Refusal::kMalformed, "claims are not a JSON object");
  const absl::Time now = Now();
  const std::optional<absl::Time> exp = TimeClaim(*claims, "exp");
  if (!exp.has_value()) return Refuse(Refusal::kMalformed, "exp missing or not a number");
  if (now > *exp + options_.clock_skew) return Refuse(Refusal::kExpired, "exp has passed");
  if (claims->contains("nbf")) {
    const std::optional<absl::Time> nbf = TimeClaim(*claims, "nbf");
    if (!nbf.has_value()) return Refuse(Refusal::kMalformed, "nbf is not a number");
    if (now + options_.clock_skew < *nbf) return Refuse(Refusal::kNotYetValid, "nbf is ahead");
  }
  const auto iss = claims->find("iss");
  if (iss == claims->end() || !iss->is_string() || *iss != options_.issuer) {
    return Refuse(Refusal::kIssuer, "iss is not the configured issuer");
  }
  bool audience = false;
  if (const auto aud = claims->find("aud"); aud != claims->end()) {
    if (aud->is_string()) {
      audience = *aud == options_.audience;
    } else if (aud->is_array()) {
      for (const Json& a : *aud) audience = audience || (a.is_string() && a == options_.audience);
    }
  }
  if (!audience) return Refuse(Refusal::kAudience, "aud does not name this service");
  const auto id = claims->find(options_.identity_claim);
  if (id == claims->end() || !id->is_string() || id->get_ref<const std::string&>().empty() ||
      id->get_ref<const std::string&>().size() > kMaxIdentityBytes) {
    return Refuse(Refusal::kIdentity,
                  absl::StrCat(options_.identity_claim, ": expected a string of 1 to ",
                               kMaxIdentityBytes, " bytes"));
  }
  std::string identity = id->get<std::string>();
  Remember(DigestOf(token), identity, *exp + options_.clock_skew, keys->generation);
  return identity;
}

TokenVerifier::Counts TokenVerifier::counts() const {
  Counts c;
  c.remembered = remembered_.load(std::memory_order_relaxed);
  c.signature_checks = signature_checks_.load(std::memory_order_relaxed);
  for (int i = 0; i < kRefusals; ++i) c.refused[i] = refused_[i].load(std::memory_order_relaxed);
  return c;
}

size_t TokenVerifier::remembered_bytes() const {
  absl::MutexLock lock(&memo_mu_);
  return memo_bytes_;
}

}  // namespace offload::auth
