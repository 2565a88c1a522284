// The web dashboard: pages and a JSON API (docs/DASHBOARD.md) over a backend's operators'
// views, served by `jobrt dashboard` (dashboard_server) or mounted under a path of a host
// program's own Boost.Beast server (dashboard::serve; runtime/examples/http_server.cpp).
#pragma once

#include <jobrt/backend.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt {

struct dashboard_options {
  std::vector<std::string> queues;  ///< the queues it shows (at least one)
  /// What an action (pause, resume, requeue, purge) must send in the X-Jobrt-Token header.
  /// Empty: none is taken (as read_only).
  std::string token;
  bool read_only = false;  ///< no actions at all
  /// The most a call to the backend may take: past it, the page shows the store's error.
  std::chrono::milliseconds call_limit{3000};
  std::chrono::milliseconds live_period{1000};  ///< between two events of /api/events
  /// The names a request's Host header may give (without its port); empty: any. Give a
  /// dashboard on loopback only loopback names ("localhost", "127.0.0.1", "[::1]": jobrt
  /// dashboard does), so that a web page elsewhere cannot reach it through a name of its own
  /// that it points at 127.0.0.1 (DNS rebinding).
  std::vector<std::string> hosts;
  /// What the store's connection last said went wrong ("" if nothing), added to an error when
  /// a call got no answer: redis_backend::connection().last_error(), say.
  std::function<std::string()> store_error;
};

class dashboard {
 public:
  using request = boost::beast::http::request<boost::beast::http::string_body>;

  /// The backend must outlive the object. Throws std::invalid_argument for no queue, or a name
  /// that cannot name one.
  dashboard(boost::asio::any_io_executor ex, backend& store, dashboard_options opts);
  ~dashboard();
  dashboard(const dashboard&) = delete;
  dashboard& operator=(const dashboard&) = delete;

  /// Answers `req`, whose target is `path` below where the dashboard is mounted ("" or "/..."):
  /// writes the response to `stream` (for /api/events, a stream of server-sent events until the
  /// client goes or stop()). Returns whether the connection may carry another request.
  boost::asio::awaitable<bool> serve(boost::beast::tcp_stream& stream, const request& req, std::string_view path);
  /// Ends the event streams.
  void stop();

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// `jobrt dashboard`: a dashboard at its own address. Binds at construction (throws naming the
/// address when it cannot); start() accepts until stop(). A request being answered goes on after
/// stop(): to destroy the backend the dashboard reads, co_await async_stop() first.
class dashboard_server {
 public:
  dashboard_server(boost::asio::any_io_executor ex, const boost::asio::ip::tcp::endpoint& at,
                   std::shared_ptr<dashboard> board);
  ~dashboard_server();
  dashboard_server(const dashboard_server&) = delete;
  dashboard_server& operator=(const dashboard_server&) = delete;

  boost::asio::ip::tcp::endpoint local_endpoint() const;
  void start();
  void stop();
  /// Stops, and completes once no request is being answered.
  boost::asio::awaitable<void> async_stop();

 private:
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace jobrt
