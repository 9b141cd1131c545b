// Test helpers shared by every test binary: where the test vectors live, loading their JSON,
// and hex conversion. Test vectors are read from files, never pasted into code.
//
//   nlohmann::json file = offload::testvectors::LoadJsonOrDie("wycheproof/x25519_test.json");
//   for (const auto& group : file["testGroups"])
//     for (const auto& test : group["tests"])
//       std::vector<uint8_t> shared = offload::testvectors::UnhexField(test["shared"]);
//
// The namespace is not `offload::testing` so that `testing::` (gtest) still resolves inside
// `namespace offload`. Thread-safety: every function is thread-safe.
#ifndef TESTS_TESTING_VECTORS_H_
#define TESTS_TESTING_VECTORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace offload::testvectors {

// The test vector folder (CMake's OFFLOAD_TESTVECTORS_DIR), overridable by the environment
// variable OFFLOAD_TESTVECTORS_DIR. No trailing slash.
std::string VectorsDir();

// Parses `relative_path` (e.g. "rfc_vectors.json") under VectorsDir(). NotFound if the file is
// missing, InvalidArgument (with the parser's message) if it is not JSON.
absl::StatusOr<nlohmann::json> LoadJson(absl::string_view relative_path);

// LoadJson, aborting with the error on failure: for test fixtures, where missing data is fatal.
nlohmann::json LoadJsonOrDie(absl::string_view relative_path);

// Lowercase hex of `bytes`.
std::string Hex(absl::Span<const uint8_t> bytes);

// Bytes of the hex string `hex` (either case, even length). InvalidArgument otherwise.
absl::StatusOr<std::vector<uint8_t>> ParseHex(absl::string_view hex);

// ParseHex, aborting on malformed input: test vectors are trusted to be well formed.
std::vector<uint8_t> Unhex(absl::string_view hex);

// Unhex of the JSON string `value` (e.g. test["msg"]); aborts if it is not a string.
std::vector<uint8_t> UnhexField(const nlohmann::json& value);

// True iff the Wycheproof test case `test` lists `flag` in its "flags".
bool HasFlag(const nlohmann::json& test, absl::string_view flag);

// The number of test cases in a Wycheproof file (sum over "testGroups" of "tests").
size_t CountWycheproofTests(const nlohmann::json& file);

}  // namespace offload::testvectors

#endif  // TESTS_TESTING_VECTORS_H_
