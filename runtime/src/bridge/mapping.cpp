// Messages into jobs (bridge_mapping), where a stream bridge reads (stream_source), and a
// bridge's metrics.
#include "bridge/storing.hpp"
#include "clock.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/redis/cluster.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <limits>
#include <stdexcept>

namespace jobrt {

namespace {

// The URL for a message: its password left out.
std::string shown(std::string_view url) {
  auto authority = url.find("://");
  auto at = url.find('@');
  if (authority == std::string_view::npos || at == std::string_view::npos || at < authority) return std::string(url);
  auto colon = url.find(':', authority + 3);
  if (colon == std::string_view::npos || colon > at) return std::string(url);
  return fmt::format("{}:***{}", url.substr(0, colon), url.substr(at));
}

[[noreturn]] void bad_url(std::string_view url, std::string_view why, std::string_view kind = "stream") {
  throw std::invalid_argument(fmt::format("{} URL '{}': {}", kind, shown(url), why));
}

// A URL parameter's key or value as it means: %XX decoded, and '+' a space (as redis:// reads them).
std::string decoded(boost::urls::pct_string_view text) {
  boost::urls::encoding_opts opts;
  opts.space_as_plus = true;
  return text.decode(opts);
}

// The text as a URL holds it: all but letters, digits, "-._~" and the sub-delimiters
// "!$'()*,;:@&=+" written as %XX, and those of `special` too (as where they stand they would
// mean something).
std::string percent_encoded(std::string_view text, std::string_view special) {
  constexpr std::string_view kept_marks = "-._~!$'()*,;:@&=+";
  std::string out;
  for (char c : text) {
    bool kept = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                kept_marks.find(c) != std::string_view::npos;
    if (kept && special.find(c) == std::string_view::npos)
      out += c;
    else
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
  }
  return out;
}

// A name given as a parameter (a group, consumer, queue or dead-letter name), decoded. A bare '+'
// is refused: redis:// reads it as a space, and earlier bridges kept it as a plus, so either
// reading could silently name another consumer group or queue.
std::string name_parameter(std::string_view url, const boost::urls::param_pct_view& encoded, std::string_view kind) {
  if (std::string_view(encoded.value).find('+') != std::string_view::npos)
    bad_url(url,
            fmt::format("parameter {} '{}' holds a bare '+': write %2B for a plus, %20 for a space",
                        std::string_view(encoded.key), std::string_view(encoded.value)),
            kind);
  return decoded(encoded.value);
}

// A whole number from min to max, as a URL parameter gives it.
std::int64_t parameter_number(std::string_view url, std::string_view key, std::string_view text, std::int64_t min,
                              std::int64_t max, std::string_view kind = "stream") {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > max)
    bad_url(url, fmt::format("parameter {} '{}' is not a whole number from {} to {}", key, text, min, max), kind);
  return v;
}

std::string default_consumer() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "bridge");
  return fmt::format("{}-{}", host, ::getpid());
}

}  // namespace

bridge_mapping bridge_mapping::from_json(const boost::json::value& v) {
  if (!v.is_object()) throw std::invalid_argument("bridge: must be an object");
  bridge_mapping m;
  for (const auto& [key, value] : v.as_object()) {
    std::string name(key);
    auto text = [&]() -> std::string {
      if (!value.is_string()) throw std::invalid_argument(fmt::format("bridge.{}: must be a string", name));
      return std::string(value.as_string());
    };
    auto field = [&]() {
      auto t = text();
      if (t.empty()) throw std::invalid_argument(fmt::format("bridge.{}: is empty", name));
      return t;
    };
    if (name == "type_field") {
      m.type_field = field();
    } else if (name == "type") {
      m.type = field();
    } else if (name == "payload_field") {
      m.payload_field = field();
    } else if (name == "id_field") {
      m.id_field = field();
    } else if (name == "group_field") {
      m.group_field = field();
    } else if (name == "keep_ms") {
      auto ms = value.is_int64()    ? value.as_int64()
                : value.is_uint64() ? static_cast<std::int64_t>(value.as_uint64())
                                    : 0;
      if (ms < 1 || ms > max_job_keep.count())
        throw std::invalid_argument(fmt::format("bridge.keep_ms: {} is not a whole number from 1 to {}",
                                                boost::json::serialize(value), max_job_keep.count()));
      m.keep = std::chrono::milliseconds(ms);
    } else {
      throw std::invalid_argument(fmt::format(
          "bridge: unknown field \"{}\" (known: type_field, type, payload_field, id_field, group_field, keep_ms)",
          name));
    }
  }
  return m;
}

