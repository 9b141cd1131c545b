#include "service/auth/audit_chain.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace offload::auth {
namespace {

const std::string kKey(32, 'k');

std::vector<std::string> Sealed(int n, AuditChain* chain) {
  std::vector<std::string> lines;
  for (int i = 1; i <= n; ++i) {
    lines.push_back(chain->Seal(absl::StrCat(R"({"ts":"t)", i, R"(","event":"key_create","key_id":"k)", i, R"("})")));
  }
  return lines;
}

std::string Text(const std::vector<std::string>& lines) { return absl::StrJoin(lines, "\n") + "\n"; }

TEST(AuditChainTest, AnUntouchedFileChecks) {
  AuditChain chain(kKey);
  const std::vector<std::string> lines = Sealed(5, &chain);
  EXPECT_NE(lines[0].find(R"("key_id":"k1","mac":")"), std::string::npos) << lines[0];
  const AuditCheck check = VerifyAuditChain(Text(lines), kKey);
  EXPECT_EQ(check.lines, 5u);
  EXPECT_EQ(check.first_broken, 0u) << check.reason;
}

TEST(AuditChainTest, EditedRemovedInsertedAndMovedLinesAreNamed) {
  AuditChain chain(kKey);
  const std::vector<std::string> lines = Sealed(6, &chain);
  std::vector<std::string> edited = lines;
  edited[2].replace(edited[2].find("k3"), 2, "k9");
  EXPECT_EQ(VerifyAuditChain(Text(edited), kKey).first_broken, 3u);
  std::vector<std::string> removed = lines;
  removed.erase(removed.begin() + 3);  // line 4 gone: line 5 (now 4th) no longer follows line 3
  EXPECT_EQ(VerifyAuditChain(Text(removed), kKey).first_broken, 4u);
  std::vector<std::string> moved = lines;
  std::swap(moved[1], moved[4]);
  EXPECT_EQ(VerifyAuditChain(Text(moved), kKey).first_broken, 2u);
  std::vector<std::string> inserted = lines;
  inserted.insert(inserted.begin() + 1, R"({"event":"forged"})");
  EXPECT_EQ(VerifyAuditChain(Text(inserted), kKey).first_broken, 2u);
  // A forger without the key cannot mend it: a whole line copied from another chain fails too.
  AuditChain other(std::string(32, 'x'));
  std::vector<std::string> foreign = lines;
  foreign[0] = Sealed(1, &other)[0];
  EXPECT_EQ(VerifyAuditChain(Text(foreign), kKey).first_broken, 1u);
  EXPECT_EQ(VerifyAuditChain(Text(lines), std::string(32, 'x')).first_broken, 1u);
}

TEST(AuditChainTest, AChainGoesOnAfterARestart) {
  AuditChain first(kKey);
  std::vector<std::string> lines = Sealed(3, &first);
  AuditChain second(kKey);
  second.Resume(lines.back());
  for (std::string& l : Sealed(2, &second)) lines.push_back(std::move(l));
  EXPECT_EQ(VerifyAuditChain(Text(lines), kKey).first_broken, 0u);
  // Resumed from the wrong line (say the last one was cut), the next line breaks.
  AuditChain third(kKey);
  third.Resume(lines[1]);
  lines.push_back(Sealed(1, &third)[0]);
  EXPECT_EQ(VerifyAuditChain(Text(lines), kKey).first_broken, 6u);
}

}  // namespace
}  // namespace offload::auth
