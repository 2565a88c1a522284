// A handler that throws outside any job: it posts a function that throws to the worker's
// executor. jobrt must stop and say so, on whichever of its threads that runs.
#include <jobrt/plugin.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>

#include <stdexcept>

JOBRT_PLUGIN(registry) {
  registry.add("escape", [](jobrt::job_context&) -> boost::asio::awaitable<void> {
    auto ex = co_await boost::asio::this_coro::executor;
    boost::asio::post(ex, [] { throw std::runtime_error("thrown by a plugin outside any job"); });
  });
}
