// AeadService request handling: input = selector byte, then a serialised AeadSealRequest,
// AeadOpenRequest, BatchAeadSealRequest or BatchAeadOpenRequest, or (selector 4) key choice
// byte, associated-data length byte, associated data, raw envelope. Requests run through
// Operations on two worlds with the same keys (all-libsodium and all-OpenSSL).
// Invariants: only documented codes; both backends agree on codes and plaintexts; a sealed
// envelope has the documented layout (0x01, current key version, nonce, ciphertext, tag), opens
// to the plaintext on both backends (the other world decrypts afresh, this one from the memo),
// and fails with one flipped byte or other associated data; a repeated open gives the same
// answer; batch results match single calls.
#include <cstddef>
#include <cstdint>

#include "offload/v1/aead.pb.h"
#include "service/ops/envelope.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

absl::Status CheckOpen(const v1::AeadOpenRequest& q, v1::AeadOpenResponse* a) {
  v1::AeadOpenResponse b, again;
  const absl::Status sa = SodiumWorld()->ops->AeadOpen(q, a);
  const absl::Status sb = OpenSslWorld()->ops->AeadOpen(q, &b);
  const absl::Status s2 = SodiumWorld()->ops->AeadOpen(q, &again);
  FUZZ_CHECK(IsOneOf(sa.code(), kOperationCodes), sa.ToString());
  FUZZ_CHECK(sa.code() == sb.code() && sa.code() == s2.code(), sa.ToString(), " vs ",
             sb.ToString(), " vs ", s2.ToString());
  if (sa.ok()) {
    FUZZ_CHECK(a->plaintext() == b.plaintext(), "backends open differently");
    FUZZ_CHECK(a->plaintext() == again.plaintext(), "memo changed the answer");
    FUZZ_CHECK(a->key_version() == b.key_version(), a->key_version(), " vs ", b.key_version());
  } else {
    FUZZ_CHECK(a->plaintext().empty(), "a failed open returned plaintext");
  }
  return sa;
}

void CheckSeal(const v1::AeadSealRequest& q, const absl::Status& sa,
               const v1::AeadSealResponse& a) {
  FUZZ_CHECK(IsOneOf(sa.code(), kOperationCodes), sa.ToString());
  v1::AeadSealResponse b;
  const absl::Status sb = OpenSslWorld()->ops->AeadSeal(q, &b);
  FUZZ_CHECK(sa.code() == sb.code(), sa.ToString(), " vs ", sb.ToString());
  if (!sa.ok()) return;
  const std::string& e = a.envelope();
  const size_t nonce = q.key_id() == kXchachaKey ? 24 : 12;
  FUZZ_CHECK(e.size() == ops::EnvelopeSize(nonce, q.plaintext().size()), e.size());
  FUZZ_CHECK(static_cast<uint8_t>(e[0]) == ops::kEnvelopeFormatVersion, int{e[0]});
  const uint32_t version = (uint32_t{static_cast<uint8_t>(e[1])} << 24) |
                           (uint32_t{static_cast<uint8_t>(e[2])} << 16) |
                           (uint32_t{static_cast<uint8_t>(e[3])} << 8) | static_cast<uint8_t>(e[4]);
  const uint32_t current = q.key_id() == kAeadRotated ? 2 : 1;
  FUZZ_CHECK(version == current && a.key_version() == current, version);
  v1::AeadOpenRequest open;
  open.set_key_id(q.key_id());
  open.set_associated_data(q.associated_data());
  // Each world's envelope opens on both (one from its memo, the other afresh).
  for (const std::string* envelope : {&a.envelope(), &b.envelope()}) {
    open.set_envelope(*envelope);
    v1::AeadOpenResponse opened;
    const absl::Status so = CheckOpen(open, &opened);
    FUZZ_CHECK(so.ok(), "sealed envelope does not open: ", so.ToString());
    FUZZ_CHECK(opened.plaintext() == q.plaintext(), "opened to another plaintext");
  }
  std::string tampered = a.envelope();
  tampered[5 + nonce + (tampered.size() - 5 - nonce) / 2] ^= 0x20;
  open.set_envelope(tampered);
  v1::AeadOpenResponse failed;
  absl::Status st = CheckOpen(open, &failed);
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument, "tampered envelope: ", st.ToString());
  open.set_envelope(a.envelope());
  open.set_associated_data(q.associated_data() + "x");
  st = CheckOpen(open, &failed);
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument, "other aad: ", st.ToString());
}

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  Input in(data, size);
  const uint8_t selector = in.Byte() % 5;
  const int max_items = SodiumWorld()->ops->options().max_batch_items;
  switch (selector) {
    case 0: {
      v1::AeadSealRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::AeadSealResponse a;
      CheckSeal(q, SodiumWorld()->ops->AeadSeal(q, &a), a);
      break;
    }
    case 1: {
      v1::AeadOpenRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::AeadOpenResponse a;
      CheckOpen(q, &a);
      break;
    }
    case 2: {
      v1::BatchAeadSealRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchAeadSealResponse r;
      const absl::Status s = WaitForBatch([&](ops::Operations::Done done) {
        SodiumWorld()->ops->BatchAeadSeal(q, &r, std::move(done));
      });
      FUZZ_CHECK(IsOneOf(s.code(), kBatchCallCodes), s.ToString());
      const int n = q.items_size();
      FUZZ_CHECK(s.ok() == (n > 0 && n <= max_items), n);
      if (!s.ok()) break;
      FUZZ_CHECK(r.results_size() == n, r.results_size(), " results for ", n, " items");
      for (int i = 0; i < n; ++i) {
        CheckSeal(q.items(i), ItemStatus(r.results(i)), r.results(i).response());
      }
      break;
    }
    case 3: {
      v1::BatchAeadOpenRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchAeadOpenResponse r;
      const absl::Status s = WaitForBatch(
          [&](ops::Operations::Done done) { OpenSslWorld()->ops->BatchAeadOpen(q, &r, std::move(done)); });
      FUZZ_CHECK(IsOneOf(s.code(), kBatchCallCodes), s.ToString());
      const int n = q.items_size();
      FUZZ_CHECK(s.ok() == (n > 0 && n <= max_items), n);
      if (!s.ok()) break;
      FUZZ_CHECK(r.results_size() == n, r.results_size(), " results for ", n, " items");
      for (int i = 0; i < n; ++i) {
        v1::AeadOpenResponse single;
        const absl::Status ss = CheckOpen(q.items(i), &single);
        FUZZ_CHECK(ItemStatus(r.results(i)).code() == ss.code(), "batch item ", i, ": ",
                   ItemStatus(r.results(i)).ToString(), " vs ", ss.ToString());
        FUZZ_CHECK(r.results(i).response().plaintext() == single.plaintext(), "batch item ", i);
      }
      break;
    }
    case 4: {
      v1::AeadOpenRequest q;
      q.set_key_id(kKeyIdChoices[in.Byte() % kKeyIdChoiceCount]);
      const size_t aad_size = in.Byte() % 32;
      const absl::string_view rest = in.Rest();
      q.set_associated_data(std::string(rest.substr(0, aad_size)));
      q.set_envelope(std::string(rest.substr(std::min(aad_size, rest.size()))));
      v1::AeadOpenResponse a;
      CheckOpen(q, &a);
      break;
    }
  }
  return 0;
}
