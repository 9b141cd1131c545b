#include "service/ops/operations.h"

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"
#include "service/common/status_macros.h"
#include "service/crypto/aead.h"
#include "service/crypto/ed25519.h"
#include "service/crypto/x25519.h"
#include "service/ops/envelope.h"

namespace offload::ops {
namespace {

using KeyPtr = std::shared_ptr<const keys::ManagedKey>;

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Gives `out` exactly `size` bytes and returns them as a writable span.
absl::Span<uint8_t> Resize(std::string* out, size_t size) {
  out->resize(size);
  return absl::MakeSpan(reinterpret_cast<uint8_t*>(out->data()), out->size());
}

absl::Status CheckSize(absl::string_view field, const std::string& value, size_t expected) {
  if (value.size() == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, " bytes, got ", value.size()));
}

absl::string_view TypeName(v1::KeyType type) {
  switch (type) {
    case v1::KEY_TYPE_ED25519: return "ed25519";
    case v1::KEY_TYPE_X25519: return "x25519";
    case v1::KEY_TYPE_CHACHA20_POLY1305: return "chacha20-poly1305";
    case v1::KEY_TYPE_XCHACHA20_POLY1305: return "xchacha20-poly1305";
    case v1::KEY_TYPE_AES256_GCM: return "aes256-gcm";
    default: return "unspecified";
  }
}

bool IsAeadType(v1::KeyType type) {
  return type == v1::KEY_TYPE_CHACHA20_POLY1305 || type == v1::KEY_TYPE_XCHACHA20_POLY1305 ||
         type == v1::KEY_TYPE_AES256_GCM;
}

// The key named `key_id`, which must be of a type accepted by `type_ok`; `wanted` names that type
// in the error.
template <typename TypeOk>
absl::StatusOr<KeyPtr> FindKey(const keys::KeyManager& manager, absl::string_view key_id,
                               TypeOk type_ok, absl::string_view wanted) {
  OFFLOAD_RETURN_IF_ERROR(keys::ValidateKeyId(key_id));
  KeyPtr key = manager.Find(key_id);
  if (key == nullptr) {
    return absl::NotFoundError(absl::StrCat("key_id: no key named '", key_id, "'"));
  }
  if (!type_ok(key->type)) {
    return absl::FailedPreconditionError(absl::StrCat("key_id: key '", key_id, "' is ",
                                                      TypeName(key->type), ", expected ", wanted));
  }
  OFFLOAD_RETURN_IF_ERROR(key->CheckUsable());  // disabled, or pending deletion
  return key;
}

absl::StatusOr<KeyPtr> FindKeyOfType(const keys::KeyManager& manager, const std::string& key_id,
                                     v1::KeyType type) {
  return FindKey(
      manager, key_id, [type](v1::KeyType t) { return t == type; }, TypeName(type));
}

// A version named by the caller or an envelope, for opening or deriving: it must exist, be
// enabled and not be below the key's min_decryption_version.
absl::StatusOr<const keys::ManagedKeyVersion*> FindVersion(const keys::ManagedKey& key,
                                                           uint32_t version) {
  return key.UsableVersion(version, keys::KeyUse::kConsume);
}

// `out` is a fresh ItemStatus: an OK status leaves its message unset, which spares the heap
// std::string protobuf would allocate for an empty message (one malloc/free per batch item).
void SetItemStatus(const absl::Status& status, v1::ItemStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  if (!status.ok()) out->set_message(std::string(status.message()));
}

// Drops a failed batch item's answer; a shared key's bytes are zeroed first (WipeSharedKey).
template <typename Result>
void ClearFailedResponse(Result* result) {
  result->clear_response();
}
void ClearFailedResponse(v1::BatchDeriveResult* result) {
  WipeSharedKey(result);
  result->clear_response();
}

// Writes the raw X25519 secret or the box key, as `output` asks, into `out` (32 bytes).
absl::Status DeriveInto(const keys::ManagedKey& key, const keys::ManagedKeyVersion& version,
                        absl::Span<const uint8_t> peer, v1::DeriveOutput output,
                        absl::Span<uint8_t> out) {
  const bool allow_zero = key.options.allow_zero_shared_secret();
  if (output == v1::DERIVE_OUTPUT_BOX_BEFORENM) {
    SecretBytes raw(crypto::kX25519KeySize);
    OFFLOAD_RETURN_IF_ERROR(version.x25519->Derive(peer, allow_zero, absl::MakeSpan(raw)));
    crypto::BoxKeyFromShared(raw, out);
    return absl::OkStatus();
  }
  return version.x25519->Derive(peer, allow_zero, out);
}

}  // namespace

