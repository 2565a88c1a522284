// `tenant_import`: imports payload.rows rows for payload.tenant's payload.entity, in chunks of
// payload.chunk (default 100), yielding between chunks and logging its progress. Enqueue it
// grouped by entity and tenant (a grouping rule with key "{entity}:{tenant}", or --group), so one
// tenant's imports of one entity run one at a time, in order. A payload without those fields is
// a permanent failure (no retry can fix it); a cancelled import stops between chunks.
#include <jobrt/plugin.hpp>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace {

boost::asio::awaitable<void> tenant_import(jobrt::job_context& ctx) {
  const auto* o = ctx.payload().if_object();
  auto text = [&](std::string_view name) -> std::string {
    const auto* v = o ? o->if_contains(name) : nullptr;
    if (!v || !v->is_string() || v->as_string().empty())
      throw jobrt::permanent_failure(fmt::format("tenant_import: payload.{} is missing or not a string", name));
    return std::string(v->as_string());
  };
  auto number = [&](std::string_view name, std::int64_t fallback) -> std::int64_t {
    const auto* v = o ? o->if_contains(name) : nullptr;
    if (!v) return fallback;
    if (!v->is_int64() || v->as_int64() < 0)
      throw jobrt::permanent_failure(fmt::format("tenant_import: payload.{} is not a non-negative integer", name));
    return v->as_int64();
  };
  auto tenant = text("tenant");
  auto entity = text("entity");
  auto rows = number("rows", 0);
  auto chunk = std::max<std::int64_t>(1, number("chunk", 100));
  for (std::int64_t done = 0; done < rows;) {
    if (ctx.cancelled()) throw std::runtime_error("tenant_import: cancelled");
    done = std::min(rows, done + chunk);
    // A real import writes the chunk here (with ctx.fence() for its storage to refuse stale writers).
    co_await boost::asio::post(co_await boost::asio::this_coro::executor, boost::asio::use_awaitable);
    if (done == rows || done / chunk % 10 == 0)
      ctx.log(fmt::format("{} {} for tenant {}: {}/{} rows", ctx.attempt() > 1 ? "re-importing" : "importing", entity,
                          tenant, done, rows));
  }
}

}  // namespace

JOBRT_PLUGIN(registry) { registry.add("tenant_import", tenant_import); }