mapped_message map_message(const bridge_message& m, const bridge_mapping& how) {
  mapped_message out;
  auto find = [&](const std::string& name) -> const std::string* {
    for (const auto& [key, value] : m.fields)
      if (key == name) return &value;
    return nullptr;
  };
  if (const auto* type = find(how.type_field)) {
    if (type->empty()) {
      out.rejected = fmt::format("field {} (the job's type) is empty", how.type_field);
      return out;
    }
    out.job.type = *type;
  } else if (!how.type.empty()) {
    out.job.type = how.type;
  } else {
    out.rejected = fmt::format("no field {} to give the job's type, and no default type", how.type_field);
    return out;
  }
  if (m.body) {
    boost::system::error_code ec;
    auto value = boost::json::parse(*m.body, ec);
    if (ec) {
      out.rejected = fmt::format("the message body is not JSON: {}", ec.message());
      return out;
    }
    out.job.payload = std::move(value);
  } else if (const auto* payload = find(how.payload_field)) {
    boost::system::error_code ec;
    auto value = boost::json::parse(*payload, ec);
    if (ec) {
      out.rejected = fmt::format("field {} is not JSON: {}", how.payload_field, ec.message());
      return out;
    }
    out.job.payload = std::move(value);
  } else {
    boost::json::object rest;
    for (const auto& [key, value] : m.fields)
      if (key != how.type_field && key != how.id_field && key != how.group_field) rest[key] = value;
    out.job.payload = std::move(rest);
  }
  const auto* id = find(how.id_field);
  if (id && id->empty()) {  // (no id: a delivery again would be a second job)
    out.rejected = fmt::format("field {} (the job's id) is empty", how.id_field);
    return out;
  }
  out.job.id = id ? *id : m.default_id;
  if (const auto* group = find(how.group_field)) out.job.group = *group;
  out.job.keep = how.keep;
  return out;
}

detail::sorted_batch detail::sort_batch(const std::vector<bridge_message>& batch, const bridge_mapping& how,
                                        const producer_options& opts) {
  sorted_batch out;
  out.jobs.reserve(batch.size());
  auto now_ms = detail::unix_ms();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto mapped = map_message(batch[i], how);
    if (mapped.rejected.empty()) {
      try {
        out.jobs.push_back(producer::encode(mapped.job, now_ms, opts));
        continue;
      } catch (const std::invalid_argument& bad) {
        mapped.rejected = bad.what();
      }
    }
    out.refused.emplace_back(i, std::move(mapped.rejected));
  }
  return out;
}

boost::asio::awaitable<void> detail::pause_unless_woken(boost::asio::steady_timer& wake, std::chrono::milliseconds d) {
  using namespace boost::asio::experimental::awaitable_operators;
  boost::asio::steady_timer t(wake.get_executor(), d);
  co_await (t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable)) ||
            wake.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable)));
}

boost::asio::awaitable<void> detail::stopped_for(boost::asio::steady_timer& wake, std::chrono::milliseconds grace) {
  co_await wake.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
  boost::asio::steady_timer t(wake.get_executor(), grace);
  co_await t.async_wait(boost::asio::use_awaitable);  // (a cancellation ends it: operation_aborted)
}

bridge::~bridge() = default;