void WipeSharedKey(v1::BatchDeriveResult* result) {
  if (!result->has_response()) return;
  std::string* key = result->mutable_response()->mutable_shared_key();
  sodium_memzero(key->data(), key->size());
}

Operations::Operations(keys::KeyManager* keys, memo::Memo* memo, WorkerPool* pool,
                       crypto::BackendChoice backends, Options options)
    : keys_(keys), memo_(memo), pool_(pool), backends_(backends), options_(options) {}

absl::Status Operations::DeriveShared(const keys::ManagedKey& key,
                                      const keys::ManagedKeyVersion& version,
                                      absl::Span<const uint8_t> peer, v1::DeriveOutput output,
                                      absl::Span<uint8_t> out, bool* memo_hit) const {
  if (output == v1::DERIVE_OUTPUT_UNSPECIFIED) output = v1::DERIVE_OUTPUT_RAW;
  const memo::Digest digest = memo_->DeriveDigest(version.instance, output, peer);
  *memo_hit = memo_->DeriveLookup(digest, out);
  if (*memo_hit) return absl::OkStatus();
  OFFLOAD_RETURN_IF_ERROR(DeriveInto(key, version, peer, output, out));
  memo_->DeriveInsert(digest, key.key_id, out);
  return absl::OkStatus();
}

absl::Status Operations::Sign(const v1::SignRequest& request, v1::SignResponse* response) const {
  OFFLOAD_ASSIGN_OR_RETURN(KeyPtr key,
                           FindKeyOfType(*keys_, request.key_id(), v1::KEY_TYPE_ED25519));
  const keys::ManagedKeyVersion* version = key->Current();
  OFFLOAD_RETURN_IF_ERROR(version->signer->Sign(
      Bytes(request.message()),
      Resize(response->mutable_signature(), crypto::kEd25519SignatureSize)));
  response->set_key_version(version->version);
  response->set_public_key(version->public_key.data(), version->public_key.size());
  return absl::OkStatus();
}

absl::Status Operations::Verify(const v1::VerifyRequest& request,
                                v1::VerifyResponse* response) const {
  memo::Digest digest;
  absl::Status status;
  if (VerifyFromMemo(request, response, &digest, &status)) return status;
  return VerifyFresh(request, digest, response);
}

bool Operations::VerifyFromMemo(const v1::VerifyRequest& request, v1::VerifyResponse* response,
                                memo::Digest* digest, absl::Status* status) const {
  *status = CheckSize("public_key", request.public_key(), crypto::kEd25519PublicKeySize);
  if (status->ok()) {
    *status = CheckSize("signature", request.signature(), crypto::kEd25519SignatureSize);
  }
  if (!status->ok()) return true;
  *digest = memo_->VerifyDigest(Bytes(request.public_key()), Bytes(request.signature()),
                                Bytes(request.message()));
  if (!memo_->VerifyHit(*digest)) return false;
  response->set_valid(true);
  response->set_memo_hit(true);
  return true;
}

absl::Status Operations::VerifyFresh(const v1::VerifyRequest& request, const memo::Digest& digest,
                                     v1::VerifyResponse* response) const {
  const bool valid = crypto::Ed25519Verify(backends_.ed25519_verify, Bytes(request.public_key()),
                                           Bytes(request.message()), Bytes(request.signature()));
  if (valid) memo_->VerifyInsert(digest);  // only valid results are remembered
  response->set_valid(valid);
  response->set_memo_hit(false);
  return absl::OkStatus();
}

absl::Status Operations::Derive(const v1::DeriveRequest& request,
                                v1::DeriveResponse* response) const {
  DeriveProbe probe;
  absl::Status status;
  if (DeriveFromMemo(request, response, &probe, &status)) return status;
  return DeriveFresh(request, probe, response);
}

