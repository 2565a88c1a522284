// jobrt's error codes, one enum for the connection and both backends. Expected failures
// (network, timeouts, server replies) travel as boost::system::error_code; exceptions are kept
// for the user-facing boundary. A queue's refusals are thrown as boost::system::system_error
// with the same code by both backends; on Redis the Lua scripts send them as the error reply
// 'JOBRT:<number> <message>' (docs/PROTOCOL.md), the number being the errc value.
#pragma once

#include <boost/system/error_code.hpp>

#include <type_traits>

namespace jobrt {

enum class errc {
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
  /// A write asked to be replicated (durability::replicated) is at the primary, but fewer
  /// replicas than asked acknowledged it in time: a failover now might lose it.
  not_replicated,

  // --- a queue's refusals (nothing was stored or changed) ---

  /// An enqueue's job count is not a whole number, or does not match its arguments.
  bad_batch = 20,
  /// A producer's job id holds '|', is all digits (as the ids the queue assigns), or starts or
  /// ends with white space.
  bad_job_id = 21,
  /// A job's "max" (attempts) is below 1 or not whole.
  bad_max_attempts = 22,
  /// A job's due time is not '', '+<ms>' or at most 15 digits of ms since the epoch.
  bad_due = 23,
  /// resume(skip) while the group's head job runs or waits in the ready list.
  group_busy = 24,
  /// The queue is stored with another number of shards than the one given.
  shards_mismatch = 25,
  /// A job would make its group hold more jobs than its max_group_size: the batch was refused.
  group_full = 26,
};

/// The category of jobrt::errc.
const boost::system::error_category& error_category() noexcept;

inline boost::system::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

}  // namespace jobrt

template <>
struct boost::system::is_error_code_enum<jobrt::errc> : std::true_type {};
