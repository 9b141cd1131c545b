// offloadctl's subcommands: each builds one request from `Options`, calls the server with a
// deadline, and prints the response (human-readable lines, or JSON with --json).
//
//   absl::StatusOr<int> exit_code = RunCommand(*spec, positional, options);
//
// Thread-safety: RunCommand writes to stdout/stderr and may read stdin; call it from one thread.
#ifndef TOOLS_OFFLOADCTL_COMMANDS_H_
#define TOOLS_OFFLOADCTL_COMMANDS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tools/offloadctl/cli.h"

namespace offload::ctl {

// Runs `spec` with `positional` (the subcommand words first) against `options.server`.
// Returns the exit code of a completed command (kExitOk, or kExitInvalidSignature for a verify
// that answered "invalid"); an error status otherwise, RPC errors tagged by MarkRpcError.
// REQUIRES: CheckCommand(spec, positional, options) is OK.
absl::StatusOr<int> RunCommand(const CommandSpec& spec, absl::Span<const std::string> positional,
                               const Options& options);

}  // namespace offload::ctl

#endif  // TOOLS_OFFLOADCTL_COMMANDS_H_