bool Operations::DeriveFromMemo(const v1::DeriveRequest& request, v1::DeriveResponse* response,
                                DeriveProbe* probe, absl::Status* status) const {
  *status = [&]() -> absl::Status {
    OFFLOAD_RETURN_IF_ERROR(
        CheckSize("peer_public_key", request.peer_public_key(), crypto::kX25519KeySize));
    if (!v1::DeriveOutput_IsValid(request.output())) {
      return absl::InvalidArgumentError(absl::StrCat("output: unknown value ", request.output()));
    }
    // A batch's items share one probe: a key found for an earlier item (same id, so the same
    // type) serves the next one without another lookup.
    if (probe->key == nullptr || probe->key->key_id != request.key_id()) {
      OFFLOAD_ASSIGN_OR_RETURN(probe->key,
                               FindKeyOfType(*keys_, request.key_id(), v1::KEY_TYPE_X25519));
    }
    OFFLOAD_ASSIGN_OR_RETURN(probe->version, FindVersion(*probe->key, request.key_version()));
    return absl::OkStatus();
  }();
  if (!status->ok()) return true;
  probe->output = request.output() == v1::DERIVE_OUTPUT_UNSPECIFIED ? v1::DERIVE_OUTPUT_RAW
                                                                      : request.output();
  probe->digest =
      memo_->DeriveDigest(probe->version->instance, probe->output, Bytes(request.peer_public_key()));
  if (!memo_->DeriveLookup(probe->digest,
                           Resize(response->mutable_shared_key(), crypto::kX25519KeySize))) {
    return false;
  }
  response->set_key_version(probe->version->version);
  response->set_memo_hit(true);
  return true;
}

absl::Status Operations::DeriveFresh(const v1::DeriveRequest& request, const DeriveProbe& probe,
                                     v1::DeriveResponse* response) const {
  absl::Span<uint8_t> out = Resize(response->mutable_shared_key(), crypto::kX25519KeySize);
  OFFLOAD_RETURN_IF_ERROR(DeriveInto(*probe.key, *probe.version,
                                     Bytes(request.peer_public_key()), probe.output, out));
  memo_->DeriveInsert(probe.digest, probe.key->key_id, out);
  response->set_key_version(probe.version->version);
  response->set_memo_hit(false);
  return absl::OkStatus();
}

absl::Status Operations::BoxSeal(const v1::BoxSealRequest& request,
                                 v1::BoxSealResponse* response) const {
  OFFLOAD_RETURN_IF_ERROR(
      CheckSize("peer_public_key", request.peer_public_key(), crypto::kX25519KeySize));
  if (!request.nonce().empty()) {
    OFFLOAD_RETURN_IF_ERROR(CheckSize("nonce", request.nonce(), crypto::kBoxNonceSize));
  }
  OFFLOAD_ASSIGN_OR_RETURN(KeyPtr key, FindKeyOfType(*keys_, request.key_id(), v1::KEY_TYPE_X25519));
  const keys::ManagedKeyVersion* version = key->Current();
  SecretBytes box_key(crypto::kX25519KeySize);
  bool hit = false;
  OFFLOAD_RETURN_IF_ERROR(DeriveShared(*key, *version, Bytes(request.peer_public_key()),
                                       v1::DERIVE_OUTPUT_BOX_BEFORENM, absl::MakeSpan(box_key),
                                       &hit));
  if (request.nonce().empty()) {
    randombytes_buf(Resize(response->mutable_nonce(), crypto::kBoxNonceSize).data(),
                    crypto::kBoxNonceSize);
  } else {
    response->set_nonce(request.nonce());
  }
  OFFLOAD_RETURN_IF_ERROR(crypto::BoxSealAfternm(
      box_key, Bytes(response->nonce()), Bytes(request.plaintext()),
      Resize(response->mutable_ciphertext(), request.plaintext().size() + crypto::kBoxTagSize)));
  response->set_key_version(version->version);
  return absl::OkStatus();
}

absl::Status Operations::BoxOpen(const v1::BoxOpenRequest& request,
                                 v1::BoxOpenResponse* response) const {
  OFFLOAD_RETURN_IF_ERROR(
      CheckSize("peer_public_key", request.peer_public_key(), crypto::kX25519KeySize));
  OFFLOAD_RETURN_IF_ERROR(CheckSize("nonce", request.nonce(), crypto::kBoxNonceSize));
  if (request.ciphertext().size() < crypto::kBoxTagSize) {
    return absl::InvalidArgumentError(absl::StrCat("ciphertext: expected at least ",
                                                   crypto::kBoxTagSize, " bytes, got ",
                                                   request.ciphertext().size()));
  }
  OFFLOAD_ASSIGN_OR_RETURN(KeyPtr key, FindKeyOfType(*keys_, request.key_id(), v1::KEY_TYPE_X25519));
  OFFLOAD_ASSIGN_OR_RETURN(const keys::ManagedKeyVersion* version,
                           FindVersion(*key, request.key_version()));
  SecretBytes box_key(crypto::kX25519KeySize);
  bool hit = false;
  OFFLOAD_RETURN_IF_ERROR(DeriveShared(*key, *version, Bytes(request.peer_public_key()),
                                       v1::DERIVE_OUTPUT_BOX_BEFORENM, absl::MakeSpan(box_key),
                                       &hit));
  absl::Status opened = crypto::BoxOpenAfternm(
      box_key, Bytes(request.nonce()), Bytes(request.ciphertext()),
      Resize(response->mutable_plaintext(), request.ciphertext().size() - crypto::kBoxTagSize));
  if (!opened.ok()) {
    response->clear_plaintext();
    return opened;
  }
  response->set_memo_hit(hit);
  response->set_key_version(version->version);
  return absl::OkStatus();
}

