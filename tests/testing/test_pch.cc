// The object of the test executables' shared precompiled header (test_pch.h).
