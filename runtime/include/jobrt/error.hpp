// jobrt's error codes. Expected failures (network, timeouts, server replies) travel as
// boost::system::error_code; exceptions are kept for the user-facing boundary.
#pragma once

#include <boost/system/error_code.hpp>

#include <type_traits>

namespace jobrt {

enum class error {
  /// The request was not sent: no connection to the server yet (see connection::last_error()).
  not_connected = 1,
  /// The connection dropped after the request was written; it may or may not have run.
  connection_lost,
  /// The request's own timeout expired.
  timeout,
  /// The connection was closed by its owner.
  closed,
  /// The server sent a reply that cannot be read (not RESP, or arrays nested over 7 deep). The
  /// request it answered fails with it, and the connection is made again.
  protocol_error,
  /// The server answered with an error reply; the reply carries its message.
  server_error,
  /// A blocking command (BLMOVE, SUBSCRIBE, ...) was given to the shared connection.
  blocking_command_on_shared_connection,
  /// Nothing was read from the server for two health intervals.
  health_check_failed,
  /// The connection handshake (AUTH, SELECT, CLIENT SETNAME) was refused.
  handshake_failed,
  /// The request is empty, holds pub/sub commands and the connection is not a subscriber, or
  /// would disturb every other request on the connection (request::disturbs_connection).
  invalid_request,
};

/// The category of jobrt::error.
const boost::system::error_category& error_category() noexcept;

inline boost::system::error_code make_error_code(error e) noexcept { return {static_cast<int>(e), error_category()}; }

}  // namespace jobrt

template <>
struct boost::system::is_error_code_enum<jobrt::error> : std::true_type {};