namespace {
// Seals `plaintext` under `version` with a random nonce into `*out` (the whole envelope: header,
// ciphertext, tag). Returns the nonce and the ciphertext-and-tag part, for the memo.
struct Sealed {
  absl::Span<const uint8_t> nonce;
  absl::Span<const uint8_t> ciphertext_and_tag;
};
absl::StatusOr<Sealed> SealEnvelopeInto(const keys::ManagedKeyVersion& version,
                                        absl::Span<const uint8_t> associated_data,
                                        absl::Span<const uint8_t> plaintext, std::string* out) {
  const crypto::Aead& aead = *version.aead;
  const size_t nonce_size = crypto::AeadNonceSize(aead.algorithm());
  absl::Span<uint8_t> envelope = Resize(out, EnvelopeSize(nonce_size, plaintext.size()));
  uint8_t random[24];
  randombytes_buf(random, nonce_size);
  WriteEnvelopeHeader(version.version, absl::MakeConstSpan(random, nonce_size), envelope);
  const absl::Span<const uint8_t> nonce = envelope.subspan(kEnvelopeHeaderPrefix, nonce_size);
  absl::Span<uint8_t> ciphertext_and_tag = envelope.subspan(kEnvelopeHeaderPrefix + nonce_size);
  if (absl::Status s = aead.Seal(nonce, associated_data, plaintext, ciphertext_and_tag);
      !s.ok()) {
    out->clear();
    return s;
  }
  return Sealed{nonce, ciphertext_and_tag};
}
}  // namespace

absl::Status Operations::AeadSeal(const v1::AeadSealRequest& request,
                                  v1::AeadSealResponse* response) const {
  OFFLOAD_ASSIGN_OR_RETURN(KeyPtr key, FindKey(*keys_, request.key_id(), IsAeadType, "an AEAD type"));
  const keys::ManagedKeyVersion* version = key->Current();
  OFFLOAD_ASSIGN_OR_RETURN(const Sealed sealed,
                           SealEnvelopeInto(*version, Bytes(request.associated_data()),
                                            Bytes(request.plaintext()),
                                            response->mutable_envelope()));
  // Seal records what it produced, so that opening this envelope again costs no cipher run.
  memo_->OpenInsert(key->key_id,
                    memo_->OpenDigest(version->instance, sealed.nonce, sealed.ciphertext_and_tag,
                                      Bytes(request.associated_data())),
                    sealed.ciphertext_and_tag, Bytes(request.plaintext()));
  response->set_key_version(version->version);
  return absl::OkStatus();
}

absl::Status Operations::AeadRewrap(const v1::AeadRewrapRequest& request,
                                    v1::AeadRewrapResponse* response) const {
  OFFLOAD_RETURN_IF_ERROR(CheckEnvelopeShape(Bytes(request.envelope())));
  OFFLOAD_ASSIGN_OR_RETURN(KeyPtr key, FindKey(*keys_, request.key_id(), IsAeadType, "an AEAD type"));
  const keys::ManagedKeyVersion* current = key->Current();
  const size_t nonce_size = crypto::AeadNonceSize(current->aead->algorithm());
  OFFLOAD_ASSIGN_OR_RETURN(const EnvelopeView view,
                           ParseEnvelope(Bytes(request.envelope()), nonce_size));
  if (view.key_version == 0) {
    return absl::InvalidArgumentError("envelope: key version 0 does not exist");
  }
  OFFLOAD_ASSIGN_OR_RETURN(const keys::ManagedKeyVersion* old, FindVersion(*key, view.key_version));
  SecretBytes plaintext(view.plaintext_size());
  OFFLOAD_RETURN_IF_ERROR(old->aead->Open(view.nonce, Bytes(request.associated_data()),
                                          view.ciphertext_and_tag, absl::MakeSpan(plaintext)));
  if (absl::StatusOr<Sealed> sealed = SealEnvelopeInto(*current, Bytes(request.associated_data()),
                                                       plaintext, response->mutable_envelope());
      !sealed.ok()) {
    response->Clear();
    return sealed.status();
  }
  response->set_key_version(current->version);
  response->set_previous_key_version(old->version);
  return absl::OkStatus();
}

