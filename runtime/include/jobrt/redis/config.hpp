// Where and how to connect to Redis.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

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

  /// Redis Sentinel (redis+sentinel://, rediss+sentinel://). When `sentinels` is not empty, the
  /// server is the primary they name `sentinel_master`: asked at every connect, from the sentinel
  /// that answered last on (host and port are not used), and a server that says it is a replica
  /// (ROLE) is refused. The user, password, database and TLS settings above are the primary's;
  /// the sentinels are reached with the same TLS settings and their own credentials.
  struct endpoint {
    std::string host;
    std::string port;
  };
  std::vector<endpoint> sentinels;
  std::string sentinel_master;
  std::string sentinel_username;  ///< empty: AUTH at the sentinels with the password only
  std::string sentinel_password;  ///< empty: no AUTH at the sentinels

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
  /// the parameters `ca`, `cert`, `key`, `sni` and `verify=none` (the tls_ fields),
  /// `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[?db=N]` (port
  /// 26379 by default; `sentinel_user` and `sentinel_password` parameters), the same with
  /// `rediss+sentinel://`, or `unix:///path[?db=N]`. Throws std::invalid_argument whose message
  /// names the part that is wrong.
  static config from_url(std::string_view url);

  /// The address as a URL, without the password (for logs and error messages).
  std::string address() const;
  /// Under Sentinel: how to reach sentinel `i` (its host and port, its credentials, the same TLS
  /// settings; no database, no sentinels).
  config sentinel(std::size_t i) const;
};

}  // namespace jobrt::redis
