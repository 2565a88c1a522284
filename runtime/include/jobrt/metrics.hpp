// Prometheus metrics: the text a scrape gets, and a small HTTP server (Boost.Beast) that serves
// it at GET /metrics on the worker's io_context.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/worker.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace jobrt {

/// One queue's part of a scrape: its workers in this process, and its counts in the backend
/// (counters kept as jobs move: nothing walks the queue) when the backend answered; without them
/// the queue-wide series of that queue are left out.
struct queue_metrics {
  std::string queue;
  std::vector<worker_metrics> workers;
  std::optional<queue_counts> counts;
};

/// jobrt's version, as the project's CMake names it ("0.1.0").
std::string_view version() noexcept;

/// The Prometheus text exposition (format 0.0.4) of these queues, with jobrt_build_info and the
/// process's own process_* series. Series named jobrt_queue_* describe a whole queue as the
/// backend counts it: every process serving that queue reports the same value, so aggregate them
/// with max by (queue), not sum; the others count this process's work and sum across processes.
std::string prometheus_text(const std::vector<queue_metrics>& queues);

/// Serves GET /metrics (anything else: 404) with what `render` makes, one connection at a time
/// per client, keep-alive honoured. Binds at construction (throws naming the address when it
/// cannot); start() accepts until stop(). A scrape being answered goes on after stop(): to
/// destroy what `render` uses, co_await async_stop() first.
class metrics_server {
 public:
  using render_fn = std::function<boost::asio::awaitable<std::string>()>;
  metrics_server(boost::asio::any_io_executor ex, const boost::asio::ip::tcp::endpoint& at, render_fn render);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  boost::asio::ip::tcp::endpoint local_endpoint() const;
  void start();
  void stop();
  /// Stops, and completes once no scrape is being answered: `render` runs no more.
  boost::asio::awaitable<void> async_stop();

 private:
  struct state;
  std::shared_ptr<state> state_;
};

/// Parses "HOST:PORT" ("127.0.0.1:9464", "[::1]:9464", ":9464" for loopback); throws
/// std::invalid_argument naming what is wrong.
boost::asio::ip::tcp::endpoint parse_listen_address(const std::string& text);

}  // namespace jobrt
