// RESP2 parsing with hiredis' reader (only the parser of hiredis is used: Asio owns the
// socket). The reader builds jobrt::redis::reply values directly, with no copy in between.
#pragma once

#include <jobrt/redis/reply.hpp>

#include <cstddef>
#include <memory>
#include <string_view>

struct redisReader;

namespace jobrt::redis::detail {

class resp_parser {
 public:
  enum class result { reply, need_more, error };

  resp_parser();
  ~resp_parser();
  resp_parser(const resp_parser&) = delete;
  resp_parser& operator=(const resp_parser&) = delete;

  /// Appends bytes read from the socket.
  void feed(const char* data, std::size_t size);
  /// Takes the next complete reply, if there is one.
  result next(reply& out);
  /// Why the last next() returned result::error.
  std::string_view error_message() const noexcept;
  /// Drops everything buffered (after a reconnect).
  void reset();

 private:
  std::unique_ptr<reply> root_;  // where each reply is built (a stable address for hiredis)
  redisReader* reader_;
};

}  // namespace jobrt::redis::detail
