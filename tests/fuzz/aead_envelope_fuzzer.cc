// The AEAD envelope parser (service/ops/envelope.h): input = nonce-size selector byte (12 or 24),
// then the envelope bytes. Invariants: it is accepted exactly when it has the documented layout
// (format byte 0x01 and at least 5 + nonce + 16 bytes); the view points into the input at the
// documented offsets (key version big-endian at 1..4, nonce, then ciphertext and tag to the end);
// EnvelopeSize and WriteEnvelopeHeader give back the same bytes; errors are INVALID_ARGUMENT.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "service/ops/envelope.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  if (size == 0) return -1;
  const size_t nonce_size = (data[0] & 1) ? 24 : 12;
  const absl::Span<const uint8_t> envelope(data + 1, size - 1);
  const absl::StatusOr<ops::EnvelopeView> view = ops::ParseEnvelope(envelope, nonce_size);
  const bool well_formed =
      envelope.size() >= ops::kEnvelopeHeaderPrefix + nonce_size + ops::kEnvelopeTagSize &&
      envelope[0] == ops::kEnvelopeFormatVersion;
  FUZZ_CHECK(view.ok() == well_formed, view.status().ToString(), " for ", envelope.size(),
             " bytes");
  if (!view.ok()) {
    FUZZ_CHECK(view.status().code() == absl::StatusCode::kInvalidArgument,
               view.status().ToString());
    return 0;
  }
  const uint32_t version = (uint32_t{envelope[1]} << 24) | (uint32_t{envelope[2]} << 16) |
                           (uint32_t{envelope[3]} << 8) | envelope[4];
  FUZZ_CHECK(view->key_version == version, view->key_version, " vs ", version);
  FUZZ_CHECK(view->nonce.data() == envelope.data() + 5 && view->nonce.size() == nonce_size,
             "nonce at the wrong place");
  FUZZ_CHECK(view->ciphertext_and_tag.data() == envelope.data() + 5 + nonce_size &&
                 view->ciphertext_and_tag.data() + view->ciphertext_and_tag.size() ==
                     envelope.data() + envelope.size(),
             "ciphertext at the wrong place");
  FUZZ_CHECK(ops::EnvelopeSize(nonce_size, view->plaintext_size()) == envelope.size(),
             view->plaintext_size());
  std::vector<uint8_t> header(ops::kEnvelopeHeaderPrefix + nonce_size);
  ops::WriteEnvelopeHeader(view->key_version, view->nonce, absl::MakeSpan(header));
  FUZZ_CHECK(std::equal(header.begin(), header.end(), envelope.begin()), "header round trip");
  return 0;
}
