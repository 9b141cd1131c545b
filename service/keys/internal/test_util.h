// Test helpers for service/keys: a temporary directory removed at scope exit, file helpers.
#ifndef SERVICE_KEYS_INTERNAL_TEST_UTIL_H_
#define SERVICE_KEYS_INTERNAL_TEST_UTIL_H_

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace offload::keys::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/offload_keys_XXXXXX");
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteBytes(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& data) {
  WriteBytes(path, data.data(), data.size());
}

inline void WriteText(const std::string& path, absl::string_view text) {
  WriteBytes(path, text.data(), text.size());
}

inline mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// True iff `needle` occurs in `haystack`.
template <typename H, typename N>
bool Contains(const H& haystack, const N& needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) !=
         haystack.end();
}

}  // namespace offload::keys::testing

#endif  // SERVICE_KEYS_INTERNAL_TEST_UTIL_H_
