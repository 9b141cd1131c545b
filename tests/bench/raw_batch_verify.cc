// Raw libsodium over the very triples of a BatchVerify request body: issue 24's baseline for
// "BatchVerify(64) fresh <= 1.03x raw libsodium over the same 64 triples".
//
//   build/bin/raw_batch_verify --request=/tmp/batch64.bin --seconds=3
//
// `--request` is a serialized offload.v1.BatchVerifyRequest (offload_load --write_request writes
// one, and run_all.py sends the same body to the servers with h2load). The tool verifies every
// item with crypto_sign_verify_detached, round after round, for `--seconds` of CPU time, and
// prints one JSON line: items per round, rounds, and the process CPU time per verify in us
// (CLOCK_PROCESS_CPUTIME_ID, one thread). Exit status 1 if a signature does not verify.
#include <sodium.h>
#include <time.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "offload/v1/ed25519.pb.h"

ABSL_FLAG(std::string, request, "", "serialized offload.v1.BatchVerifyRequest");
ABSL_FLAG(double, seconds, 3.0, "CPU seconds to measure for (after one warm-up second)");

namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One pass over every item; false if one does not verify.
bool Round(const offload::v1::BatchVerifyRequest& req) {
  for (const auto& item : req.items()) {
    const auto* sig = reinterpret_cast<const unsigned char*>(item.signature().data());
    const auto* msg = reinterpret_cast<const unsigned char*>(item.message().data());
    const auto* pk = reinterpret_cast<const unsigned char*>(item.public_key().data());
    if (item.signature().size() != crypto_sign_BYTES ||
        item.public_key().size() != crypto_sign_PUBLICKEYBYTES ||
        crypto_sign_verify_detached(sig, msg, item.message().size(), pk) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (sodium_init() < 0) return 1;
  std::ifstream in(absl::GetFlag(FLAGS_request), std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  offload::v1::BatchVerifyRequest req;
  if (!in || !req.ParseFromString(buf.str()) || req.items_size() == 0) {
    std::fprintf(stderr, "raw_batch_verify: cannot read a BatchVerifyRequest from %s\n",
                 absl::GetFlag(FLAGS_request).c_str());
    return 1;
  }
  for (double end = CpuSeconds() + 1.0; CpuSeconds() < end;) {
    if (!Round(req)) {
      std::fprintf(stderr, "raw_batch_verify: a signature did not verify\n");
      return 1;
    }
  }
  long rounds = 0;
  const double start = CpuSeconds();
  const double end = start + absl::GetFlag(FLAGS_seconds);
  double now = start;
  while (now < end) {
    if (!Round(req)) return 1;
    ++rounds;
    now = CpuSeconds();
  }
  std::printf("{\"items\":%d,\"rounds\":%ld,\"cpu_us_per_verify\":%.3f}\n", req.items_size(),
              rounds, (now - start) * 1e6 / (static_cast<double>(rounds) * req.items_size()));
  return 0;
}
