// Handler plugins: shared libraries that register coroutine handlers by job type.
//
// A plugin defines one function with JOBRT_PLUGIN:
//
//   #include <jobrt/plugin.hpp>
//   JOBRT_PLUGIN(registry) {
//     registry.add("noop", [](jobrt::job_context&) -> boost::asio::awaitable<void> { co_return; });
//   }
//
// and is built as a MODULE library against the same jobrt headers (see handlers/CMakeLists.txt).
// The host (the jobrt command, or any program linked with jobrt that exports its symbols) loads
// it with load_plugin(). Handlers run inside the host: they share its io_context, its Asio and
// its C++ runtime, so a plugin must be built with the same jobrt version and compiler; the ABI
// number below guards that.
#pragma once

#include <jobrt/job.hpp>
#include <jobrt/worker.hpp>

#include <memory>
#include <string>
#include <vector>

/// Changes whenever a change to jobrt's headers breaks plugins built before it.
#define JOBRT_PLUGIN_ABI 5

namespace jobrt {

/// What a plugin's entry point gets: where to register its handlers.
class plugin_registry {
 public:
  virtual ~plugin_registry() = default;
  virtual void add(std::string type, handler h) = 0;
  /// With a backoff of the type's own.
  virtual void add(std::string type, handler h, backoff retry_backoff) = 0;
};

/// A loaded plugin: its handlers, by type. Keeps the library loaded while it lives; handlers
/// must not outlive it.
class plugin {
 public:
  struct entry {
    std::string type;
    handler h;
    std::optional<backoff> retry_backoff;
  };
  ~plugin();
  plugin(const plugin&) = delete;
  plugin& operator=(const plugin&) = delete;

  const std::string& path() const noexcept { return path_; }
  const std::vector<entry>& handlers() const noexcept { return handlers_; }
  /// Registers every handler with a worker.
  void register_with(worker& w) const;

 private:
  friend std::unique_ptr<plugin> load_plugin(const std::string& path);
  plugin() = default;
  std::string path_;
  void* library_ = nullptr;
  std::vector<entry> handlers_;
};

/// Loads a plugin. Throws std::runtime_error naming the file and the reason: it cannot be
/// opened, it has no jobrt entry point, it was built for another ABI, it registers nothing, or
/// its entry point throws.
std::unique_ptr<plugin> load_plugin(const std::string& path);

}  // namespace jobrt

// The entry point calls a C++ function: coroutine lambdas defined directly in an extern "C"
// function get clashing symbol names from g++ 12.
#define JOBRT_PLUGIN(registry_name)                                                                         \
  static void jobrt_plugin_register_handlers(jobrt::plugin_registry&);                                      \
  extern "C" __attribute__((visibility("default"))) const int jobrt_plugin_abi = JOBRT_PLUGIN_ABI;          \
  extern "C" __attribute__((visibility("default"))) void jobrt_plugin_register(jobrt::plugin_registry& r) { \
    jobrt_plugin_register_handlers(r);                                                                      \
  }                                                                                                         \
  static void jobrt_plugin_register_handlers(jobrt::plugin_registry& registry_name)