absl::Status Operations::AeadOpen(const v1::AeadOpenRequest& request,
                                  v1::AeadOpenResponse* response) const {
  OpenProbe probe;
  absl::Status status;
  if (AeadOpenFromMemo(request, response, &probe, &status)) return status;
  return AeadOpenFresh(request, probe, response);
}

bool Operations::AeadOpenFromMemo(const v1::AeadOpenRequest& request,
                                  v1::AeadOpenResponse* response, OpenProbe* probe,
                                  absl::Status* status) const {
  OpenResult result;
  if (!AeadOpenFromMemoShared(request, &result, probe, status)) return false;
  if (result.plaintext != nullptr) {
    response->set_plaintext(reinterpret_cast<const char*>(result.plaintext->data()),
                            result.plaintext->size());
    response->set_key_version(result.key_version);
    response->set_memo_hit(true);
  }
  return true;
}

bool Operations::AeadOpenFromMemoShared(const v1::AeadOpenRequest& request, OpenResult* result,
                                        OpenProbe* probe, absl::Status* status) const {
  return AeadOpenFromMemoShared(OpenRequestView{request.key_id(), request.envelope(),
                                                request.associated_data()},
                                result, probe, status);
}

bool Operations::AeadOpenFromMemoShared(const OpenRequestView& request, OpenResult* result,
                                        OpenProbe* probe, absl::Status* status) const {
  *status = [&]() -> absl::Status {
    // What the envelope shows alone is refused before the key is looked up (aead.proto).
    OFFLOAD_RETURN_IF_ERROR(CheckEnvelopeShape(Bytes(request.envelope)));
    OFFLOAD_ASSIGN_OR_RETURN(probe->key,
                             FindKey(*keys_, request.key_id, IsAeadType, "an AEAD type"));
    // Any version of one key has the same algorithm: the current one tells the nonce size.
    const size_t nonce_size = crypto::AeadNonceSize(probe->key->Current()->aead->algorithm());
    OFFLOAD_ASSIGN_OR_RETURN(probe->view, ParseEnvelope(Bytes(request.envelope), nonce_size));
    if (probe->view.key_version == 0) {
      return absl::InvalidArgumentError("envelope: key version 0 does not exist");
    }
    OFFLOAD_ASSIGN_OR_RETURN(probe->version, FindVersion(*probe->key, probe->view.key_version));
    return absl::OkStatus();
  }();
  if (!status->ok()) return true;
  probe->digest = memo_->OpenDigest(probe->version->instance, probe->view.nonce,
                                    probe->view.ciphertext_and_tag,
                                    Bytes(request.associated_data));
  if (!memo_->OpenLookup(probe->key->key_id, probe->digest, probe->view.ciphertext_and_tag,
                         &result->plaintext)) {
    return false;
  }
  result->key_version = probe->version->version;
  result->memo_hit = true;
  return true;
}

namespace {
// Decrypts `probe`'s envelope into a new buffer (no zero-fill: the cipher writes every byte).
absl::StatusOr<std::shared_ptr<memo::WipedBuffer>> OpenInto(const Operations::OpenProbe& probe,
                                                            absl::string_view aad) {
  std::shared_ptr<memo::WipedBuffer> plaintext =
      memo::WipedBuffer::Make(probe.view.plaintext_size());
  OFFLOAD_RETURN_IF_ERROR(probe.version->aead->Open(
      probe.view.nonce, Bytes(aad), probe.view.ciphertext_and_tag,
      absl::MakeSpan(plaintext->data(), plaintext->size())));
  return plaintext;
}
}  // namespace

absl::Status Operations::AeadOpenFresh(const v1::AeadOpenRequest& request, const OpenProbe& probe,
                                       v1::AeadOpenResponse* response) const {
  absl::StatusOr<std::shared_ptr<memo::WipedBuffer>> plaintext =
      OpenInto(probe, request.associated_data());
  if (!plaintext.ok()) {
    response->Clear();
    return plaintext.status();  // failed opens are never cached: the next try fails afresh
  }
  const absl::Span<const uint8_t> ct = probe.view.ciphertext_and_tag;
  response->set_plaintext(reinterpret_cast<const char*>((*plaintext)->data()),
                          (*plaintext)->size());
  memo_->OpenInsert(probe.key->key_id, probe.digest,
                    std::string(reinterpret_cast<const char*>(ct.data()), ct.size()), 0,
                    *std::move(plaintext));
  response->set_key_version(probe.version->version);
  response->set_memo_hit(false);
  return absl::OkStatus();
}

