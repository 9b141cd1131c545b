#include "service/ops/inline_rule.h"

#include <string>

#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "offload/v1/x25519.pb.h"

namespace offload::ops {
namespace {

namespace v1 = ::offload::v1;

v1::VerifyRequest Verify(size_t message_bytes) {
  v1::VerifyRequest q;
  q.set_public_key(std::string(32, 'p'));
  q.set_signature(std::string(64, 's'));
  q.set_message(std::string(message_bytes, 'm'));
  return q;
}

v1::AeadOpenRequest Open(size_t envelope_bytes) {
  v1::AeadOpenRequest q;
  q.set_key_id("k");
  q.set_envelope(std::string(envelope_bytes, 'e'));
  return q;
}

TEST(InlineRuleTest, EstimatesGrowWithItemsAndBytes) {
  const int64_t one = InlineRule::EstimateNanos(Verify(64));
  EXPECT_GE(one, 40'000);  // a signature check is tens of microseconds
  EXPECT_GT(InlineRule::EstimateNanos(Verify(1 << 20)), one + 1'000'000);
  v1::BatchVerifyRequest batch;
  for (int i = 0; i < 64; ++i) *batch.add_items() = Verify(64);
  EXPECT_EQ(InlineRule::EstimateNanos(batch), 64 * one);
  EXPECT_LT(InlineRule::EstimateNanos(Open(55'000)), InlineRule::EstimateNanos(Open(1 << 20)));
  EXPECT_EQ(InlineRule::EstimateAeadOpenNanos(55'000), InlineRule::EstimateNanos(Open(55'000)));
  v1::BatchAeadOpenRequest opens;
  for (int i = 0; i < 16; ++i) *opens.add_items() = Open(55'000);
  EXPECT_EQ(InlineRule::EstimateNanos(opens), 16 * InlineRule::EstimateNanos(Open(55'000)));
  v1::DeriveRequest derive;
  EXPECT_GT(InlineRule::EstimateNanos(derive), 0);
  v1::AeadRewrapRequest rewrap;
  rewrap.set_envelope(std::string(1000, 'e'));
  EXPECT_GT(InlineRule::EstimateNanos(rewrap), InlineRule::EstimateNanos(Open(1000)));
}

TEST(InlineRuleTest, EveryDataPlaneRequestHasAnEstimateAndKeyManagementNone) {
  const google::protobuf::Message* data_plane[] = {
      &v1::VerifyRequest::default_instance(),     &v1::BatchVerifyRequest::default_instance(),
      &v1::SignRequest::default_instance(),       &v1::BatchSignRequest::default_instance(),
      &v1::DeriveRequest::default_instance(),     &v1::BatchDeriveRequest::default_instance(),
      &v1::BoxSealRequest::default_instance(),    &v1::BatchBoxSealRequest::default_instance(),
      &v1::BoxOpenRequest::default_instance(),    &v1::BatchBoxOpenRequest::default_instance(),
      &v1::AeadSealRequest::default_instance(),   &v1::BatchAeadSealRequest::default_instance(),
      &v1::AeadOpenRequest::default_instance(),   &v1::BatchAeadOpenRequest::default_instance(),
      &v1::AeadRewrapRequest::default_instance(), &v1::BatchAeadRewrapRequest::default_instance(),
  };
  for (const auto* m : data_plane) {
    EXPECT_LT(InlineRule::EstimateNanos(*m), InlineRule::kNever) << m->GetTypeName();
  }
  // Key management writes the key store: never on a loop, whatever the bound.
  EXPECT_EQ(InlineRule::EstimateNanos(v1::CreateKeyRequest::default_instance()),
            InlineRule::kNever);
  EXPECT_EQ(InlineRule::EstimateNanos(v1::DeleteKeyRequest::default_instance()),
            InlineRule::kNever);
  EXPECT_EQ(InlineRule::EstimateNanos(v1::VerifyResponse::default_instance()), InlineRule::kNever);
  InlineRule rule({absl::Hours(1), absl::Hours(1)});
  EXPECT_FALSE(rule.RunHere(InlineRule::kNever, 0, 0));
}

TEST(InlineRuleTest, SingleCallsAndSmallBatchesRunHereLargeBatchesDoNot) {
  InlineRule rule({});  // 250 us a call, 2 ms an input
  const int64_t verify = InlineRule::EstimateNanos(Verify(64));
  EXPECT_TRUE(rule.RunHere(verify, 0, 0));
  EXPECT_TRUE(rule.RunHere(4 * verify, 0, 0));     // BatchVerify(4)
  EXPECT_FALSE(rule.RunHere(64 * verify, 0, 0));   // BatchVerify(64): the pool
  EXPECT_TRUE(rule.RunHere(InlineRule::EstimateNanos(Open(55'000)), 0, 0));
  EXPECT_FALSE(rule.RunHere(InlineRule::EstimateNanos(Open(1 << 20)), 0, 0));
}

TEST(InlineRuleTest, AnInputPastItsBudgetSendsTheRestToThePool) {
  InlineRule rule({absl::Microseconds(250), absl::Milliseconds(2)});
  EXPECT_TRUE(rule.RunHere(45'000, 1'900'000, 0));
  EXPECT_TRUE(rule.RunHere(100'000, 1'900'000, 0));   // exactly the budget
  EXPECT_FALSE(rule.RunHere(100'001, 1'900'000, 0));
  EXPECT_FALSE(rule.RunHere(45'000, 2'000'000, 0));
  // Answers from other threads wait on this loop: one call's worth per input at most.
  EXPECT_TRUE(rule.RunHere(45'000, 0, 3));
  EXPECT_TRUE(rule.RunHere(45'000, 200'000, 3));
  EXPECT_FALSE(rule.RunHere(45'000, 210'000, 3));
}

TEST(InlineRuleTest, ZeroMaxCallSendsEveryCallToThePool) {
  InlineRule rule({absl::ZeroDuration(), absl::Milliseconds(2)});
  EXPECT_FALSE(rule.RunHere(InlineRule::EstimateNanos(Verify(0)), 0, 0));
  EXPECT_FALSE(rule.RunHere(1, 0, 0));
}

}  // namespace
}  // namespace offload::ops
