// A plugin built for another plugin ABI: jobrt must refuse it by name.
#include <jobrt/plugin.hpp>

#undef JOBRT_PLUGIN_ABI
#define JOBRT_PLUGIN_ABI 999

JOBRT_PLUGIN(registry) {
  registry.add("never", [](jobrt::job_context&) -> boost::asio::awaitable<void> { co_return; });
}
