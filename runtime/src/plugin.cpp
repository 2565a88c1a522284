#include <jobrt/plugin.hpp>

#include <fmt/format.h>

#include <dlfcn.h>

#include <stdexcept>

namespace jobrt {
namespace {

class collecting_registry final : public plugin_registry {
 public:
  explicit collecting_registry(std::vector<plugin::entry>& out) : out_(out) {}
  void add(std::string type, handler h) override { add_entry(std::move(type), std::move(h), std::nullopt); }
  void add(std::string type, handler h, backoff b) override { add_entry(std::move(type), std::move(h), b); }

 private:
  void add_entry(std::string type, handler h, std::optional<backoff> b) {
    if (type.empty()) throw std::invalid_argument("a handler's type is empty");
    if (!h) throw std::invalid_argument(fmt::format("the handler of type '{}' is empty", type));
    out_.push_back({std::move(type), std::move(h), b});
  }
  std::vector<plugin::entry>& out_;
};

}  // namespace

plugin::~plugin() {
  handlers_.clear();  // the handlers' code lives in the library
  if (library_) ::dlclose(library_);
}

void plugin::register_with(worker& w) const {
  for (const auto& e : handlers_) {
    if (e.retry_backoff)
      w.add_handler(e.type, e.h, *e.retry_backoff);
    else
      w.add_handler(e.type, e.h);
  }
}

std::unique_ptr<plugin> load_plugin(const std::string& path) {
  std::unique_ptr<plugin> p(new plugin);
  p->path_ = path;
  p->library_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!p->library_) {
    const char* why = ::dlerror();
    throw std::runtime_error(fmt::format("plugin {}: cannot load: {}", path, why ? why : "unknown error"));
  }
  auto* abi = static_cast<const int*>(::dlsym(p->library_, "jobrt_plugin_abi"));
  auto* entry = reinterpret_cast<void (*)(plugin_registry&)>(::dlsym(p->library_, "jobrt_plugin_register"));
  if (!abi || !entry)
    throw std::runtime_error(fmt::format("plugin {}: not a jobrt plugin (no JOBRT_PLUGIN entry point)", path));
  if (*abi != JOBRT_PLUGIN_ABI)
    throw std::runtime_error(
        fmt::format("plugin {}: built for jobrt plugin ABI {}, but this jobrt has ABI {}; rebuild it", path, *abi,
                    JOBRT_PLUGIN_ABI));
  collecting_registry registry(p->handlers_);
  try {
    entry(registry);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("plugin {}: its entry point failed: {}", path, e.what()));
  }
  if (p->handlers_.empty()) throw std::runtime_error(fmt::format("plugin {}: registers no handlers", path));
  return p;
}

}  // namespace jobrt
