// `noop`: completes at once. For benchmarks and tests.
#include <jobrt/plugin.hpp>

JOBRT_PLUGIN(registry) {
  registry.add("noop", [](jobrt::job_context&) -> boost::asio::awaitable<void> { co_return; });
}
