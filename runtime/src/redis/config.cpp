#include <jobrt/redis/config.hpp>

#include <fmt/format.h>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace jobrt::redis {
namespace {

// The URL as an error may show it: the password in the user part becomes ***, and so does the
// value of every parameter not known to hold no secret (sentinel_password, a misspelt one).
std::string without_password(std::string_view url) {
  auto start = url.find("://");
  if (start == std::string_view::npos) return std::string(url);
  start += 3;
  std::string out(url);
  // From the first ':' to the last '@': a password may hold '/' or '@' (masking too much is
  // harmless).
  auto at = url.rfind('@');
  auto colon = url.find(':', start);
  if (at != std::string_view::npos && at > start && colon != std::string_view::npos && colon < at)
    out = fmt::format("{}***{}", url.substr(0, colon + 1), url.substr(at));
  auto query = out.find('?');
  if (query == std::string::npos) return out;
  std::string shown = out.substr(0, query + 1);
  std::string_view params = std::string_view(out).substr(query + 1);
  for (std::size_t b = 0; b <= params.size();) {
    auto e = std::min(params.find('&', b), params.size());
    auto param = params.substr(b, e - b);
    auto key = param.substr(0, param.find('='));
    bool plain = key == "db" || key == "ca" || key == "cert" || key == "key" || key == "sni" || key == "verify" ||
                 key == "sentinel_user";
    // (A word without '=' may be the rest of a value that held '&'.)
    shown += plain ? std::string(param) : key.size() == param.size() ? std::string("***") : fmt::format("{}=***", key);
    if (e < params.size()) shown += '&';
    b = e + 1;
  }
  return shown;
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

// The host and port of `u`, whose host and port are written `written` (to show a port that is
// not a number).
config::endpoint endpoint_of(std::string_view url, const boost::urls::url_view& u, std::string_view written,
                             std::string_view default_port) {
  if (u.host().empty()) bad_url(url, "host is empty");
  config::endpoint e{u.host(), std::string(default_port)};
  if (e.host.size() > 2 && e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
  if (u.has_port()) {
    std::string_view port = u.port();
    if (port.empty()) port = written.substr(written.rfind(':') + 1);  // Boost.URL leaves a non-numeric port out
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || value == 0 || value > 65535)
      bad_url(url, fmt::format("port '{}' is not a number from 1 to 65535", port));
    e.port = std::string(port);
  }
  return e;
}

std::string host_port(const config::endpoint& e) {
  if (e.host.find(':') != std::string::npos) return fmt::format("[{}]:{}", e.host, e.port);
  return fmt::format("{}:{}", e.host, e.port);
}

}  // namespace

config config::from_url(std::string_view url) {
  constexpr auto npos = std::string_view::npos;
  auto scheme_end = url.find("://");
  auto scheme = scheme_end == npos ? std::string_view() : url.substr(0, scheme_end);
  bool sentinel = scheme == "redis+sentinel" || scheme == "rediss+sentinel";
  // The host part as written (after any user and password), and under Sentinel, its hosts: the
  // URL is parsed with the first of them alone.
  std::string_view hosts_text;
  std::vector<std::string_view> hosts;
  std::string one(url);
  if (scheme_end != npos) {
    auto begin = scheme_end + 3;
    auto end = std::min(url.find_first_of("/?#", begin), url.size());
    auto at = url.substr(begin, end - begin).rfind('@');
    auto hosts_begin = at == npos ? begin : begin + at + 1;
    hosts_text = url.substr(hosts_begin, end - hosts_begin);
    if (sentinel) {
      for (std::size_t b = 0;;) {
        auto comma = hosts_text.find(',', b);
        hosts.push_back(hosts_text.substr(b, comma == npos ? npos : comma - b));
        if (comma == npos) break;
        b = comma + 1;
      }
      one = fmt::format("{}{}{}", url.substr(0, hosts_begin), hosts.front(), url.substr(end));
    }
  }
  auto parsed = boost::urls::parse_uri(one);
  if (!parsed)
    bad_url(url, sentinel ? "not a URL (expected redis+sentinel://host:26379,host:26380/master)"
                          : "not a URL (expected redis://host:port/db or unix:///path)");
  boost::urls::url_view u = *parsed;
  config cfg;
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
  if (scheme != "redis" && scheme != "rediss" && !sentinel)
    bad_url(url, fmt::format("scheme '{}' is none of redis://, rediss://, redis+sentinel://, rediss+sentinel:// and "
                             "unix://",
                             u.scheme()));
  cfg.tls = scheme.starts_with("rediss");
  std::string path = u.path();
  if (sentinel) {
    for (auto h : hosts) {
      if (h.empty()) bad_url(url, "a sentinel's host is empty");
      auto text = fmt::format("redis://{}", h);
      auto one_host = boost::urls::parse_uri(text);
      if (!one_host) bad_url(url, fmt::format("sentinel '{}' is not host[:port]", h));
      cfg.sentinels.push_back(endpoint_of(url, *one_host, h, "26379"));
    }
    if (path.size() < 2) bad_url(url, "the primary's name is missing (redis+sentinel://host:26379/<name>)");
    cfg.sentinel_master = path.substr(1);
  } else {
    auto e = endpoint_of(url, u, hosts_text, "6379");
    cfg.host = std::move(e.host);
    cfg.port = std::move(e.port);
    if (!path.empty() && path != "/") cfg.database = parse_db(url, std::string_view(path).substr(1));
  }
  if (u.has_query() && !cfg.tls && !sentinel) bad_url(url, "parameters are for rediss:// and redis+sentinel:// only");
  std::string_view takes = sentinel ? (cfg.tls ? "db, sentinel_user, sentinel_password, ca, cert, key, sni and verify"
                                               : "db, sentinel_user and sentinel_password")
                                    : "ca, cert, key, sni and verify";
  for (auto param : u.params()) {
    bool tls_param =
        param.key == "ca" || param.key == "cert" || param.key == "key" || param.key == "sni" || param.key == "verify";
    bool sentinel_param = param.key == "db" || param.key == "sentinel_user" || param.key == "sentinel_password";
    if ((tls_param && !cfg.tls) || (sentinel_param && !sentinel) || (!tls_param && !sentinel_param)) {
      if (!param.has_value)  // (it may be the rest of a password that held '&': not shown)
        bad_url(url, fmt::format("a parameter without a value ({}:// takes {})", u.scheme(), takes));
      bad_url(url, fmt::format("unknown parameter '{}' ({}:// takes {})", param.key, u.scheme(), takes));
    }
    if (param.key != "verify" && param.value.empty()) bad_url(url, fmt::format("parameter '{}' is empty", param.key));
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
    } else if (param.key == "db") {
      cfg.database = parse_db(url, param.value);
    } else if (param.key == "sentinel_user") {
      cfg.sentinel_username = param.value;
    } else {
      cfg.sentinel_password = param.value;
    }
  }
  if (cfg.tls_cert_file.empty() != cfg.tls_key_file.empty())
    bad_url(url, "cert and key go together (a client certificate needs its key)");
  if (!cfg.sentinel_username.empty() && cfg.sentinel_password.empty())
    bad_url(url, fmt::format("sentinel_user '{}' has no sentinel_password", cfg.sentinel_username));
  return cfg;
}

std::string config::address() const {
  if (!unix_path.empty()) return fmt::format("unix://{}", unix_path);
  auto scheme = tls ? "rediss" : "redis";
  if (!sentinels.empty()) {
    std::string list;
    for (const auto& s : sentinels) list += (list.empty() ? "" : ",") + host_port(s);
    if (database == 0) return fmt::format("{}+sentinel://{}/{}", scheme, list, sentinel_master);
    return fmt::format("{}+sentinel://{}/{}?db={}", scheme, list, sentinel_master, database);
  }
  return fmt::format("{}://{}/{}", scheme, host_port({host, port}), database);
}

config config::sentinel(std::size_t i) const {
  config at = *this;
  at.host = sentinels.at(i).host;
  at.port = sentinels.at(i).port;
  at.username = sentinel_username;
  at.password = sentinel_password;
  at.database = 0;
  at.sentinels.clear();
  at.sentinel_master.clear();
  at.sentinel_username.clear();
  at.sentinel_password.clear();
  return at;
}

}  // namespace jobrt::redis
