// Enqueues a grouped job on the embedded backend and runs it with a worker: proof that an
// installed jobrt compiles and links from another project.
#include <jobrt/memory_backend.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/worker.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdio>

int main() {
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
  w.start();
  boost::asio::co_spawn(
      ctx,
      [&]() -> boost::asio::awaitable<void> {
        jobrt::producer p(store, "consumer");
        jobrt::job_spec spec;
        spec.type = "hello";
        spec.payload = {{"n", 42}};
        spec.group = "g";
        co_await p.enqueue(spec);
        boost::asio::steady_timer t(ctx);
        for (int i = 0; i < 500 && ran == 0; ++i) {
          t.expires_after(std::chrono::milliseconds(10));
          co_await t.async_wait(boost::asio::use_awaitable);
        }
        co_await w.stop(std::chrono::seconds(1));
      },
      boost::asio::detached);
  ctx.run();
  std::printf("consumer: the job ran with n=%d\n", ran);
  return ran == 42 ? 0 : 1;
}
