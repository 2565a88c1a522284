// docs/HANDLERS.md's example plugin, word for word: the consumer project builds and loads it.
#include <jobrt/plugin.hpp>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

JOBRT_PLUGIN(registry) {
  registry.add("greet", [](jobrt::job_context& ctx) -> boost::asio::awaitable<void> {
    const auto* name = ctx.payload().as_object().if_contains("name");
    if (!name || !name->is_string()) throw jobrt::permanent_failure("payload.name is not a string");
    boost::asio::steady_timer pause(co_await boost::asio::this_coro::executor, std::chrono::milliseconds(10));
    co_await pause.async_wait(boost::asio::use_awaitable);  // never block: other jobs share the thread
    ctx.log("hello, " + std::string(name->as_string()));
  });
}
