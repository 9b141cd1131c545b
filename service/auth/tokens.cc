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
constexpr size_t kEntryOverheadBytes = 160;

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

struct JwsRelease {
  void operator()(cjose_jws_t* jws) const { cjose_jws_release(jws); }
};

std::string CjoseError(const cjose_err& err) {
  return err.message != nullptr ? err.message : "unknown cjose error";
}

// A string member of `j`, or "" when it is missing or not a string.
std::string StringMember(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// One entry of the JWKS's "keys"; nullopt (a warning, and `*skipped` counts it) for a key this
// service cannot use - another type or curve, malformed or short coordinates, an RSA key under
// 2,048 bits - or that is meant for something else (use != sig): the file's other keys still
// load. Private or symmetric material is an error: a JWKS for token checks lists public keys
// only, and one that does not may be a leaked secret.
absl::StatusOr<std::optional<Key>> ParseKey(const Json& j, size_t index, size_t* skipped) {
  const std::string where = absl::StrCat("jwks_file: keys[", index, "]");
  Key key;
  const auto skip = [&](absl::string_view why) -> std::optional<Key> {
    ++*skipped;
    Log(LogLevel::kWarning, "jwks_key_skipped",
        {{"key", absl::StrCat("keys[", index, "]")}, {"kid", key.kid}, {"reason", std::string(why)}});
    return std::nullopt;
  };
  if (!j.is_object()) return skip("expected an object");
  for (const char* private_member : {"d", "p", "q", "dp", "dq", "qi", "k"}) {
    if (j.contains(private_member)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": holds private or symmetric key material (\"", private_member,
          "\"): a JWKS for token checks lists public keys only"));
    }
  }
  if (j.contains("kid")) {
    if (!j["kid"].is_string()) return skip("kid: expected a string");
    key.kid = j["kid"].get<std::string>();
  }
  if (j.contains("use") && StringMember(j, "use") != "sig") return skip("use is not sig");
  const std::string kty = StringMember(j, "kty");
  const std::string crv = StringMember(j, "crv");
  if (kty == "OKP" && crv == "Ed25519") {
    key.kind = Key::Kind::kEd25519;
    std::optional<std::string> x = Base64UrlDecode(StringMember(j, "x"));
    if (!x.has_value() || x->size() != key.ed25519.size()) {
      return skip("x: expected 32 bytes of Ed25519 public key in base64url");
    }
    std::copy(x->begin(), x->end(), key.ed25519.begin());
  } else if (kty == "EC" && crv == "P-256") {
    key.kind = Key::Kind::kP256;
  } else if (kty == "RSA") {
    key.kind = Key::Kind::kRsa;
  } else {
    return skip(absl::StrCat("kty \"", kty, "\"", crv.empty() ? "" : absl::StrCat(" crv \"", crv, "\""),
                             ": only OKP Ed25519, EC P-256 and RSA keys are used"));
  }
  if (j.contains("alg") && StringMember(j, "alg") != AlgorithmOf(key.kind)) {
    return skip(absl::StrCat("alg is not ", AlgorithmOf(key.kind), ", the only algorithm used with a ",
                             kty, " key"));
  }
  if (key.kind != Key::Kind::kEd25519) {
    const std::string text = j.dump();
    cjose_err err{};
    key.jwk.reset(cjose_jwk_import(text.data(), text.size(), &err));
    if (key.jwk == nullptr) {
      // E.g. an EC coordinate without its leading zero byte (31 bytes: PyJWT 2.6 writes 1 key
      // in 128 so; RFC 7518 6.2.1.2 wants the full 32).
      return skip(absl::StrCat("not a usable ", kty, " key (", CjoseError(err), ")"));
    }
    if (key.kind == Key::Kind::kRsa && cjose_jwk_get_keysize(key.jwk.get(), &err) < 2048) {
      return skip(absl::StrCat("an RSA key of ", cjose_jwk_get_keysize(key.jwk.get(), &err),
                               " bits; expected 2048 or more"));
    }
  }
  return key;
}

