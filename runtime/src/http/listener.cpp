#include "http/listener.hpp"

#include "strand.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <stdexcept>

namespace jobrt::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Everything of a listener runs on one strand: the accept loop, each connection, stop().
struct http_listener::state {
  state(asio::any_io_executor ex, handler h) : strand(asio::make_strand(ex)), acceptor(strand), handle(std::move(h)) {}

  // Connections served at once; one more is closed as soon as it is accepted.
  static constexpr std::size_t max_connections = 256;

  static asio::awaitable<void> accept_loop(std::shared_ptr<state> self) {
    asio::steady_timer pause(self->strand);
    std::chrono::milliseconds wait{0};
    for (;;) {
      auto [ec, socket] = co_await self->acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) co_return;
      if (ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system ||
          ec == asio::error::no_buffer_space || ec == asio::error::no_memory) {
        // Out of descriptors or memory: the next accept would fail at once too. It waits, 5 ms
        // at first and twice as long each time up to 1 s, while this lasts.
        wait = std::clamp(wait * 2, std::chrono::milliseconds(5), std::chrono::milliseconds(1000));
        pause.expires_after(wait);
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
        continue;
      }
      if (ec) continue;  // a client that went away: accept the next
      wait = std::chrono::milliseconds(0);
      if (self->open.size() >= max_connections) continue;  // (closed as `socket` goes)
      asio::co_spawn(self->strand, serve(self, beast::tcp_stream(std::move(socket))), asio::detached);
    }
  }

  static asio::awaitable<void> serve(std::shared_ptr<state> self, beast::tcp_stream stream) {
    if (!self->acceptor.is_open()) co_return;  // stopped meanwhile
    self->open.insert(&stream);
    struct leave {
      state& s;
      beast::tcp_stream* stream;
      ~leave() {
        s.open.erase(stream);
        if (s.open.empty()) s.idle.cancel();  // (async_stop waits for it)
      }
    } guard{*self, &stream};
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(1 << 20);  // (an action's body is a list of ids)
      stream.expires_after(std::chrono::seconds(30));
      auto [hec, hn] = co_await http::async_read_header(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      if (hec) co_return;  // closed, timed out, too big, or not HTTP
      // A body only where one is read: an action's (POST).
      if (parser.get().method() != http::verb::post && (parser.chunked() || parser.content_length().value_or(0) > 0))
        co_return;
      auto [ec, n] = co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
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

  // Closes the acceptor and every connection (a request on its way ends with an error).
  void close() {
    boost::system::error_code ec;
    acceptor.close(ec);
    for (auto* stream : open) stream->socket().close(ec);
  }

  asio::strand<asio::any_io_executor> strand;
  tcp::acceptor acceptor;
  handler handle;
  std::set<beast::tcp_stream*> open;  // the connections being served
  // Never expires: its waits end, cancelled, when the last connection ends.
  asio::steady_timer idle{strand, asio::steady_timer::time_point::max()};
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
  asio::dispatch(state_->strand, [self = state_] { self->close(); });
}

asio::awaitable<void> http_listener::async_stop() {
  // On the strand, where `open` changes. A connection accepted but not yet served ends without
  // a request once the acceptor is closed.
  auto self = state_;
  auto close_and_wait = [self]() -> asio::awaitable<void> {
    self->close();
    while (!self->open.empty()) co_await self->idle.async_wait(asio::as_tuple(asio::use_awaitable));
  };
  co_await run_on(self->strand, close_and_wait());
}

}  // namespace jobrt::detail
