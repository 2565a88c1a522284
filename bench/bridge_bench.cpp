// The bridges against a bare consumer of the same source, in one run (bench/bridge.sh).
//
//   jobrt_bench_bridge REDIS_URL stream N [BATCH=200]
//     N entries in a stream, consumed by a bare client (XREADGROUP COUNT 200, then XACK of the
//     batch: no work), then N entries more consumed by a stream_bridge (batch=BATCH) into a
//     queue (no worker); prints both rates (messages/s: the bare client's from its first read
//     to its last ack, the bridge's from its start, connecting included, until all are stored)
//     and their ratio.
//   jobrt_bench_bridge REDIS_URL amqp N AMQP_PORT [BATCH=200]
//     the same with a RabbitMQ queue: a bare librabbitmq consumer (prefetch 1000, an ack a
//     message), then an amqp_bridge (batch=BATCH, prefetch twice that).
//   jobrt_bench_bridge REDIS_URL latency N SOURCE [AMQP_PORT]
//     a worker runs a queue fed by a bridge (SOURCE stream or amqp); N messages sent one at a
//     time, each after the previous one started, 1 ms apart; prints publish-to-handler-start
//     p50 and p99.
// Output: one line of key=value pairs. The servers must be throw-away ones: Redis is flushed.
#include <jobrt/bridge.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace jobrt;
using clock_type = std::chrono::steady_clock;

namespace {

asio::awaitable<void> sleep_for(std::chrono::microseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now().time_since_epoch()).count();
}

amqp_bytes_t bytes(const std::string& s) { return amqp_bytes_t{s.size(), const_cast<char*>(s.data())}; }