std::unique_ptr<bridge> make_bridge(boost::asio::any_io_executor ex, std::string_view url, producer to,
                                    bridge_mapping how) {
  if (url.starts_with("amqp://") || url.starts_with("amqps://"))
    return std::make_unique<amqp_bridge>(std::move(ex), amqp_source::from_url(url), std::move(to), std::move(how));
  if (url.starts_with("redis-stream://") || url.starts_with("rediss-stream://") ||
      url.starts_with("redis-stream+sentinel://") || url.starts_with("rediss-stream+sentinel://"))
    return std::make_unique<stream_bridge>(std::move(ex), stream_source::from_url(url), std::move(to), std::move(how));
  auto scheme = url.substr(0, url.find(':'));
  throw std::invalid_argument(
      fmt::format("source URL: scheme '{}' is none of redis-stream://, rediss-stream://, redis-stream+sentinel://, "
                  "rediss-stream+sentinel://, amqp:// and amqps://",
                  scheme));
}

amqp_source amqp_source::from_url(std::string_view url) {
  auto bad = [&](std::string_view why) -> void {
    throw std::invalid_argument(fmt::format("AMQP URL '{}': {}", shown(url), why));
  };
  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) bad("not a URL (expected amqp://user:password@host:5672/vhost?queue=<queue>)");
  boost::urls::url_view u = *parsed;
  if (u.scheme() != "amqp" && u.scheme() != "amqps")
    bad(fmt::format("scheme '{}' is neither amqp:// nor amqps://", std::string_view(u.scheme())));
  amqp_source s;
  s.tls = u.scheme() == "amqps";
  if (s.tls) s.port = 5671;
  if (u.host().empty()) bad("the host is missing");
  s.host = u.host();
  if (u.has_port()) s.port = static_cast<std::uint16_t>(parameter_number(url, "port", u.port(), 1, 65535, "AMQP"));
  if (u.has_userinfo()) {
    s.user = u.user();
    s.password = u.password();
  }
  auto segments = u.encoded_segments();
  if (segments.size() > 1) bad("the path must be the vhost only (%2F for '/')");
  if (segments.size() == 1 && !(*segments.begin()).empty()) s.vhost = (*segments.begin()).decode();
  for (auto encoded : u.encoded_params()) {
    std::string key = decoded(encoded.key), value = decoded(encoded.value);
    if (value.empty()) bad(fmt::format("parameter '{}' is empty", key));
    if (key == "queue" || key == "dead")
      (key == "queue" ? s.queue : s.dead) = name_parameter(url, encoded, "AMQP");
    else if (key == "prefetch")
      s.prefetch = static_cast<std::uint16_t>(parameter_number(url, key, value, 1, 65535, "AMQP"));
    else if (key == "batch")
      s.batch = static_cast<std::size_t>(parameter_number(url, key, value, 1, max_bridge_batch, "AMQP"));
    else if (s.tls && key == "ca")
      s.tls_ca_file = value;
    else if (s.tls && key == "cert")
      s.tls_cert_file = value;
    else if (s.tls && key == "key")
      s.tls_key_file = value;
    else if (s.tls && key == "verify" && (value == "peer" || value == "none"))
      s.tls_verify = value == "peer";
    else if (s.tls && key == "verify")
      bad(fmt::format("verify='{}': it is 'peer' (the default) or 'none'", value));
    else
      bad(fmt::format("unknown parameter '{}' (known: queue, dead, prefetch, batch{})", key,
                      s.tls ? ", ca, cert, key, verify" : "; amqps:// also takes ca, cert, key, verify"));
  }
  if (s.tls_cert_file.empty() != s.tls_key_file.empty())
    bad("cert and key go together (a client certificate needs its key)");
  if (s.queue.empty()) bad("the queue is missing (?queue=<queue>)");
  if (s.dead.empty()) s.dead = s.queue + ".dead";
  if (s.dead == s.queue) bad("the dead-letter queue is the queue itself");
  return s;
}

std::string amqp_source::address() const {
  return fmt::format("{}://{}@{}:{}/{}?queue={}", tls ? "amqps" : "amqp", percent_encoded(user, ":@/?#"), host, port,
                     percent_encoded(vhost, "/?#"), percent_encoded(queue, "&=+#"));
}