absl::Status Operations::AeadOpenFreshShared(v1::AeadOpenRequest* request,
                                             const OpenProbe& probe, OpenResult* result) const {
  const absl::Status s = AeadOpenFreshShared(
      OpenRequestView{request->key_id(), request->envelope(), request->associated_data()},
      request->mutable_envelope(), probe, result);
  if (s.ok()) request->clear_envelope();
  return s;
}

absl::Status Operations::AeadOpenFreshShared(const OpenRequestView& request, std::string* owner,
                                             const OpenProbe& probe, OpenResult* result) const {
  absl::StatusOr<std::shared_ptr<memo::WipedBuffer>> plaintext =
      OpenInto(probe, request.associated_data);
  if (!plaintext.ok()) return plaintext.status();  // never cached: the next try fails afresh
  result->plaintext = *plaintext;
  result->key_version = probe.version->version;
  result->memo_hit = false;
  // The buffer that holds the envelope moves into the entry as its stored copy, cut after the
  // ciphertext and tag: no ciphertext copy. The memo charges the bytes it keeps, so a buffer
  // with much room to spare (a body that grew as it arrived) is first copied to a tight one.
  const auto* base = reinterpret_cast<const uint8_t*>(owner->data());
  const size_t offset = static_cast<size_t>(probe.view.ciphertext_and_tag.data() - base);
  const size_t end = offset + probe.view.ciphertext_and_tag.size();
  owner->resize(end);
  if (owner->capacity() - end > end / 4 + 4096) owner->shrink_to_fit();
  memo_->OpenInsert(probe.key->key_id, probe.digest, std::move(*owner), offset,
                    *std::move(plaintext));
  owner->clear();
  return absl::OkStatus();
}

namespace {
size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}
}  // namespace

size_t Operations::OpenResult::WirePrefix(uint8_t out[kMaxWirePrefix]) const {
  const size_t size = plaintext == nullptr ? 0 : plaintext->size();
  if (size == 0) return 0;  // proto3 omits an empty bytes field
  out[0] = 0x0a;            // field 1 (plaintext), length-delimited
  return 1 + PutVarint(static_cast<uint32_t>(size), out + 1);
}

size_t Operations::OpenResult::WireSuffix(uint8_t out[kMaxWireSuffix]) const {
  size_t n = 0;
  if (key_version != 0) {
    out[n++] = 0x10;  // field 2 (key_version), varint
    n += PutVarint(key_version, out + n);
  }
  if (memo_hit) {
    out[n++] = 0x18;  // field 3 (memo_hit), varint
    out[n++] = 1;
  }
  return n;
}

absl::Status Operations::CheckBatchSize(int items) const {
  if (items == 0) return absl::InvalidArgumentError("items: the batch is empty");
  if (items > options_.max_batch_items) {
    return absl::InvalidArgumentError(absl::StrCat("items: expected at most ",
                                                   options_.max_batch_items, " items, got ",
                                                   items));
  }
  return absl::OkStatus();
}

