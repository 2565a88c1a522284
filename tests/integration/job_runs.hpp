// What the bridges' kill tests check of the jobs a worker ran: jobs whose payload is {"n": N},
// N from 0 to total - 1, published in order of N within each group.
#pragma once

#include <jobrt/worker.hpp>

#include <boost/asio/awaitable.hpp>

#include <map>
#include <string>
#include <vector>

namespace jobrt::test {

struct job_runs {
  explicit job_runs(int total) : runs(static_cast<std::size_t>(total), 0) {}

  std::vector<int> runs;  // starts of each N
  std::map<std::string, int> last_of_group;
  int inversions = 0;  // a job started after a later one of its group
  int distinct = 0;    // Ns started at least once

  /// The handler: notes a start.
  jobrt::handler handler() {
    return [this](job_context& job) -> boost::asio::awaitable<void> {
      auto n = static_cast<int>(job.payload().at("n").as_int64());
      if (runs.at(static_cast<std::size_t>(n))++ == 0) ++distinct;
      auto [last, added] = last_of_group.try_emplace(job.group(), n);
      if (!added && last->second > n) ++inversions;
      last->second = n;
      co_return;
    };
  }
  /// Ns started more than once.
  int doubled() const {
    int out = 0;
    for (auto r : runs) out += r > 1 ? 1 : 0;
    return out;
  }
};

}  // namespace jobrt::test
