// Payloads for tests of compression and large messages.

#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace offload::testhttp {

// `n` bytes from a fixed-seed xorshift generator: incompressible, the same for the same seed.
std::string RandomBytes(size_t n, uint32_t seed = 0);

// `n` bytes of text shaped like a JSON array of user records: what a compressible plaintext
// looks like (gzip level 1 takes it to about a fifth).
std::string JsonLike(size_t n);

}  // namespace offload::testhttp