template <typename ItemFn>
void Operations::RunBatch(int n, ItemFn item, Done done, Alive alive) const {
  // One worker starts the batch alone and claims items from a shared index. After each of its
  // first items it estimates, at its own pace, what is left; once that exceeds kSplitAfter it
  // calls in the other workers, which claim from the same index. A batch of memo hits (~0.6 us
  // an item) so finishes on one worker after one wake-up, and fresh work spreads over every core
  // after its first item.
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kSplitAfter{50};
  struct State {
    explicit State(int n) : n(n) {}
    const int n;
    std::atomic<int> next{0};      // the first unclaimed item
    std::atomic<int> finished{0};  // items run or skipped, over every claim
    std::atomic<bool> expired{false};
    Done done;
    Alive alive;

    // Runs items [begin, end), or skips them once the call is gone (asked when `ask`); the
    // claim that completes the batch calls `done`.
    void Run(const ItemFn& item, int begin, int end, bool ask = true) {
      if (expired.load(std::memory_order_relaxed) || (ask && alive && !alive())) {
        expired.store(true, std::memory_order_relaxed);  // the rest is skipped too
      } else {
        for (int i = begin; i < end; ++i) item(i);
      }
      const int count = end - begin;
      if (finished.fetch_add(count, std::memory_order_acq_rel) + count == n) {
        std::move(done)(expired.load() ? absl::DeadlineExceededError(
                                             "deadline passed or call cancelled while queued")
                                       : absl::OkStatus());
      }
    }
    // Claims and runs `stride` items at a time until none is left.
    void Drain(const ItemFn& item, int stride) {
      for (int begin = next.fetch_add(stride); begin < n; begin = next.fetch_add(stride)) {
        Run(item, begin, std::min(n, begin + stride));
      }
    }
  };
  auto state = std::make_shared<State>(n);
  state->done = std::move(done);
  state->alive = std::move(alive);
  const int helpers = std::min(n, pool_->size()) - 1;
  // Once split, items are claimed a few at a time: fewer atomic operations on a shared line.
  const int stride = std::clamp(n / (8 * pool_->size()), 1, 16);
  WorkerPool* pool = pool_;
  pool_->Submit([state, item, helpers, stride, pool] {
    const Clock::time_point start = Clock::now();
    for (int ran = 0; helpers > 0;) {
      const int i = state->next.fetch_add(1);
      if (i >= state->n) return;
      state->Run(item, i, i + 1, /*ask=*/i % stride == 0);
      ++ran;
      const int left = state->n - state->next.load(std::memory_order_relaxed);
      if (left <= 0) return;
      const auto elapsed = Clock::now() - start;
      // Two items make a pace, unless the first alone took long (fresh crypto).
      if ((ran >= 2 || elapsed > kSplitAfter / 2) && elapsed / ran * left > kSplitAfter) {
        // Only workers with nothing to do are called in: when every worker is busy, a helper
        // would find the batch done by the time it ran, and cost a queue round trip (and a
        // wake-up) for nothing; splitting buys wall-clock time, never CPU.
        const int idle = pool->size() - pool->busy();
        for (int h = 0; h < std::min(helpers, idle); ++h) {
          pool->Submit([state, item, stride] { state->Drain(item, stride); });
        }
        break;
      }
    }
    state->Drain(item, stride);
  });
}

template <typename BatchRequest, typename BatchResponse, typename Request, typename Response>
void Operations::BatchOf(const BatchRequest& request, BatchResponse* response,
                         absl::Status (Operations::*single)(const Request&, Response*) const,
                         Done done, Alive alive) const {
  absl::Status size_ok = CheckBatchSize(request.items_size());
  if (!size_ok.ok()) return std::move(done)(size_ok);
  for (int i = 0; i < request.items_size(); ++i) response->add_results();
  RunBatch(
      request.items_size(),
      [this, &request, response, single](int i) {
        auto* result = response->mutable_results(i);
        absl::Status s = (this->*single)(request.items(i), result->mutable_response());
        if (!s.ok()) ClearFailedResponse(result);
        SetItemStatus(s, result->mutable_status());
      },
      std::move(done), std::move(alive));
}

void Operations::BatchSign(const v1::BatchSignRequest& request, v1::BatchSignResponse* response,
                           Done done, Alive alive) const {
  BatchOf(request, response, &Operations::Sign, std::move(done), std::move(alive));
}
void Operations::BatchDerive(const v1::BatchDeriveRequest& request,
                             v1::BatchDeriveResponse* response, Done done, Alive alive) const {
  BatchDeriveProbe probe;
  absl::Status status;
  if (BatchDeriveFromMemo(request, response, &probe, &status)) return std::move(done)(status);
  BatchDeriveFresh(request, probe, response, std::move(done), std::move(alive));
}

bool Operations::BatchDeriveFromMemo(const v1::BatchDeriveRequest& request,
                                     v1::BatchDeriveResponse* response, BatchDeriveProbe* probe,
                                     absl::Status* status) const {
  *status = CheckBatchSize(request.items_size());
  if (!status->ok()) return true;
  const int n = request.items_size();
  for (int i = 0; i < n; ++i) response->add_results();
  const int limit = std::min(n, kMaxInlineVerifyItems);
  for (int i = 0; i < limit; ++i) {
    auto* result = response->mutable_results(i);
    absl::Status item_status;
    if (!DeriveFromMemo(request.items(i), result->mutable_response(), &probe->probe,
                        &item_status)) {
      probe->next = i;
      probe->have_probe = true;
      return false;
    }
    if (!item_status.ok()) ClearFailedResponse(result);
    SetItemStatus(item_status, result->mutable_status());
  }
  probe->next = limit;
  probe->have_probe = false;
  return limit == n;
}

