#include "tests/testing/vectors.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifndef OFFLOAD_TESTVECTORS_DIR
#error "OFFLOAD_TESTVECTORS_DIR must be defined by CMake"
#endif

namespace offload::testvectors {
namespace {

[[noreturn]] void Die(absl::string_view message) {
  std::fprintf(stderr, "offload::testvectors: %.*s\n", static_cast<int>(message.size()),
               message.data());
  std::abort();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string VectorsDir() {
  const char* env = std::getenv("OFFLOAD_TESTVECTORS_DIR");
  std::string dir = (env != nullptr && *env != '\0') ? env : OFFLOAD_TESTVECTORS_DIR;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

absl::StatusOr<nlohmann::json> LoadJson(absl::string_view relative_path) {
  const std::string path = absl::StrCat(VectorsDir(), "/", relative_path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  // nlohmann::json reports errors by exception; keep them inside this function.
  nlohmann::json parsed = nlohmann::json::parse(text.str(), /*cb=*/nullptr,
                                                /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  }
  return parsed;
}

nlohmann::json LoadJsonOrDie(absl::string_view relative_path) {
  absl::StatusOr<nlohmann::json> parsed = LoadJson(relative_path);
  if (!parsed.ok()) Die(parsed.status().ToString());
  return *std::move(parsed);
}

std::string Hex(absl::Span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> ParseHex(absl::string_view hex) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hex: odd length ", hex.size()));
  }
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexDigit(hex[2 * i]);
    int lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("hex: bad digit at offset ", 2 * i));
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

std::vector<uint8_t> Unhex(absl::string_view hex) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ParseHex(hex);
  if (!bytes.ok()) Die(bytes.status().ToString());
  return *std::move(bytes);
}

std::vector<uint8_t> UnhexField(const nlohmann::json& value) {
  if (!value.is_string()) Die(absl::StrCat("expected a hex string, got ", value.dump()));
  return Unhex(value.get_ref<const std::string&>());
}

bool HasFlag(const nlohmann::json& test, absl::string_view flag) {
  auto flags = test.find("flags");
  if (flags == test.end() || !flags->is_array()) return false;
  for (const auto& f : *flags) {
    if (f.is_string() && f.get_ref<const std::string&>() == flag) return true;
  }
  return false;
}

size_t CountWycheproofTests(const nlohmann::json& file) {
  size_t n = 0;
  auto groups = file.find("testGroups");
  if (groups == file.end()) return 0;
  for (const auto& group : *groups) {
    auto tests = group.find("tests");
    if (tests != group.end()) n += tests->size();
  }
  return n;
}

}  // namespace offload::testvectors
