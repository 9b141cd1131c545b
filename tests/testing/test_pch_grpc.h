// The precompiled header of the gtest executables that link gRPC (the clients' and tools' tests:
// top-level CMakeLists.txt, OFFLOAD_TEST_PCH): test_pch.h and gRPC's C++ API.
#ifndef TESTS_TESTING_TEST_PCH_GRPC_H_
#define TESTS_TESTING_TEST_PCH_GRPC_H_

#include "grpcpp/grpcpp.h"
#include "tests/testing/test_pch.h"

#endif  // TESTS_TESTING_TEST_PCH_GRPC_H_
