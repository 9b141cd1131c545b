// X25519Service request handling: input = selector byte, then a serialised DeriveRequest or
// BatchDeriveRequest, or (selector 2) key choice byte, output byte, raw 32-byte peer key.
// Each request runs through Operations on two worlds with the same keys (all-libsodium and
// all-OpenSSL). Invariants: only documented codes; same code and shared key on both backends;
// a repeated derive (memo hit) gives the same key; a shared key is 32 bytes and never all zero
// unless the key allows it (allow_zero_shared_secret); batch results match single calls.
#include <cstddef>
#include <cstdint>

#include "offload/v1/x25519.pb.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

bool AllZero(const std::string& s) {
  for (char c : s) {
    if (c != 0) return false;
  }
  return true;
}

// Checks one derive whose result on the libsodium world was (`sa`, `a`).
void CheckDerive(const v1::DeriveRequest& q, const absl::Status& sa, const v1::DeriveResponse& a) {
  FUZZ_CHECK(IsOneOf(sa.code(), kOperationCodes), sa.ToString());
  v1::DeriveResponse b, again;
  const absl::Status sb = OpenSslWorld()->ops->Derive(q, &b);
  FUZZ_CHECK(sa.code() == sb.code(), sa.ToString(), " vs ", sb.ToString());
  const absl::Status s2 = SodiumWorld()->ops->Derive(q, &again);
  FUZZ_CHECK(s2.code() == sa.code(), "repeat: ", s2.ToString(), " vs ", sa.ToString());
  if (q.peer_public_key().size() != 32) {
    FUZZ_CHECK(sa.code() == absl::StatusCode::kInvalidArgument, sa.ToString());
  }
  if (!sa.ok()) return;
  FUZZ_CHECK(a.shared_key().size() == 32, a.shared_key().size());
  FUZZ_CHECK(a.shared_key() == b.shared_key(), "backends derive different keys");
  FUZZ_CHECK(again.shared_key() == a.shared_key(), "memo changed the answer");
  FUZZ_CHECK(a.key_version() == 1, a.key_version());
  if (q.key_id() != kX25519CompatKey && q.output() == v1::DERIVE_OUTPUT_RAW) {
    FUZZ_CHECK(!AllZero(a.shared_key()), "all-zero shared secret for a key that refuses it");
  }
}

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  Input in(data, size);
  const uint8_t selector = in.Byte() % 3;
  switch (selector) {
    case 0: {
      v1::DeriveRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::DeriveResponse a;
      const absl::Status sa = SodiumWorld()->ops->Derive(q, &a);
      CheckDerive(q, sa, a);
      break;
    }
    case 1: {
      v1::BatchDeriveRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchDeriveResponse r;
      const absl::Status s = WaitForBatch(
          [&](ops::Operations::Done done) { SodiumWorld()->ops->BatchDerive(q, &r, std::move(done)); });
      FUZZ_CHECK(IsOneOf(s.code(), kBatchCallCodes), s.ToString());
      const int n = q.items_size();
      FUZZ_CHECK(s.ok() == (n > 0 && n <= SodiumWorld()->ops->options().max_batch_items), n);
      if (!s.ok()) break;
      FUZZ_CHECK(r.results_size() == n, r.results_size(), " results for ", n, " items");
      for (int i = 0; i < n; ++i) {
        const auto& result = r.results(i);
        CheckDerive(q.items(i), ItemStatus(result), result.response());
      }
      break;
    }
    case 2: {
      v1::DeriveRequest q;
      q.set_key_id(kKeyIdChoices[in.Byte() % kKeyIdChoiceCount]);
      q.set_output(static_cast<v1::DeriveOutput>(in.Byte() % 4));
      q.set_key_version(in.Byte() % 3);
      q.set_peer_public_key(std::string(in.Rest()));
      v1::DeriveResponse a;
      const absl::Status sa = SodiumWorld()->ops->Derive(q, &a);
      CheckDerive(q, sa, a);
      break;
    }
  }
  return 0;
}