// A blocking librabbitmq connection with channel 1 open.
class amqp_client {
 public:
  explicit amqp_client(int port) : c_(amqp_new_connection()) {
    auto* socket = amqp_tcp_socket_new(c_);
    if (amqp_socket_open(socket, "127.0.0.1", port) != AMQP_STATUS_OK) throw std::runtime_error("amqp: no connection");
    if (amqp_login(c_, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest").reply_type != AMQP_RESPONSE_NORMAL)
      throw std::runtime_error("amqp: login refused");
    amqp_channel_open(c_, 1);
    amqp_get_rpc_reply(c_);
  }
  ~amqp_client() {
    amqp_connection_close(c_, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c_);
  }
  amqp_client(const amqp_client&) = delete;
  amqp_client& operator=(const amqp_client&) = delete;
  amqp_connection_state_t get() const { return c_; }

  void declare(const std::string& queue) {
    amqp_queue_declare(c_, 1, bytes(queue), 0, 1, 0, 0, amqp_empty_table);
    amqp_get_rpc_reply(c_);
    amqp_queue_purge(c_, 1, bytes(queue));
    amqp_get_rpc_reply(c_);
  }
  void publish(const std::string& queue, const std::string& body, const std::string& id) {
    amqp_basic_properties_t p{};
    p._flags = AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
    const std::string type = "t";
    p.type = bytes(type);
    p.message_id = bytes(id);
    amqp_basic_publish(c_, 1, amqp_empty_bytes, bytes(queue), 0, 0, &p, bytes(body));
  }

 private:
  amqp_connection_state_t c_;
};

// Messages a second of a bridge from `url`, from its start until it has stored n (counters read
// every ms; its connecting counts).
asio::awaitable<double> bridge_rate(asio::io_context& ctx, redis_backend& store, const std::string& url,
                                    std::uint64_t n) {
  producer_options po;
  po.batch = max_bridge_batch;
  auto bridge = make_bridge(ctx.get_executor(), url, producer(store, "bridged", po));
  bool ended = false;
  auto began = clock_type::now();
  asio::co_spawn(ctx, bridge->run(), [&](std::exception_ptr) { ended = true; });
  auto stored = [&] {
    auto c = bridge->counters();
    return c.enqueued + c.duplicates + c.rejected;
  };
  while (stored() < n) co_await sleep_for(std::chrono::microseconds(1000));
  std::chrono::duration<double> took = clock_type::now() - began;
  bridge->stop();
  while (!ended) co_await sleep_for(std::chrono::microseconds(1000));
  co_return static_cast<double>(n) / took.count();
}

asio::awaitable<void> stream_mode(asio::io_context& ctx, redis::config cfg, const std::string& url, std::uint64_t n,
                                  std::size_t batch) {
  redis::connection c(ctx.get_executor(), cfg);
  c.start();
  co_await redis::exec(c, redis::request("FLUSHALL"));
  auto fill = [&](std::string stream) -> asio::awaitable<void> {
    for (std::uint64_t first = 0; first < n; first += 1000) {
      redis::request req;
      for (auto i = first; i < std::min(n, first + 1000); ++i)
        req.push("XADD", stream, "*", "type", "t", "group", fmt::format("g{}", i % 1000), "payload",
                 fmt::format("{{\"n\":{}}}", i));
      co_await redis::exec(c, std::move(req));
    }
    co_await redis::exec(c, redis::request("XGROUP", "CREATE", stream, "g", "0"));
  };
  // The bare consumer: read a batch, acknowledge it, again.
  co_await fill("bare");
  redis::blocking_connection reader(ctx.get_executor(), cfg);
  reader.start();
  auto began = clock_type::now();
  for (std::uint64_t got = 0; got < n;) {
    auto r = co_await redis::exec(
        reader, redis::request("XREADGROUP", "GROUP", "g", "c", "COUNT", 200, "STREAMS", "bare", ">"));
    std::vector<std::string> ids;
    for (const auto& e : r.as_array().at(0).as_array().at(1).as_array()) ids.push_back(e.as_array().at(0).as_string());
    co_await redis::exec(c, redis::request("XACK", "bare", "g", ids));
    got += ids.size();
  }
  std::chrono::duration<double> bare_took = clock_type::now() - began;
  double bare = static_cast<double>(n) / bare_took.count();
  co_await fill("bridged");
  redis_backend store(ctx.get_executor(), cfg);
  double bridged = co_await bridge_rate(ctx, store, fmt::format("{}/bridged?group=g&batch={}", url, batch), n);
  fmt::print("mode=stream n={} batch={} bare_msgs_per_s={:.0f} bridge_msgs_per_s={:.0f} ratio={:.2f}\n", n, batch, bare,
             bridged, bridged / bare);
  reader.close();
  c.close();
}

asio::awaitable<void> amqp_mode(asio::io_context& ctx, redis::config cfg, std::uint64_t n, int port,
                                std::size_t batch) {
  redis::connection c(ctx.get_executor(), cfg);
  c.start();
  co_await redis::exec(c, redis::request("FLUSHALL"));
  amqp_client publisher(port);
  // (The bare consumer's connection is made before its clock starts; the bridge's counts.)
  auto fill = [&](const std::string& queue) {
    publisher.declare(queue);
    for (std::uint64_t i = 0; i < n; ++i)
      publisher.publish(queue, fmt::format("{{\"n\":{}}}", i), fmt::format("m-{}", i));
  };
  // The bare consumer, on a thread: an ack a message.
  fill("bare");
  double bare = 0;
  std::thread([&] {
    amqp_client consumer(port);
    amqp_basic_qos(consumer.get(), 1, 0, 1000, 0);
    amqp_basic_consume(consumer.get(), 1, bytes("bare"), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
    amqp_get_rpc_reply(consumer.get());
    auto began = clock_type::now();
    for (std::uint64_t got = 0; got < n; ++got) {
      amqp_maybe_release_buffers(consumer.get());
      amqp_envelope_t e;
      amqp_consume_message(consumer.get(), &e, nullptr, 0);
      amqp_basic_ack(consumer.get(), 1, e.delivery_tag, 0);
      amqp_destroy_envelope(&e);
    }
    std::chrono::duration<double> took = clock_type::now() - began;
    bare = static_cast<double>(n) / took.count();
  }).join();
  fill("bridged");
  redis_backend store(ctx.get_executor(), cfg);
  double bridged = co_await bridge_rate(
      ctx, store,
      fmt::format("amqp://guest:guest@127.0.0.1:{}/%2F?queue=bridged&prefetch={}&batch={}", port, 2 * batch, batch), n);
  fmt::print("mode=amqp n={} batch={} bare_msgs_per_s={:.0f} bridge_msgs_per_s={:.0f} ratio={:.2f}\n", n, batch, bare,
             bridged, bridged / bare);
  c.close();
}

asio::awaitable<void> latency_mode(asio::io_context& ctx, redis::config cfg, const std::string& url, std::uint64_t n,
                                   const std::string& source, int port) {
  redis::connection c(ctx.get_executor(), cfg);
  c.start();
  co_await redis::exec(c, redis::request("FLUSHALL"));
  redis_backend store(ctx.get_executor(), cfg);
  worker_options o;
  o.queue = "bridged";
  o.concurrency = 10;
  worker w(ctx.get_executor(), store, o);
  std::vector<double> waits;
  w.add_handler("t", [&](job_context& job) -> asio::awaitable<void> {
    waits.push_back(static_cast<double>(now_us() - job.payload().at("sent").as_int64()));
    co_return;
  });
  w.start();
  std::unique_ptr<amqp_client> publisher;
  std::string from;
  if (source == "amqp") {
    publisher = std::make_unique<amqp_client>(port);
    publisher->declare("in");
    from = fmt::format("amqp://guest:guest@127.0.0.1:{}/%2F?queue=in", port);
  } else {
    co_await redis::exec(c, redis::request("XGROUP", "CREATE", "in", "g", "0", "MKSTREAM"));
    from = fmt::format("{}/in?group=g", url);
  }
  producer_options po;
  po.batch = max_bridge_batch;
  auto bridge = make_bridge(ctx.get_executor(), from, producer(store, "bridged", po));
  bool ended = false;
  asio::co_spawn(ctx, bridge->run(), [&](std::exception_ptr) { ended = true; });
  while (!bridge->counters().active) co_await sleep_for(std::chrono::microseconds(1000));
  for (std::uint64_t i = 0; i < n; ++i) {
    co_await sleep_for(std::chrono::microseconds(1000));
    auto body = fmt::format("{{\"n\":{},\"sent\":{}}}", i, now_us());
    if (publisher)
      publisher->publish("in", body, fmt::format("m-{}", i));
    else
      co_await redis::exec(c, redis::request("XADD", "in", "*", "type", "t", "payload", body));
    while (waits.size() <= i) co_await sleep_for(std::chrono::microseconds(100));
  }
  std::sort(waits.begin(), waits.end());
  fmt::print("mode=latency source={} n={} p50_us={:.0f} p99_us={:.0f}\n", source, n, waits[waits.size() / 2],
             waits[std::min(waits.size() - 1, waits.size() * 99 / 100)]);
  bridge->stop();
  while (!ended) co_await sleep_for(std::chrono::microseconds(1000));
  co_await w.stop(std::chrono::seconds(1));
  c.close();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print(stderr, "usage: {} REDIS_URL stream N | amqp N AMQP_PORT | latency N stream|amqp [AMQP_PORT]\n",
               argv[0]);
    return 2;
  }
  std::string url = argv[1], mode = argv[2];
  auto n = static_cast<std::uint64_t>(std::atoll(argv[3]));
  auto cfg = redis::config::from_url(url);
  auto stream_url = "redis-stream://" + url.substr(url.find("://") + 3);
  while (stream_url.ends_with("/")) stream_url.pop_back();
  asio::io_context ctx(1);
  std::exception_ptr failure;
  auto done = [&](std::exception_ptr e) {
    failure = e;
    ctx.stop();
  };
  if (mode == "stream")
    asio::co_spawn(ctx, stream_mode(ctx, cfg, stream_url, n, argc > 4 ? std::stoul(argv[4]) : 200), done);
  else if (mode == "amqp" && argc > 4)
    asio::co_spawn(ctx, amqp_mode(ctx, cfg, n, std::atoi(argv[4]), argc > 5 ? std::stoul(argv[5]) : 200), done);
  else if (mode == "latency" && argc > 4)
    asio::co_spawn(ctx, latency_mode(ctx, cfg, stream_url, n, argv[4], argc > 5 ? std::atoi(argv[5]) : 0), done);
  else {
    fmt::print(stderr, "unknown mode {}\n", mode);
    return 2;
  }
  ctx.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
      return 1;
    }
  }
  return 0;
}
