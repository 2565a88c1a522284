// `stock_arrival`: the demo's job as a plugin. payload {"commodity", "qty"} adds qty to the
// commodity's stock, read and written back with a yield in between: a lost update unless the
// jobs of one commodity never overlap, so enqueue it grouped by commodity. The stock lives in
// this process (one map per worker process, keyed by commodity) and is touched only on the
// group's strand; each arrival logs the new stock.
#include <jobrt/plugin.hpp>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <map>
#include <mutex>

namespace {

// Entries are made under the mutex; each entry is then read and written only by its group's
// handlers, which never run at once.
std::mutex stock_mutex;
std::map<std::string, std::int64_t> stock;

std::int64_t& stock_of(const std::string& commodity) {
  std::lock_guard lock(stock_mutex);
  return stock[commodity];  // std::map: references stay valid as it grows
}

boost::asio::awaitable<void> stock_arrival(jobrt::job_context& ctx) {
  const auto* o = ctx.payload().if_object();
  const auto* commodity = o ? o->if_contains("commodity") : nullptr;
  const auto* qty = o ? o->if_contains("qty") : nullptr;
  if (!commodity || !commodity->is_string() || !qty || !qty->is_int64())
    throw jobrt::permanent_failure("stock_arrival: payload needs \"commodity\" (string) and \"qty\" (integer)");
  if (ctx.group().empty()) throw jobrt::permanent_failure("stock_arrival: enqueue it grouped by commodity");
  auto& level = stock_of(std::string(commodity->as_string()));
  auto read = level;
  co_await boost::asio::post(co_await boost::asio::this_coro::executor, boost::asio::use_awaitable);
  level = read + qty->as_int64();
  ctx.log(fmt::format("{} stock now {}", commodity->as_string(), level));
}

}  // namespace

JOBRT_PLUGIN(registry) { registry.add("stock_arrival", stock_arrival); }