absl::StatusOr<std::shared_ptr<const KeySet>> ReadKeysOrThrow(const std::string& path,
                                                              size_t* skipped) {
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
    absl::StatusOr<std::optional<Key>> key = ParseKey(keys[i], i, skipped);
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
        absl::StrCat("jwks_file: ", path, " lists no signature key this service can use"));
  }
  return set;
}

// The keys of the JWKS at `path`; `*skipped` counts the keys passed over (ParseKey).
absl::StatusOr<std::shared_ptr<const KeySet>> ReadKeys(const std::string& path, size_t* skipped) {
  try {
    return ReadKeysOrThrow(path, skipped);
  } catch (const std::exception& e) {  // nlohmann's type errors: no exception leaves this file
    return absl::InvalidArgumentError(absl::StrCat("jwks_file: ", path, ": ", e.what()));
  }
}

// A JSON number claim in seconds since the epoch, from 1970 to the end of 9999 (anything else,
// huge or negative numbers included, is no time at all).
std::optional<absl::Time> TimeClaim(const Json& claims, const char* name) {
  auto it = claims.find(name);
  if (it == claims.end() || !it->is_number()) return std::nullopt;
  const double seconds = it->get<double>();
  if (!(seconds >= 0 && seconds <= 253402300799.0)) return std::nullopt;  // NaN fails too
  return absl::UnixEpoch() + absl::Seconds(seconds);
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
  size_t skipped = 0;
  absl::StatusOr<std::shared_ptr<const KeySet>> keys = ReadKeys(options.jwks_file, &skipped);
  if (!keys.ok()) return keys.status();
  std::unique_ptr<TokenVerifier> v(new TokenVerifier(std::move(options)));
  v->keys_skipped_.fetch_add(skipped, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&v->keys_mu_);
    v->keys_ = *std::move(keys);
    v->keys_stamp_ = stamp;
  }
  if (v->options_.watch_interval > absl::ZeroDuration()) {
    v->watcher_ = std::thread([p = v.get()] { p->Watch(); });
  }
  return v;
}

TokenVerifier::TokenVerifier(Options options) : options_(std::move(options)) {
  randombytes_buf(hash_key_.data(), hash_key_.size());
}

TokenVerifier::~TokenVerifier() {
  {
    absl::MutexLock lock(&watch_mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  sodium_memzero(hash_key_.data(), hash_key_.size());
}

absl::Time TokenVerifier::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

TokenVerifier::Digest TokenVerifier::DigestOf(absl::string_view token) const {
  // SipHash-2-4 with 128-bit output under a per-process random key: a PRF, so a token that
  // lands on a remembered one's digest cannot be made without the key; a few times cheaper than
  // keyed BLAKE2b over a 250-byte token, and every remembered call pays it.
  static_assert(sizeof(Digest) == crypto_shorthash_siphashx24_BYTES);
  Digest d;
  crypto_shorthash_siphashx24(d.data(), reinterpret_cast<const unsigned char*>(token.data()),
                              token.size(), hash_key_.data());
  return d;
}

void TokenVerifier::Watch() {
  for (;;) {
    {
      absl::MutexLock lock(&watch_mu_);
      const auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu_) { return stopping_; };
      if (watch_mu_.AwaitWithTimeout(absl::Condition(&stop), options_.watch_interval)) return;
    }
    CheckFile();
  }
}

void TokenVerifier::CheckFile() {
  const int64_t stamp = FileFingerprint(options_.jwks_file);
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&keys_mu_);
    if (stamp == keys_stamp_) return;
    keys_stamp_ = stamp;
    size_t skipped = 0;
    absl::StatusOr<std::shared_ptr<const KeySet>> read = ReadKeys(options_.jwks_file, &skipped);
    keys_skipped_.fetch_add(skipped, std::memory_order_relaxed);
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
    // From here a remembered token of an older generation is not taken (Remembered).
    keys_generation_.store(generation, std::memory_order_release);
    Log(LogLevel::kInfo, "jwks_reloaded",
        {{"jwks_file", options_.jwks_file}, {"kids", kids}, {"keys_skipped", skipped}});
  }
  // Tokens checked against the previous keys are checked again.
  absl::MutexLock lock(&memo_mu_);
  memo_.clear();
  lru_.clear();
  memo_bytes_ = 0;
  memo_generation_ = generation;
}

