#include "http/listener.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>

#include <chrono>
#include <stdexcept>

namespace jobrt::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct http_listener::state {
  state(asio::any_io_executor ex, handler h) : acceptor(std::move(ex)), handle(std::move(h)) {}

  static asio::awaitable<void> accept_loop(std::shared_ptr<state> self) {
    for (;;) {
      auto [ec, socket] = co_await self->acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) co_return;
      if (ec) continue;  // a client that went away: accept the next
      asio::co_spawn(self->acceptor.get_executor(), serve(self, beast::tcp_stream(std::move(socket))), asio::detached);
    }
  }

  static asio::awaitable<void> serve(std::shared_ptr<state> self, beast::tcp_stream stream) {
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(1 << 20);  // (an action's body is a list of ids)
      stream.expires_after(std::chrono::seconds(30));
      auto [ec, n] = co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;  // closed, timed out, too big, or not HTTP
      // The handler's answer, written within the same bound (a client that stops reading is
      // let go); a handler that streams sets its own per write.
      stream.expires_after(std::chrono::seconds(30));
      auto req = parser.release();
      bool again = false;
      try {
        again = co_await self->handle(stream, req);
      } catch (const std::exception&) {
        co_return;
      }
      if (!again || !self->acceptor.is_open()) co_return;
    }
  }

  tcp::acceptor acceptor;
  handler handle;
};

http_listener::http_listener(asio::any_io_executor ex, const tcp::endpoint& at, handler h, std::string what)
    : state_(std::make_shared<state>(std::move(ex), std::move(h))) {
  auto& acceptor = state_->acceptor;
  boost::system::error_code ec;
  acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("{}: cannot listen on {}:{}: {}", what, at.address().to_string(), at.port(), ec.message()));
}

http_listener::~http_listener() { stop(); }

tcp::endpoint http_listener::local_endpoint() const { return state_->acceptor.local_endpoint(); }

void http_listener::start() {
  asio::co_spawn(state_->acceptor.get_executor(), state::accept_loop(state_), asio::detached);
}

void http_listener::stop() {
  boost::system::error_code ec;
  state_->acceptor.close(ec);
}

}  // namespace jobrt::detail