stream_source stream_source::from_url(std::string_view url) {
  constexpr std::string_view expected =
      "expected redis-stream://host:port/<stream>?group=<group>, or "
      "redis-stream+sentinel://host:26379,host:26380/<primary>/<stream>?group=<group>";
  auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) bad_url(url, fmt::format("not a URL ({})", expected));
  std::string scheme(url.substr(0, scheme_end));
  bool sentinel = scheme.ends_with("+sentinel");
  auto base = std::string_view(scheme).substr(0, scheme.size() - (sentinel ? 9 : 0));
  if (base != "redis-stream" && base != "rediss-stream")
    bad_url(url, fmt::format("scheme '{}' is none of redis-stream://, rediss-stream://, redis-stream+sentinel:// "
                             "and rediss-stream+sentinel://",
                             scheme));
  // The authority may name several hosts (a cluster's nodes, or sentinels), which a URL parser
  // takes for a bad port: what follows it is parsed behind a stand-in host.
  auto authority_begin = scheme_end + 3;
  auto authority_end = std::min(url.find_first_of("/?#", authority_begin), url.size());
  auto authority = url.substr(authority_begin, authority_end - authority_begin);
  auto rest = fmt::format("x://h{}", url.substr(authority_end));
  auto parsed = boost::urls::parse_uri(rest);
  if (!parsed || authority.empty()) bad_url(url, fmt::format("not a URL ({})", expected));
  boost::urls::url_view u = *parsed;
  auto segments = u.encoded_segments();
  std::size_t want = sentinel ? 2 : 1;
  bool named = u.is_path_absolute() && segments.size() == want;
  for (auto segment : segments) named = named && !segment.empty();
  if (!named)
    bad_url(url, sentinel ? "the path must name the primary and the stream, and only them "
                            "(redis-stream+sentinel://host:26379/<primary>/<stream>)"
                          : "the path must name the stream, and only it (redis-stream://host:port/<stream>)");
  stream_source s;
  for (auto segment : segments) s.stream = segment.decode();  // the last (so "a%2Fb" names stream "a/b")
  std::string db, server_params;
  for (auto encoded : u.encoded_params()) {
    std::string key = decoded(encoded.key), value = decoded(encoded.value);
    if (value.empty()) bad_url(url, fmt::format("parameter '{}' is empty", key));
    bool for_server = key == "ca" || key == "cert" || key == "key" || key == "sni" || key == "verify" ||
                      (sentinel && (key == "sentinel_user" || key == "sentinel_password"));
    if (key == "group" || key == "consumer" || key == "dead") {
      (key == "group" ? s.group : key == "consumer" ? s.consumer : s.dead) = name_parameter(url, encoded, "stream");
    } else if (key == "db") {
      db = std::to_string(parameter_number(url, key, value, 0, std::numeric_limits<int>::max()));
    } else if (key == "lock_ttl_ms") {
      s.lock_ttl = std::chrono::milliseconds(parameter_number(url, key, value, 30, 600'000));
    } else if (key == "batch") {
      s.batch = static_cast<std::size_t>(parameter_number(url, key, value, 1, max_bridge_batch));
    } else if (for_server) {
      server_params += fmt::format("{}{}={}", server_params.empty() ? "?" : "&", std::string_view(encoded.key),
                                   std::string_view(encoded.value));  // (as written: redis:// decodes them)
    } else {
      bad_url(url, fmt::format("unknown parameter '{}' (known: group, consumer, dead, db, lock_ttl_ms, batch, "
                               "rediss-stream://'s ca, cert, key, sni and verify{})",
                               key, sentinel ? ", sentinel_user and sentinel_password" : ""));
    }
  }
  if (s.group.empty()) bad_url(url, "the consumer group is missing (?group=<group>)");
  if (s.consumer.empty()) s.consumer = default_consumer();
  if (s.dead.empty()) s.dead = s.stream + ":dead";
  if (s.dead == s.stream) bad_url(url, "the dead-letter stream is the stream itself");
  std::string server_scheme(base.substr(0, base.size() - 7));  // ("-stream" off)
  try {
    if (sentinel) {
      if (!db.empty()) server_params += fmt::format("{}db={}", server_params.empty() ? "?" : "&", db);
      s.server = redis::config::from_url(fmt::format("{}+sentinel://{}/{}{}", server_scheme, authority,
                                                     std::string_view(*segments.begin()), server_params));
    } else {
      auto seeds = redis::cluster_seeds(
          fmt::format("{}://{}{}{}", server_scheme, authority, db.empty() ? "" : "/" + db, server_params));
      if (seeds.size() > 1 && seeds.front().database != 0)
        bad_url(url, "several hosts are the nodes of a Redis Cluster, which has no db");
      s.server = seeds.front();
      s.other_seeds.assign(seeds.begin() + 1, seeds.end());
    }
  } catch (const std::invalid_argument& e) {
    std::string why = e.what();  // "... URL '<server url>': why": the why, of the URL given
    auto colon = why.find("': ");
    bad_url(url, colon == std::string::npos ? why : why.substr(colon + 3));
  }
  return s;
}

std::string stream_source::address() const {
  // The server's address (scheme://host:port/db, or scheme+sentinel://hosts/primary?db=N) made
  // the stream's: "-stream" in the scheme, the other seeds beside the host, the stream in the path.
  auto server_address = server.address();
  auto scheme_end = server_address.find("://");
  auto plus = std::min(server_address.find('+'), scheme_end);
  auto encoded = [](const std::string& name) { return percent_encoded(name, "/?#"); };  // (as the path holds it)
  std::string where;
  if (server.sentinels.empty()) {
    where = server_address.substr(scheme_end, server_address.rfind('/') - scheme_end);
    for (const auto& seed : other_seeds) {
      auto a = seed.address();
      auto begin = a.find("://") + 3;
      where += "," + a.substr(begin, a.rfind('/') - begin);
    }
  } else {
    auto hosts_end = server_address.find('/', scheme_end + 3);  // (after the sentinels, which hold none)
    where = fmt::format("://{}/{}", server_address.substr(scheme_end + 3, hosts_end - scheme_end - 3),
                        encoded(server.sentinel_master));
  }
  return fmt::format("{}-stream{}{}/{}?group={}{}", server_address.substr(0, plus),
                     server_address.substr(plus, scheme_end - plus), where, encoded(stream),
                     percent_encoded(group, "&=+#"),
                     server.database == 0 ? std::string() : fmt::format("&db={}", server.database));
}

std::string bridge_metrics_text(const bridge_counters& c, std::string_view source) {
  std::string label;
  for (char ch : source) {  // a label value escapes \, " and newlines
    if (ch == '\\' || ch == '"') label += '\\';
    label += ch == '\n' ? 'n' : ch;
  }
  std::string out;
  auto series = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
    out += fmt::format(
        "# HELP jobrt_bridge_{0} {1}\n# TYPE jobrt_bridge_{0} {2}\njobrt_bridge_{0}{{source=\"{3}\"}} {4}\n", name,
        help, type, label, value);
  };
  series("messages_received_total", "counter", "Messages read from the source.", c.received);
  series("jobs_enqueued_total", "counter", "Jobs stored from messages.", c.enqueued);
  series("duplicates_total", "counter", "Messages delivered again whose job was stored already.", c.duplicates);
  series("rejected_total", "counter", "Messages that could not become jobs (sent to the dead letters).", c.rejected);
  series("taken_over_total", "counter", "Pending messages taken over from another consumer.", c.taken_over);
  series("active", "gauge", "1 while this bridge holds its source's lock and consumes.", c.active ? 1 : 0);
  if (c.lag >= 0) series("lag", "gauge", "Messages at the source not yet read.", c.lag);
  if (c.pending >= 0) series("pending", "gauge", "Messages read and not yet acknowledged.", c.pending);
  return out;
}

}  // namespace jobrt
