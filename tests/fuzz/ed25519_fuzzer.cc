// Ed25519Service request handling: input = selector byte, then a serialised request (Sign,
// Verify, BatchSign, BatchVerify) or, for selector 4, raw public key (32) || signature (64) ||
// message. Every request runs through the same Operations the gRPC and HTTP handlers call, on
// two worlds with the same keys: one all-libsodium, one all-OpenSSL.
// Invariants: only documented codes; both backends give the same code, validity and signature
// (one verification policy); a repeated verify (memo hit or not) and the gRPC handler's
// VerifyFromMemo + VerifyFresh split answer as Verify; an invalid result is never a memo hit;
// what Sign returns verifies; a batch has one result per item, each as the single call's.
#include <cstddef>
#include <cstdint>

#include "offload/v1/ed25519.pb.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

bool SizesOk(const v1::VerifyRequest& q) {
  return q.public_key().size() == 32 && q.signature().size() == 64;
}

// Verify on both worlds, twice on the first (the second may be a memo hit), and through the gRPC
// handler's two-step path. Returns the common answer (`valid` false on INVALID_ARGUMENT).
bool CheckVerify(const v1::VerifyRequest& q) {
  v1::VerifyResponse a, b, again;
  const absl::Status sa = SodiumWorld()->ops->Verify(q, &a);
  const absl::Status sb = OpenSslWorld()->ops->Verify(q, &b);
  FUZZ_CHECK(IsOneOf(sa.code(), {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument}),
             sa.ToString());
  FUZZ_CHECK(sa.code() == sb.code(), sa.ToString(), " vs ", sb.ToString());
  FUZZ_CHECK(sa.ok() == SizesOk(q), sa.ToString());
  FUZZ_CHECK(a.valid() == b.valid(), "libsodium says ", a.valid(), ", OpenSSL says ", b.valid());
  FUZZ_CHECK(a.valid() || !a.memo_hit(), "an invalid signature came from the memo");
  const absl::Status s2 = SodiumWorld()->ops->Verify(q, &again);
  FUZZ_CHECK(s2.code() == sa.code() && again.valid() == a.valid(), "repeat: ", again.valid());
  FUZZ_CHECK(!sa.ok() || again.memo_hit() == again.valid(), "memo_hit ", again.memo_hit());

  // The gateway's path for a unary Verify (memo first, then the fresh check).
  v1::VerifyResponse split;
  memo::Digest digest;
  absl::Status status;
  if (!OpenSslWorld()->ops->VerifyFromMemo(q, &split, &digest, &status)) {
    status = OpenSslWorld()->ops->VerifyFresh(q, digest, &split);
  }
  FUZZ_CHECK(status.code() == sa.code() && split.valid() == a.valid(), "split path: ",
             status.ToString(), " valid ", split.valid());
  return a.valid();
}

void CheckSign(const v1::SignRequest& q, const absl::Status& sa, const v1::SignResponse& a) {
  v1::SignResponse b;
  const absl::Status sb = OpenSslWorld()->ops->Sign(q, &b);
  FUZZ_CHECK(IsOneOf(sa.code(), kOperationCodes), sa.ToString());
  FUZZ_CHECK(sa.code() == sb.code(), sa.ToString(), " vs ", sb.ToString());
  if (!sa.ok()) return;
  FUZZ_CHECK(a.signature().size() == 64 && a.public_key().size() == 32, a.signature().size());
  FUZZ_CHECK(a.signature() == b.signature() && a.public_key() == b.public_key(),
             "backends sign differently");
  FUZZ_CHECK(a.key_version() == 1, a.key_version());
  v1::VerifyRequest verify;
  verify.set_public_key(a.public_key());
  verify.set_message(q.message());
  verify.set_signature(a.signature());
  FUZZ_CHECK(CheckVerify(verify), "a signature made by Sign does not verify");
}

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  Input in(data, size);
  const uint8_t selector = in.Byte() % 5;
  const absl::string_view rest = in.Rest();
  switch (selector) {
    case 0: {
      v1::SignRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::SignResponse a;
      const absl::Status sa = SodiumWorld()->ops->Sign(q, &a);
      CheckSign(q, sa, a);
      break;
    }
    case 1: {
      v1::VerifyRequest q;
      if (!ParseRest(in, &q)) return -1;
      CheckVerify(q);
      break;
    }
    case 2: {
      v1::BatchSignRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchSignResponse r;
      const absl::Status s = WaitForBatch(
          [&](ops::Operations::Done done) { SodiumWorld()->ops->BatchSign(q, &r, std::move(done)); });
      FUZZ_CHECK(IsOneOf(s.code(), kBatchCallCodes), s.ToString());
      const int n = q.items_size();
      FUZZ_CHECK(s.ok() == (n > 0 && n <= SodiumWorld()->ops->options().max_batch_items), n);
      if (!s.ok()) break;
      FUZZ_CHECK(r.results_size() == n, r.results_size(), " results for ", n, " items");
      for (int i = 0; i < n; ++i) {
        const auto& result = r.results(i);
        CheckSign(q.items(i), ItemStatus(result), result.response());
      }
      break;
    }
    case 3: {
      v1::BatchVerifyRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchVerifyResponse r;
      const absl::Status s = WaitForBatch(
          [&](ops::Operations::Done done) { OpenSslWorld()->ops->BatchVerify(q, &r, std::move(done)); });
      FUZZ_CHECK(IsOneOf(s.code(), kBatchCallCodes), s.ToString());
      const int n = q.items_size();
      FUZZ_CHECK(s.ok() == (n > 0 && n <= OpenSslWorld()->ops->options().max_batch_items), n);
      if (!s.ok()) break;
      FUZZ_CHECK(r.results_size() == n, r.results_size(), " results for ", n, " items");
      for (int i = 0; i < n; ++i) {
        const auto& result = r.results(i);
        const bool sizes_ok = SizesOk(q.items(i));
        FUZZ_CHECK(result.status().code() == (sizes_ok ? 0 : 3), result.status().code());
        FUZZ_CHECK(result.valid() == CheckVerify(q.items(i)), "batch item ", i, " differs");
      }
      break;
    }
    case 4: {
      // Raw fields, so that mutations reach the curve code without protobuf framing.
      v1::VerifyRequest q;
      q.set_public_key(std::string(rest.substr(0, 32)));
      q.set_signature(std::string(rest.substr(std::min<size_t>(32, rest.size()), 64)));
      q.set_message(std::string(rest.substr(std::min<size_t>(96, rest.size()))));
      CheckVerify(q);
      break;
    }
  }
  return 0;
}
