#include <jobrt/redis/config.hpp>

#include <fmt/format.h>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <charconv>
#include <stdexcept>

namespace jobrt::redis {
namespace {

// The URL as an error may show it: a password in it becomes ***.
std::string without_password(std::string_view url) {
  auto start = url.find("://");
  if (start == std::string_view::npos) return std::string(url);
  start += 3;
  auto at = url.find('@', start);
  auto colon = url.find(':', start);
  if (at == std::string_view::npos || colon == std::string_view::npos || colon > at || url.find('/', start) < at)
    return std::string(url);
  return fmt::format("{}***{}", url.substr(0, colon + 1), url.substr(at));
}

[[noreturn]] void bad_url(std::string_view url, std::string_view why) {
  throw std::invalid_argument(fmt::format("invalid Redis URL '{}': {}", without_password(url), why));
}

int parse_db(std::string_view url, std::string_view text) {
  int db = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), db);
  if (ec != std::errc{} || end != text.data() + text.size() || db < 0)
    bad_url(url, fmt::format("database '{}' is not a non-negative number", text));
  return db;
}

}  // namespace

config config::from_url(std::string_view url) {
  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) bad_url(url, "not a URL (expected redis://host:port/db or unix:///path)");
  boost::urls::url_view u = *parsed;
  config cfg;
  std::string scheme = u.scheme();
  if (u.has_userinfo()) {
    cfg.username = u.user();
    cfg.password = u.password();
    // AUTH needs a password: without one the connection would log in as the default user, not
    // as the one named (an ACL user with nopass takes any password: redis://user:x@host).
    if (!cfg.username.empty() && cfg.password.empty())
      bad_url(url, fmt::format("user '{}' has no password (redis://user:password@host)", cfg.username));
  }
  if (scheme == "unix") {
    if (u.path().empty()) bad_url(url, "unix socket path is empty");
    if (!u.host().empty()) bad_url(url, fmt::format("unix URL has a host '{}'; use unix:///path", u.host()));
    cfg.unix_path = u.path();
    for (auto param : u.params()) {
      if (param.key == "db")
        cfg.database = parse_db(url, param.value);
      else
        bad_url(url, fmt::format("unknown parameter '{}'", param.key));
    }
    return cfg;
  }
  if (scheme != "redis" && scheme != "rediss")
    bad_url(url, fmt::format("scheme '{}' is none of redis://, rediss:// and unix://", scheme));
  cfg.tls = scheme == "rediss";
  if (u.host().empty()) bad_url(url, "host is empty");
  cfg.host = u.host();
  if (cfg.host.size() > 2 && cfg.host.front() == '[') cfg.host = cfg.host.substr(1, cfg.host.size() - 2);
  if (u.has_port()) {
    std::string_view port = u.port();
    if (port.empty()) {  // Boost.URL leaves a non-numeric port out; show what was written
      std::string_view rest = url.substr(url.find("://") + 3);
      rest = rest.substr(0, rest.find('/'));
      port = rest.substr(rest.rfind(':') + 1);
    }
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || value == 0 || value > 65535)
      bad_url(url, fmt::format("port '{}' is not a number from 1 to 65535", port));
    cfg.port = std::string(port);
  }
  std::string path = u.path();
  if (!path.empty() && path != "/") cfg.database = parse_db(url, std::string_view(path).substr(1));
  if (u.has_query() && !cfg.tls)
    bad_url(url, fmt::format("unexpected query '{}' (parameters are for rediss://)", u.query()));
  for (auto param : u.params()) {
    if (param.key == "ca") {
      cfg.tls_ca_file = param.value;
    } else if (param.key == "cert") {
      cfg.tls_cert_file = param.value;
    } else if (param.key == "key") {
      cfg.tls_key_file = param.value;
    } else if (param.key == "sni") {
      cfg.tls_server_name = param.value;
    } else if (param.key == "verify") {
      if (param.value != "none" && param.value != "peer")
        bad_url(url, fmt::format("verify='{}': it is 'peer' (the default) or 'none'", param.value));
      cfg.tls_verify = param.value == "peer";
    } else {
      bad_url(url, fmt::format("unknown parameter '{}' (rediss:// takes ca, cert, key, sni and verify)", param.key));
    }
    if (param.key != "verify" && param.value.empty()) bad_url(url, fmt::format("parameter '{}' is empty", param.key));
  }
  if (cfg.tls_cert_file.empty() != cfg.tls_key_file.empty())
    bad_url(url, "cert and key go together (a client certificate needs its key)");
  return cfg;
}

std::string config::address() const {
  if (!unix_path.empty()) return fmt::format("unix://{}", unix_path);
  auto scheme = tls ? "rediss" : "redis";
  if (host.find(':') != std::string::npos) return fmt::format("{}://[{}]:{}/{}", scheme, host, port, database);
  return fmt::format("{}://{}:{}/{}", scheme, host, port, database);
}

}  // namespace jobrt::redis