void Operations::BatchDeriveFresh(const v1::BatchDeriveRequest& request,
                                  const BatchDeriveProbe& probe,
                                  v1::BatchDeriveResponse* response, Done done,
                                  Alive alive) const {
  const int first = probe.next;
  auto first_probe =
      probe.have_probe ? std::make_shared<const DeriveProbe>(probe.probe) : nullptr;
  RunBatch(
      request.items_size() - first,
      [this, &request, response, first, first_probe](int j) {
        const int i = first + j;
        auto* result = response->mutable_results(i);
        // The first item was looked up already (one memo lookup per item): only its X25519 is left.
        v1::DeriveResponse* out = result->mutable_response();
        absl::Status s = (j == 0 && first_probe != nullptr)
                             ? DeriveFresh(request.items(i), *first_probe, out)
                             : Derive(request.items(i), out);
        if (!s.ok()) ClearFailedResponse(result);
        SetItemStatus(s, result->mutable_status());
      },
      std::move(done), std::move(alive));
}
void Operations::BatchBoxSeal(const v1::BatchBoxSealRequest& request,
                              v1::BatchBoxSealResponse* response, Done done, Alive alive) const {
  BatchOf(request, response, &Operations::BoxSeal, std::move(done), std::move(alive));
}
void Operations::BatchBoxOpen(const v1::BatchBoxOpenRequest& request,
                              v1::BatchBoxOpenResponse* response, Done done, Alive alive) const {
  BatchOf(request, response, &Operations::BoxOpen, std::move(done), std::move(alive));
}
void Operations::BatchAeadSeal(const v1::BatchAeadSealRequest& request,
                               v1::BatchAeadSealResponse* response, Done done, Alive alive) const {
  BatchOf(request, response, &Operations::AeadSeal, std::move(done), std::move(alive));
}
void Operations::BatchAeadOpen(const v1::BatchAeadOpenRequest& request,
                               v1::BatchAeadOpenResponse* response, Done done, Alive alive) const {
  BatchOf(request, response, &Operations::AeadOpen, std::move(done), std::move(alive));
}
void Operations::BatchAeadRewrap(const v1::BatchAeadRewrapRequest& request,
                                 v1::BatchAeadRewrapResponse* response, Done done,
                                 Alive alive) const {
  BatchOf(request, response, &Operations::AeadRewrap, std::move(done), std::move(alive));
}

void Operations::BatchVerify(const v1::BatchVerifyRequest& request,
                             v1::BatchVerifyResponse* response, Done done, Alive alive) const {
  BatchVerifyProbe probe;
  absl::Status status;
  if (BatchVerifyFromMemo(request, response, &probe, &status)) return std::move(done)(status);
  BatchVerifyFresh(request, probe, response, std::move(done), std::move(alive));
}

namespace {
void SetVerifyResult(const absl::Status& status, const v1::VerifyResponse& single,
                     v1::BatchVerifyResult* result) {
  result->set_valid(single.valid());
  result->set_memo_hit(single.memo_hit());
  SetItemStatus(status, result->mutable_status());
}
}  // namespace

bool Operations::BatchVerifyFromMemo(const v1::BatchVerifyRequest& request,
                                     v1::BatchVerifyResponse* response, BatchVerifyProbe* probe,
                                     absl::Status* status) const {
  *status = CheckBatchSize(request.items_size());
  if (!status->ok()) return true;
  const int n = request.items_size();
  for (int i = 0; i < n; ++i) response->add_results();
  const int limit = std::min(n, kMaxInlineVerifyItems);
  for (int i = 0; i < limit; ++i) {
    v1::VerifyResponse single;
    absl::Status item_status;
    if (!VerifyFromMemo(request.items(i), &single, &probe->digest, &item_status)) {
      probe->next = i;
      probe->have_digest = true;
      return false;
    }
    SetVerifyResult(item_status, single, response->mutable_results(i));
  }
  probe->next = limit;
  probe->have_digest = false;
  return limit == n;
}

void Operations::BatchVerifyFresh(const v1::BatchVerifyRequest& request,
                                  const BatchVerifyProbe& probe,
                                  v1::BatchVerifyResponse* response, Done done,
                                  Alive alive) const {
  const int first = probe.next;
  const bool have_digest = probe.have_digest;
  const memo::Digest digest = probe.digest;
  RunBatch(
      request.items_size() - first,
      [this, &request, response, first, have_digest, digest](int j) {
        const int i = first + j;
        v1::VerifyResponse single;
        // The first item was looked up already (one memo lookup per item): only its check is left.
        absl::Status s = (j == 0 && have_digest) ? VerifyFresh(request.items(i), digest, &single)
                                                 : Verify(request.items(i), &single);
        SetVerifyResult(s, single, response->mutable_results(i));
      },
      std::move(done), std::move(alive));
}

}  // namespace offload::ops
