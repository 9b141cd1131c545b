#include "service/ops/envelope.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace offload::ops {

absl::Status CheckEnvelopeShape(absl::Span<const uint8_t> envelope) {
  if (envelope.size() < kEnvelopeMinSize) {
    return absl::InvalidArgumentError(absl::StrCat("envelope: expected at least ",
                                                   kEnvelopeMinSize, " bytes, got ",
                                                   envelope.size()));
  }
  if (envelope[0] != kEnvelopeFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("envelope: unknown format version ",
                                                   envelope[0], ", expected ",
                                                   kEnvelopeFormatVersion));
  }
  return absl::OkStatus();
}

absl::StatusOr<EnvelopeView> ParseEnvelope(absl::Span<const uint8_t> envelope, size_t nonce_size) {
  const size_t minimum = kEnvelopeHeaderPrefix + nonce_size + kEnvelopeTagSize;
  if (envelope.size() < minimum) {
    return absl::InvalidArgumentError(absl::StrCat("envelope: expected at least ", minimum,
                                                   " bytes, got ", envelope.size()));
  }
  if (absl::Status shape = CheckEnvelopeShape(envelope); !shape.ok()) return shape;  // the format
  EnvelopeView view;
  view.key_version = (uint32_t{envelope[1]} << 24) | (uint32_t{envelope[2]} << 16) |
                     (uint32_t{envelope[3]} << 8) | uint32_t{envelope[4]};
  view.nonce = envelope.subspan(kEnvelopeHeaderPrefix, nonce_size);
  view.ciphertext_and_tag = envelope.subspan(kEnvelopeHeaderPrefix + nonce_size);
  return view;
}

void WriteEnvelopeHeader(uint32_t key_version, absl::Span<const uint8_t> nonce,
                         absl::Span<uint8_t> out) {
  out[0] = kEnvelopeFormatVersion;
  out[1] = static_cast<uint8_t>(key_version >> 24);
  out[2] = static_cast<uint8_t>(key_version >> 16);
  out[3] = static_cast<uint8_t>(key_version >> 8);
  out[4] = static_cast<uint8_t>(key_version);
  std::memcpy(out.data() + kEnvelopeHeaderPrefix, nonce.data(), nonce.size());
}

}  // namespace offload::ops
