// `sleep`: waits payload.ms milliseconds (on a timer: other jobs run meanwhile), then completes;
// with payload.fail set, fails instead. For benchmarks and tests of timeouts and retries.
#include <jobrt/plugin.hpp>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <stdexcept>

JOBRT_PLUGIN(registry) {
  registry.add("sleep", [](jobrt::job_context& ctx) -> boost::asio::awaitable<void> {
    std::int64_t ms = 0;
    bool fail = false;
    if (const auto* o = ctx.payload().if_object()) {
      if (const auto* v = o->if_contains("ms"); v && v->is_number()) ms = v->to_number<std::int64_t>();
      if (const auto* v = o->if_contains("fail"); v && v->is_bool()) fail = v->as_bool();
    }
    if (ms < 0) throw std::invalid_argument("sleep: payload.ms is negative");
    boost::asio::steady_timer t(co_await boost::asio::this_coro::executor, std::chrono::milliseconds(ms));
    co_await t.async_wait(boost::asio::use_awaitable);
    if (fail) throw std::runtime_error("sleep: failed as asked (payload.fail)");
  });
}
