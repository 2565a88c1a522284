#include <jobrt/redis/script.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>
#include <boost/uuid/detail/sha1.hpp>

#include <charconv>

namespace jobrt::redis {

script::script(std::string source) : source_(std::move(source)) {
  boost::uuids::detail::sha1 hash;
  hash.process_bytes(source_.data(), source_.size());
  unsigned int digest[5];
  hash.get_digest(digest);
  for (unsigned int word : digest) sha1_ += fmt::format("{:08x}", word);
}

// After NOSCRIPT: SCRIPT LOAD, and the same EVALSHA again behind it, in one request.
request script::reload(const request& evalsha) const {
  request r("SCRIPT", "LOAD", source_);
  r.options = evalsha.options;
  r.append(evalsha);
  return r;
}

// The EVALSHA's reply from a reload's two. A script that does not compile fails at SCRIPT LOAD:
// that error is the one to show.
void script::reloaded(boost::system::error_code& ec, reply& r) {
  if (ec) return;
  auto& both = r.as_array();
  reply answer = std::move(both.at(both.at(0).is_error() ? 0 : 1));
  r = std::move(answer);
  if (r.is_error()) ec = errc::server_error;
}

boost::asio::awaitable<reply> script::run(connection& c, request evalsha) const {
  using boost::asio::as_tuple;
  using boost::asio::use_awaitable;
  // Keep a copy: after NOSCRIPT the same call goes out again, behind a SCRIPT LOAD.
  request again = evalsha;
  auto [ec, r] = co_await c.async_exec(std::move(evalsha), as_tuple(use_awaitable));
  if (ec == errc::server_error && r.error_message().starts_with("NOSCRIPT")) {
    std::tie(ec, r) = co_await c.async_exec(reload(again), as_tuple(use_awaitable));
    reloaded(ec, r);
  }
  co_return result(ec, std::move(r), ec == errc::not_connected ? c.last_error() : std::string());
}

boost::asio::awaitable<reply> script::run(cluster_connection& c, std::vector<std::string> keys, request evalsha) const {
  request again = evalsha;
  auto [ec, r] = co_await c.try_exec(std::move(evalsha), keys);
  if (ec == errc::server_error && r.error_message().starts_with("NOSCRIPT")) {
    std::tie(ec, r) = co_await c.try_exec(reload(again), std::move(keys));  // (to the same node: same keys)
    reloaded(ec, r);
  }
  co_return result(ec, std::move(r), std::string());
}

// The reply of a run, or what it failed with, thrown.
reply script::result(boost::system::error_code ec, reply r, const std::string& not_connected) {
  if (ec == errc::server_error && r.error_message().starts_with("JOBRT:")) {
    // A refusal of jobrt's scripts, 'JOBRT:<errc> <message>': thrown as that errc.
    auto text = r.error_message().substr(6);
    int code = 0;
    auto [end, parsed] = std::from_chars(text.data(), text.data() + text.size(), code);
    if (parsed == std::errc{} && code > 0 && end != text.data() + text.size() && *end == ' ')
      throw boost::system::system_error(static_cast<errc>(code), std::string(end + 1, text.data() + text.size()));
  }
  if (ec) {
    std::string what = r.is_error() ? std::string(r.error_message()) : std::string();
    if (ec == errc::not_connected && !not_connected.empty()) what = not_connected;
    // (With an empty what_arg, what() would read ": <message>".)
    if (what.empty()) throw boost::system::system_error(ec);
    throw boost::system::system_error(ec, what);
  }
  return r;
}

}  // namespace jobrt::redis
