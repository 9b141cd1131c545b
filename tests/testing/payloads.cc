#include "tests/testing/payloads.h"

#include "absl/strings/str_cat.h"

namespace offload::testhttp {

std::string RandomBytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

std::string JsonLike(size_t n) {
  std::string s = "[";
  for (int i = 0; s.size() < n; ++i) {
    absl::StrAppend(&s, R"({"id":)", i, R"(,"name":"user-)", i * 7919 % 10007,
                    R"(","email":"user)", i, R"(@example.com","active":)",
                    i % 3 == 0 ? "true" : "false", R"(,"score":)", (i * 37) % 1000, "},");
  }
  s.resize(n);
  return s;
}

}  // namespace offload::testhttp
