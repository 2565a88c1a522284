// Proof that an installed jobrt compiles and links from another project: enqueues a grouped job
// on the embedded backend and runs it with a worker, then loads the greet plugin (built here from
// docs/HANDLERS.md's example) and runs its handler on a good and on a bad payload.
#include <jobrt/memory_backend.hpp>
#include <jobrt/plugin.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/worker.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdio>

int main() {
  // Before the worker: its handlers' code lives in the plugin, which must outlive them.
  auto greet = jobrt::load_plugin(GREET_PLUGIN);
  boost::asio::io_context ctx;
  jobrt::memory_backend store(ctx.get_executor());
  jobrt::worker_options opts;
  opts.queue = "consumer";
  jobrt::worker w(ctx.get_executor(), store, opts);
  int ran = 0;
  w.add_handler("hello", [&](jobrt::job_context& job) -> boost::asio::awaitable<void> {
    ran = static_cast<int>(job.payload().at("n").as_int64());
    co_return;
  });
  greet->register_with(w);
  w.start();
  jobrt::queue_counts counts;
  boost::asio::co_spawn(
      ctx,
      [&]() -> boost::asio::awaitable<void> {
        jobrt::producer p(store, "consumer");
        jobrt::job_spec spec;
        spec.type = "hello";
        spec.payload = {{"n", 42}};
        spec.group = "g";
        co_await p.enqueue(spec);
        spec.type = "greet";
        spec.payload = {{"name", "world"}};
        co_await p.enqueue(spec);
        spec.payload = {{"name", 7}};  // not a string: a permanent failure, to the dead letters
        co_await p.enqueue(spec);
        boost::asio::steady_timer t(ctx);
        for (int i = 0; i < 500 && counts.completed + counts.dead < 3; ++i) {
          t.expires_after(std::chrono::milliseconds(10));
          co_await t.async_wait(boost::asio::use_awaitable);
          counts = co_await store.counts("consumer");
        }
        co_await w.stop(std::chrono::seconds(1));
      },
      boost::asio::detached);
  ctx.run();
  std::printf("consumer: the job ran with n=%d; %lld jobs completed, %lld dead-lettered\n", ran,
              static_cast<long long>(counts.completed), static_cast<long long>(counts.dead));
  return ran == 42 && counts.completed == 2 && counts.dead == 1 ? 0 : 1;
}
