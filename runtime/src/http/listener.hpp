// A small HTTP/1.1 server (Boost.Beast) on an io_context: binds at construction, accepts until
// stop(), and hands each request of each connection to a handler, one request at a time per
// connection. The metrics endpoint and the dashboard serve through it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <functional>
#include <memory>
#include <string>

namespace jobrt::detail {

class http_listener {
 public:
  using request = boost::beast::http::request<boost::beast::http::string_body>;
  /// Answers one request on the stream (writing a response, or a stream of events); returns
  /// whether the connection may carry another request. An exception ends the connection.
  using handler = std::function<boost::asio::awaitable<bool>(boost::beast::tcp_stream&, request&)>;

  /// Binds `at`; throws std::runtime_error "<what>: cannot listen on HOST:PORT: <why>".
  http_listener(boost::asio::any_io_executor ex, const boost::asio::ip::tcp::endpoint& at, handler h, std::string what);
  ~http_listener();
  http_listener(const http_listener&) = delete;
  http_listener& operator=(const http_listener&) = delete;

  boost::asio::ip::tcp::endpoint local_endpoint() const;
  void start();
  /// Stops accepting and closes every connection (a request being answered ends with it), on
  /// the listener's strand: at once when called there, else as soon as the strand runs it.
  void stop();
  /// Stops as stop() does, and completes once no connection is left: the handler runs no more
  /// (one that was answering a request has ended). What the handler uses may go after it.
  boost::asio::awaitable<void> async_stop();

 private:
  struct state;
  std::shared_ptr<state> state_;
};

}  // namespace jobrt::detail
