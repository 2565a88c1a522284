// Where and how to connect to Redis.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace jobrt::redis {

/// Connection settings. Build one from a URL with config::from_url, then adjust timings.
struct config {
  std::string host = "127.0.0.1";
  std::string port = "6379";
  /// When not empty, connect to this unix socket instead of host:port.
  std::string unix_path;
  std::string username;               ///< empty: AUTH with the password only
  std::string password;               ///< empty: no AUTH
  int database = 0;                   ///< SELECTed when not 0
  std::string client_name = "jobrt";  ///< sent with CLIENT SETNAME; empty: not sent

  /// TLS (rediss://). The server's certificate is verified, against tls_ca_file or else the
  /// system's CAs, and must name the host (or tls_server_name); tls_verify is false only when a
  /// URL asks for it by name (verify=none).
  bool tls = false;
  std::string tls_ca_file;      ///< PEM file of the CAs to trust; empty: the system's
  std::string tls_cert_file;    ///< PEM certificate (chain) of this client, for mutual TLS
  std::string tls_key_file;     ///< its private key (PEM)
  std::string tls_server_name;  ///< sent as SNI and verified; empty: the host, unless an IP address
  bool tls_verify = true;

  std::chrono::milliseconds connect_timeout{2000};
  /// PING after one idle interval; the connection is dead when nothing was read for two.
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds reconnect_wait_min{50};
  std::chrono::milliseconds reconnect_wait_max{2000};
  /// A subscriber keeps at most this many messages that no receiver took yet. One more drops
  /// them all for a notice (message::confirmation, as after a reconnect: receivers re-check
  /// what they wait for), logged at warn and kept as last_error().
  std::size_t max_queued_messages = 10000;

  /// Parses `redis://[[user]:password@]host[:port][/db]`, the same with `rediss://` (TLS) and
  /// the parameters `ca`, `cert`, `key`, `sni` and `verify=none` (the tls_ fields), or
  /// `unix:///path[?db=N]`. Throws std::invalid_argument whose message names the part that is
  /// wrong.
  static config from_url(std::string_view url);

  /// The address as a URL, without the password (for logs and error messages).
  std::string address() const;
};

}  // namespace jobrt::redis
