// Test support: a job a backend handed out, as one line to compare.
#pragma once

#include <jobrt/backend.hpp>

#include <fmt/format.h>

#include <string>

namespace jobrt::test {

/// "<attempts>|<id>|<body>": every part of a job_record in one string, for assertions.
inline std::string text(const job_record& r) { return fmt::format("{}|{}|{}", r.attempts, r.id, r.body); }

}  // namespace jobrt::test
