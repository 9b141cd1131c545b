// The AEAD envelope of the offload.v1 API (see proto/offload/v1/aead.proto):
//   0x01 | key version (u32 big-endian) | nonce (12 or 24 bytes) | ciphertext | tag (16 bytes)
//
//   auto view = ParseEnvelope(bytes, /*nonce_size=*/24);   // one length check, then offsets
//   if (view.ok()) aead->Open(view->nonce, aad, view->ciphertext_and_tag, out);
//
// Parsing never copies and never allocates: the view points into the caller's bytes, which must
// outlive it. A malformed envelope costs the same few comparisons whatever its size.
#ifndef SERVICE_OPS_ENVELOPE_H_
#define SERVICE_OPS_ENVELOPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace offload::ops {

inline constexpr uint8_t kEnvelopeFormatVersion = 0x01;
inline constexpr size_t kEnvelopeHeaderPrefix = 5;  // format version + key version
inline constexpr size_t kEnvelopeTagSize = 16;

struct EnvelopeView {
  uint32_t key_version = 0;
  absl::Span<const uint8_t> nonce;
  absl::Span<const uint8_t> ciphertext_and_tag;  // at least 16 bytes
  size_t plaintext_size() const { return ciphertext_and_tag.size() - kEnvelopeTagSize; }
};

// The shortest envelope of any algorithm: a 12-byte nonce, an empty plaintext.
inline constexpr size_t kEnvelopeMinSize = kEnvelopeHeaderPrefix + 12 + kEnvelopeTagSize;

// What can be told of `envelope` before its key is known (aead.proto: sizes are checked before
// anything else): InvalidArgument("envelope: ...") when it is shorter than any algorithm's
// (kEnvelopeMinSize) or of an unknown format version. Which key version it names is the key's
// business (an unknown key id is NOT_FOUND, whatever version its envelope names).
absl::Status CheckEnvelopeShape(absl::Span<const uint8_t> envelope);

// InvalidArgument("envelope: ...") for a short envelope or an unknown format version.
absl::StatusOr<EnvelopeView> ParseEnvelope(absl::Span<const uint8_t> envelope, size_t nonce_size);

// The envelope's total size for a plaintext of `plaintext_size` bytes.
inline size_t EnvelopeSize(size_t nonce_size, size_t plaintext_size) {
  return kEnvelopeHeaderPrefix + nonce_size + plaintext_size + kEnvelopeTagSize;
}

// Writes the header (format version, `key_version`, `nonce`) into the first
// kEnvelopeHeaderPrefix + nonce.size() bytes of `out`.
// REQUIRES: `out.size() >= kEnvelopeHeaderPrefix + nonce.size()`.
void WriteEnvelopeHeader(uint32_t key_version, absl::Span<const uint8_t> nonce,
                         absl::Span<uint8_t> out);

}  // namespace offload::ops

#endif  // SERVICE_OPS_ENVELOPE_H_