std::shared_ptr<const KeySet> TokenVerifier::CurrentKeys() {
  absl::MutexLock lock(&keys_mu_);
  return keys_;
}

absl::Status TokenVerifier::Refuse(Refusal refusal, absl::string_view detail) {
  refused_[static_cast<int>(refusal)].fetch_add(1, std::memory_order_relaxed);
  return absl::UnauthenticatedError(absl::StrCat("token ", RefusalName(refusal), ": ", detail));
}

std::optional<std::string> TokenVerifier::Remembered(absl::string_view token) {
  if (token.size() > options_.max_token_bytes) return std::nullopt;
  const Digest digest = DigestOf(token);
  const absl::Time now = Now();
  const uint64_t generation = keys_generation_.load(std::memory_order_acquire);
  absl::MutexLock lock(&memo_mu_);
  auto it = memo_.find(digest);
  if (it == memo_.end()) return std::nullopt;
  if (now > it->second.not_after || it->second.generation != generation) {
    EraseLocked(it);  // Verify then refuses it (expired, or its key gone), audited
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

struct TokenVerifier::Parsed {
  std::shared_ptr<const KeySet> keys;
  const Key* key = nullptr;
  size_t dot1 = 0, dot2 = 0;  // header.claims.signature
};

absl::StatusOr<TokenVerifier::Parsed> TokenVerifier::Parse(absl::string_view token) {
  if (token.size() > options_.max_token_bytes) {
    return Refuse(Refusal::kTooLarge, absl::StrCat(token.size(), " bytes; at most ",
                                                   options_.max_token_bytes));
  }
  Parsed p;
  p.keys = CurrentKeys();
  p.dot1 = token.find('.');
  p.dot2 = p.dot1 == absl::string_view::npos ? p.dot1 : token.find('.', p.dot1 + 1);
  if (p.dot2 == absl::string_view::npos || token.find('.', p.dot2 + 1) != absl::string_view::npos) {
    return Refuse(Refusal::kMalformed, "expected a JWS in compact form (three parts)");
  }
  std::optional<std::string> header_text = Base64UrlDecode(token.substr(0, p.dot1));
  std::optional<Json> header =
      header_text.has_value() ? JsonObject(*header_text) : std::optional<Json>();
  if (!header.has_value()) return Refuse(Refusal::kMalformed, "header is not a JSON object");
  const std::string alg = StringMember(*header, "alg");
  if (alg != "EdDSA" && alg != "ES256" && alg != "RS256") {
    return Refuse(Refusal::kAlgorithm,
                  absl::StrCat("alg \"", alg.substr(0, 16), "\"; expected EdDSA, ES256 or RS256"));
  }
  if (header->contains("crit")) {
    return Refuse(Refusal::kMalformed, "crit header parameters are not understood");
  }
  if (const auto kid = header->find("kid"); kid != header->end()) {
    if (!kid->is_string()) return Refuse(Refusal::kMalformed, "kid is not a string");
    p.key = p.keys->Find(kid->get<std::string>());
    if (p.key == nullptr) return Refuse(Refusal::kUnknownKid, "no key of that kid in the JWKS");
  } else if (p.keys->keys.size() == 1) {
    p.key = &p.keys->keys.front();
  } else {
    return Refuse(Refusal::kUnknownKid, "no kid, and the JWKS holds several keys");
  }
  if (alg != AlgorithmOf(p.key->kind)) {
    return Refuse(Refusal::kAlgorithm,
                  absl::StrCat("alg ", alg, " with a key for ", AlgorithmOf(p.key->kind)));
  }
  return p;
}

absl::Status TokenVerifier::Precheck(absl::string_view token) { return Parse(token).status(); }

absl::StatusOr<std::string> TokenVerifier::Verify(absl::string_view token) {
  absl::StatusOr<Parsed> parsed = Parse(token);
  if (!parsed.ok()) return parsed.status();
  const Key& key = *parsed->key;
  const size_t dot1 = parsed->dot1, dot2 = parsed->dot2;
  std::optional<std::string> signature = Base64UrlDecode(token.substr(dot2 + 1));
  // One encoding per signature (RFC 7518 3.4, RFC 8037 3.1): no padded or trailing variants of
  // a valid token.
  if (!signature.has_value() ||
      (key.kind != Key::Kind::kRsa && signature->size() != crypto_sign_BYTES)) {
    return Refuse(Refusal::kSignature, "not a signature of this algorithm's size");
  }

  signature_checks_.fetch_add(1, std::memory_order_relaxed);
  std::string claims_text;
  if (key.kind == Key::Kind::kEd25519) {
    // cjose does not know EdDSA: the signature over "header.claims" by libsodium.
    if (crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(signature->data()),
                                    reinterpret_cast<const unsigned char*>(token.data()), dot2,
                                    key.ed25519.data()) != 0) {
      return Refuse(Refusal::kSignature, "does not verify");
    }
    std::optional<std::string> claims = Base64UrlDecode(token.substr(dot1 + 1, dot2 - dot1 - 1));
    if (!claims.has_value()) return Refuse(Refusal::kMalformed, "claims are not base64url");
    claims_text = *std::move(claims);
  } else {
    cjose_err err{};
    std::unique_ptr<cjose_jws_t, JwsRelease> jws(cjose_jws_import(token.data(), token.size(), &err));
    if (jws == nullptr) return Refuse(Refusal::kMalformed, "not a JWS cjose can read");
    if (!cjose_jws_verify(jws.get(), key.jwk.get(), &err)) {
      return Refuse(Refusal::kSignature, "does not verify");
    }
    uint8_t* plaintext = nullptr;  // owned by the jws
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
  if (!exp.has_value()) return Refuse(Refusal::kMalformed, "exp missing or not a time");
  if (now > *exp + options_.clock_skew) return Refuse(Refusal::kExpired, "exp has passed");
  if (claims->contains("nbf")) {
    const std::optional<absl::Time> nbf = TimeClaim(*claims, "nbf");
    if (!nbf.has_value()) return Refuse(Refusal::kMalformed, "nbf is not a time");
    if (now + options_.clock_skew < *nbf) return Refuse(Refusal::kNotYetValid, "nbf is ahead");
  }
  if (StringMember(*claims, "iss") != options_.issuer) {
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
  const std::string id = StringMember(*claims, options_.identity_claim.c_str());
  if (id.empty() || id.size() > kMaxIdentityBytes) {
    return Refuse(Refusal::kIdentity,
                  absl::StrCat(options_.identity_claim, ": expected a string of 1 to ",
                               kMaxIdentityBytes, " bytes"));
  }
  std::string identity = absl::StrCat(options_.identity_prefix, id);
  Remember(DigestOf(token), identity, *exp + options_.clock_skew, parsed->keys->generation);
  return identity;
}

TokenVerifier::Counts TokenVerifier::counts() const {
  Counts c;
  c.remembered = remembered_.load(std::memory_order_relaxed);
  c.signature_checks = signature_checks_.load(std::memory_order_relaxed);
  for (int i = 0; i < kRefusals; ++i) c.refused[i] = refused_[i].load(std::memory_order_relaxed);
  c.jwks_keys_skipped = keys_skipped_.load(std::memory_order_relaxed);
  return c;
}

size_t TokenVerifier::remembered_bytes() const {
  absl::MutexLock lock(&memo_mu_);
  return memo_bytes_;
}

}  // namespace offload::auth
