// The precompiled header of every gtest executable (top-level CMakeLists.txt, OFFLOAD_TEST_PCH):
// what nearly all of them include, directly or through the headers they test - the standard
// library's containers, Abseil's status, strings and locks, protobuf messages, gtest and gmock -
// parsed once per build tree instead of once per test source. Each test still includes what it
// uses; this file changes no meaning, only how often these headers are read.
#ifndef TESTS_TESTING_TEST_PCH_H_
#define TESTS_TESTING_TEST_PCH_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"

#endif  // TESTS_TESTING_TEST_PCH_H_
