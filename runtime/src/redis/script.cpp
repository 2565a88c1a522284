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

boost::asio::awaitable<reply> script::run(connection& c, request evalsha) const {
  using boost::asio::as_tuple;
  using boost::asio::use_awaitable;
  // Keep a copy: after NOSCRIPT the same call goes out again, behind a SCRIPT LOAD.
  request again = evalsha;
  auto [ec, r] = co_await c.async_exec(std::move(evalsha), as_tuple(use_awaitable));
  if (ec == errc::server_error && r.error_message().starts_with("NOSCRIPT")) {
    request reload("SCRIPT", "LOAD", source_);
    reload.options = again.options;
    reload.append(again);
    std::tie(ec, r) = co_await c.async_exec(std::move(reload), as_tuple(use_awaitable));
    if (!ec) {
      // A script that does not compile fails at SCRIPT LOAD: that error is the one to show.
      auto& both = r.as_array();
      reply answer = std::move(both.at(both.at(0).is_error() ? 0 : 1));
      r = std::move(answer);
      if (r.is_error()) ec = errc::server_error;
    }
  }
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
    if (ec == errc::not_connected) what = c.last_error();
    // (With an empty what_arg, what() would read ": <message>".)
    if (what.empty()) throw boost::system::system_error(ec);
    throw boost::system::system_error(ec, what);
  }
  co_return r;
}

}  // namespace jobrt::redis
