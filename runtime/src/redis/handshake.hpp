// What a connection sends before anything else, and what the answers say, with no I/O: the
// connection writes `commands()` once it is connected and hands the replies to `check`.
#pragma once

#include <jobrt/redis/config.hpp>
#include <jobrt/redis/connection.hpp>
#include <jobrt/redis/reply.hpp>
#include <jobrt/redis/request.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt::redis::detail {

class handshake {
 public:
  /// AUTH (when the config has a password), SELECT (a database other than 0), CLIENT SETNAME (a
  /// client name), ROLE (under Sentinel), CLIENT ID, and a PING: a server still loading its data
  /// accepts the others but refuses PING with LOADING, so the connection is ready only once PING
  /// answers.
  explicit handshake(const config& cfg);

  /// The commands, in one write.
  const request& commands() const noexcept { return commands_; }
  /// How many replies they get.
  std::size_t replies() const noexcept { return names_.size(); }

  /// What the replies (one per command, in order) say.
  struct outcome {
    connect_failure failure = connect_failure::none;  ///< none: the connection is ready
    std::string why;                                  ///< for a failure: "<command> refused: <message>"
    std::int64_t client_id = 0;                       ///< CLIENT ID's answer, when ready
  };
  /// AUTH, SELECT or CLIENT refused, and a PING refused with NOPERM, are `denied` (the server
  /// refuses who we are or the database we ask for); PING refused with LOADING, or with anything
  /// else (BUSY, MASTERDOWN: the server's state), is `not_ready`; so is a ROLE other than
  /// master (the sentinels named a server that is a replica now). ROLE refused (an ACL without
  /// it) is let through. Throws std::invalid_argument
  /// when the count of replies is wrong.
  outcome check(const std::vector<reply>& replies) const;

 private:
  request commands_;
  std::vector<std::string_view> names_;
};

}  // namespace jobrt::redis::detail
