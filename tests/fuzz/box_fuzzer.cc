// BoxService request handling: input = selector byte, then a serialised BoxSealRequest,
// BoxOpenRequest, BatchBoxSealRequest or BatchBoxOpenRequest, or (selector 4) key choice byte,
// raw peer key (32) || nonce (24) || ciphertext, opened as is. Requests run through Operations on
// two worlds with the same keys (all-libsodium and all-OpenSSL).
// Invariants: only documented codes; both backends agree on codes and bytes (a seal with the
// caller's nonce is deterministic); what Seal returns opens to the plaintext on both backends, and
// fails once a byte of it is flipped; a repeated open (memo) gives the same plaintext; batch
// results match single calls.
#include <cstddef>
#include <cstdint>

#include "offload/v1/box.pb.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

// Opens `q` on both worlds (twice on one); returns the libsodium world's result.
absl::Status CheckOpen(const v1::BoxOpenRequest& q, v1::BoxOpenResponse* a) {
  v1::BoxOpenResponse b, again;
  const absl::Status sa = SodiumWorld()->ops->BoxOpen(q, a);
  const absl::Status sb = OpenSslWorld()->ops->BoxOpen(q, &b);
  const absl::Status s2 = SodiumWorld()->ops->BoxOpen(q, &again);
  FUZZ_CHECK(IsOneOf(sa.code(), kOperationCodes), sa.ToString());
  FUZZ_CHECK(sa.code() == sb.code() && sa.code() == s2.code(), sa.ToString(), " vs ",
             sb.ToString(), " vs ", s2.ToString());
  if (sa.ok()) {
    FUZZ_CHECK(a->plaintext() == b.plaintext(), "backends open differently");
    FUZZ_CHECK(a->plaintext() == again.plaintext(), "memo changed the answer");
    FUZZ_CHECK(q.ciphertext().size() == a->plaintext().size() + 16, q.ciphertext().size());
  }
  return sa;
}

void CheckSeal(const v1::BoxSealRequest& q, const absl::Status& sa, const v1::BoxSealResponse& a) {
  FUZZ_CHECK(IsOneOf(sa.code(), kOperationCodes), sa.ToString());
  v1::BoxSealResponse b;
  const absl::Status sb = OpenSslWorld()->ops->BoxSeal(q, &b);
  FUZZ_CHECK(sa.code() == sb.code(), sa.ToString(), " vs ", sb.ToString());
  if (!sa.ok()) return;
  FUZZ_CHECK(a.nonce().size() == 24, a.nonce().size());
  FUZZ_CHECK(a.ciphertext().size() == q.plaintext().size() + 16, a.ciphertext().size());
  if (!q.nonce().empty()) {
    FUZZ_CHECK(a.nonce() == q.nonce(), "nonce not the caller's");
    FUZZ_CHECK(a.ciphertext() == b.ciphertext(), "backends seal differently");
  }
  v1::BoxOpenRequest open;
  open.set_key_id(q.key_id());
  open.set_key_version(a.key_version());
  open.set_peer_public_key(q.peer_public_key());
  open.set_nonce(a.nonce());
  open.set_ciphertext(a.ciphertext());
  v1::BoxOpenResponse opened;
  const absl::Status so = CheckOpen(open, &opened);
  FUZZ_CHECK(so.ok(), "sealed box does not open: ", so.ToString());
  FUZZ_CHECK(opened.plaintext() == q.plaintext(), "opened to another plaintext");
  std::string tampered = a.ciphertext();
  tampered[tampered.size() / 2] ^= 0x01;
  open.set_ciphertext(tampered);
  const absl::Status st = CheckOpen(open, &opened);
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument, "tampered box: ", st.ToString());
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
      v1::BoxSealRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BoxSealResponse a;
      CheckSeal(q, SodiumWorld()->ops->BoxSeal(q, &a), a);
      break;
    }
    case 1: {
      v1::BoxOpenRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BoxOpenResponse a;
      CheckOpen(q, &a);
      break;
    }
    case 2: {
      v1::BatchBoxSealRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchBoxSealResponse r;
      const absl::Status s = WaitForBatch(
          [&](ops::Operations::Done done) { SodiumWorld()->ops->BatchBoxSeal(q, &r, std::move(done)); });
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
      v1::BatchBoxOpenRequest q;
      if (!ParseRest(in, &q)) return -1;
      v1::BatchBoxOpenResponse r;
      const absl::Status s = WaitForBatch(
          [&](ops::Operations::Done done) { OpenSslWorld()->ops->BatchBoxOpen(q, &r, std::move(done)); });
      FUZZ_CHECK(IsOneOf(s.code(), kBatchCallCodes), s.ToString());
      const int n = q.items_size();
      FUZZ_CHECK(s.ok() == (n > 0 && n <= max_items), n);
      if (!s.ok()) break;
      FUZZ_CHECK(r.results_size() == n, r.results_size(), " results for ", n, " items");
      for (int i = 0; i < n; ++i) {
        v1::BoxOpenResponse single;
        const absl::Status ss = CheckOpen(q.items(i), &single);
        FUZZ_CHECK(ItemStatus(r.results(i)).code() == ss.code(), "batch item ", i, ": ",
                   ItemStatus(r.results(i)).ToString(), " vs ", ss.ToString());
        FUZZ_CHECK(r.results(i).response().plaintext() == single.plaintext(), "batch item ", i);
      }
      break;
    }
    case 4: {
      v1::BoxOpenRequest q;
      q.set_key_id(kKeyIdChoices[in.Byte() % kKeyIdChoiceCount]);
      const absl::string_view rest = in.Rest();
      q.set_peer_public_key(std::string(rest.substr(0, 32)));
      q.set_nonce(std::string(rest.substr(std::min<size_t>(32, rest.size()), 24)));
      q.set_ciphertext(std::string(rest.substr(std::min<size_t>(56, rest.size()))));
      v1::BoxOpenResponse a;
      CheckOpen(q, &a);
      break;
    }
  }
  return 0;
}
