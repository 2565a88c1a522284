// The dashboard: routes, the JSON API over the backend's operators' views, the event stream,
// and the pages (runtime/src/dashboard/assets, built into the library). See docs/DASHBOARD.md.
//
// (JSON is built by plain functions, not inside coroutines: GCC 12 miscompiles braced lists of
// temporaries in a coroutine body.)
#include <jobrt/dashboard.hpp>
#include <jobrt/error.hpp>
#include <jobrt/job.hpp>
#include <jobrt/job_status.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/scheduler.hpp>

#include "backend/job_codec.hpp"
#include "backend/views.hpp"
#include "clock.hpp"
#include "dashboard/assets.hpp"
#include "http/listener.hpp"
#include "strand.hpp"
#include "worker/loops.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/system/system_error.hpp>
#include <boost/url/parse.hpp>

#include <algorithm>
#include <charconv>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>

namespace jobrt {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using asio::awaitable;
using response = http::response<http::string_body>;

namespace {

// A request the API refuses, with the status and the words it answers with (and for 405, the
// method the route takes).
struct refusal : std::runtime_error {
  refusal(http::status s, const std::string& what, std::string_view allowed = {})
      : std::runtime_error(what), status(s), allow(allowed) {}
  http::status status;
  std::string allow;
};

// What every answer says besides its body: its type (to be taken as given), not to be stored,
// and that the pages load nothing from elsewhere, run no inline script and go in no frame.
template <class Body>
void set_headers(http::response<Body>& res, std::string_view type) {
  res.set(http::field::content_type, type);
  res.set(http::field::cache_control, "no-store");
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
}

response make_response(const dashboard::request& req, http::status status, std::string_view type, std::string body) {
  response res(status, req.version());
  set_headers(res, type);
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

response json_response(const dashboard::request& req, http::status status, const json::value& v) {
  return make_response(req, status, "application/json", json::serialize(v));
}

json::object error_object(std::string_view message) {
  json::object o;
  o["error"] = message;
  return o;
}

// A report as the backend keeps it, with when it came and how long ago that is.
json::object report_object(const worker_report& r) {
  auto o = detail::report_object(r);
  o["at"] = r.at_ms;
  o["heartbeat_age_ms"] = std::max<std::int64_t>(0, detail::unix_ms() - r.at_ms);
  return o;
}

// A query parameter, decoded; "" when absent.
std::string param(const boost::urls::url_view& u, std::string_view name) {
  auto it = u.params().find(name);
  return it == u.params().end() ? std::string() : std::string((*it).value);
}

// A query parameter that must be there and not empty.
std::string required(const boost::urls::url_view& u, std::string_view name) {
  auto value = param(u, name);
  if (value.empty()) throw refusal(http::status::bad_request, fmt::format("parameter '{}' is missing", name));
  return value;
}

std::size_t limit_param(const boost::urls::url_view& u, std::size_t fallback, std::size_t most) {
  auto text = param(u, "limit");
  if (text.empty()) return fallback;
  std::size_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n == 0 || n > most)
    throw refusal(http::status::bad_request, fmt::format("limit '{}' is not a number from 1 to {}", text, most));
  return n;
}

// The most dead letters one action takes: one script call, short enough not to keep Redis busy
// (a page of them, as the pages send).
constexpr std::size_t max_action_ids = 1000;

// The ids of an action's body: {"ids": ["...", ...]}.
std::vector<std::string> ids_of(const std::string& body) {
  boost::system::error_code ec;
  auto v = json::parse(body, ec);
  if (ec || !v.is_object()) throw refusal(http::status::bad_request, "the body is not a JSON object");
  auto* ids = v.as_object().if_contains("ids");
  if (!ids || !ids->is_array()) throw refusal(http::status::bad_request, "the body has no \"ids\" array");
  if (ids->as_array().size() > max_action_ids)
    throw refusal(http::status::bad_request,
                  fmt::format("\"ids\" holds {} ids: at most {} an action", ids->as_array().size(), max_action_ids));
  std::vector<std::string> out;
  for (const auto& id : ids->as_array()) {
    if (!id.is_string()) throw refusal(http::status::bad_request, "an entry of \"ids\" is not a string");
    out.emplace_back(id.as_string());
  }
  if (out.empty()) throw refusal(http::status::bad_request, "\"ids\" is empty: name the dead letters");
  return out;
}

// Whether a token given matches the one set, in a time that does not depend on where they
// differ.
bool same_token(std::string_view given, std::string_view set) {
  if (given.size() != set.size() || set.empty()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < set.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ set[i]);
  return diff == 0;
}

}  // namespace

struct dashboard::impl : std::enable_shared_from_this<impl> {
  impl(asio::any_io_executor e, backend& s, dashboard_options o) : ex(std::move(e)), store(s), opts(std::move(o)) {
    if (opts.queues.empty()) throw std::invalid_argument("dashboard: no queue to show");
    for (const auto& q : opts.queues) check_queue_name(q);
  }

  // A call to the backend within call_limit; what goes wrong becomes the answer's error.
  template <class T>
  awaitable<T> call(awaitable<T> c, std::string_view what) {
    try {
      co_return co_await detail::bounded(ex, std::move(c), opts.call_limit, what);
    } catch (const refusal&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw refusal(http::status::bad_request, e.what());
    } catch (const boost::system::system_error& e) {
      if (e.code() == make_error_code(errc::group_busy)) throw refusal(http::status::conflict, e.what());
      throw refusal(http::status::service_unavailable, fmt::format("the store failed {}: {}", what, e.what()));
    } catch (const std::exception& e) {
      auto why = opts.store_error ? opts.store_error() : std::string();
      throw refusal(http::status::service_unavailable,
                    fmt::format("the store failed {}: {}{}", what, e.what(), why.empty() ? "" : " (" + why + ")"));
    }
  }

  const std::string& queue_named(const std::string& name) const {
    auto it = std::find(opts.queues.begin(), opts.queues.end(), name);
    if (it == opts.queues.end())
      throw refusal(http::status::not_found, fmt::format("queue '{}' is not one this dashboard shows", name));
    return *it;
  }

  void may_act(const request& req) const {
    if (opts.read_only) throw refusal(http::status::forbidden, "the dashboard is read-only (--read-only)");
    if (opts.token.empty()) throw refusal(http::status::forbidden, "actions are off: the dashboard has no token");
    auto given = req.find("X-Jobrt-Token");
    if (given == req.end() || !same_token(given->value(), opts.token))
      throw refusal(http::status::unauthorized, "this action needs the dashboard's token, in the X-Jobrt-Token header");
  }

  // Every worker's report, a page of 100 at a time, up to 1,000 (enough for a dashboard's view).
  awaitable<std::pair<std::vector<worker_report>, bool>> all_reports(const std::string& q) {
    std::vector<worker_report> out;
    std::string cursor;
    for (int pages = 0; pages < 10; ++pages) {
      auto p = co_await call(store.workers(q, cursor, 100), "listing workers");
      out.insert(out.end(), std::make_move_iterator(p.items.begin()), std::make_move_iterator(p.items.end()));
      cursor = std::move(p.cursor);
      if (cursor.empty()) break;
    }
    co_return std::make_pair(std::move(out), !cursor.empty());
  }

  awaitable<json::value> overview() {
    json::array queues;
    for (const auto& q : opts.queues) {
      json::object o;
      o["name"] = q;
      try {
        auto counts = co_await call(store.counts(q), "counting the queue");
        auto [reports, more] = co_await all_reports(q);
        o["counts"] = detail::counts_object(counts);
        o["workers"] = reports.size();
        o["workers_more"] = more;
        std::int64_t running = 0;
        for (const auto& r : reports) running += r.running;
        o["running_reported"] = running;
        o["latency_ms"] =
            counts.next_enqueued_ms > 0 ? std::max<std::int64_t>(0, detail::unix_ms() - counts.next_enqueued_ms) : 0;
      } catch (const refusal& e) {
        o["error"] = e.what();
      }
      queues.push_back(std::move(o));
    }
    json::object out;
    out["queues"] = std::move(queues);
    out["actions"] = !opts.read_only && !opts.token.empty();
    out["read_only"] = opts.read_only;
    out["now"] = detail::unix_ms();
    co_return out;
  }

  awaitable<json::value> group_page(const std::string& q, const boost::urls::url_view& u) {
    auto found = co_await call(store.groups(q, param(u, "prefix"), param(u, "cursor"), limit_param(u, 50, 500)),
                               "listing groups");
    // Each group's state, asked all at once (on a server, pipelined on one connection).
    auto states = co_await detail::all_at_once<group_status>(ex, found.items.size(), [&](std::size_t i) {
      return call(store.group_of(q, found.items[i]), "reading a group");
    });
    for (const auto& e : states.errors)
      if (e) std::rethrow_exception(e);  // (a refusal)
    json::array groups;
    for (const auto& s : states.results) groups.push_back(detail::group_object(s));
    json::object out;
    out["groups"] = std::move(groups);
    out["cursor"] = found.cursor;
    co_return out;
  }

  awaitable<json::value> group(const std::string& q, const std::string& g) {
    auto s = co_await call(store.group_of(q, g), "reading the group");
    auto o = detail::group_object(s);
    o["running"] = nullptr;
    auto [reports, more] = co_await all_reports(q);
    for (const auto& r : reports)
      for (const auto& j : r.jobs)
        if (j.group == g) o["running"] = detail::running_object(r, j);
    co_return o;
  }

  awaitable<json::value> job(const std::string& q, const std::string& id, const std::string& g) {
    auto found = co_await call(find_job(store, q, id, g), "looking the job up");
    if (!found)
      throw refusal(
          http::status::not_found,
          fmt::format("job '{}' is not dead-lettered nor running, and not kept (it was enqueued without a "
                      "keep, or its keep ran out): only a kept job is found while it waits or once it is done",
                      id));
    co_return to_json(*found);
  }

  awaitable<json::value> dead_page(const std::string& q, const boost::urls::url_view& u) {
    dead_filter f;
    f.group = param(u, "group");
    f.type = param(u, "type");
    f.text = param(u, "text");
    auto found =
        co_await call(store.find_dead(q, f, param(u, "cursor"), limit_param(u, 50, 500)), "listing dead letters");
    json::array letters;
    for (const auto& d : found.items) letters.push_back(detail::dead_object(d));
    json::object out;
    out["letters"] = std::move(letters);
    out["cursor"] = found.cursor;
    co_return out;
  }

  awaitable<json::value> worker_page(const std::string& q, const boost::urls::url_view& u) {
    auto found = co_await call(store.workers(q, param(u, "cursor"), limit_param(u, 100, 500)), "listing workers");
    json::array workers;
    for (const auto& r : found.items) workers.push_back(report_object(r));
    json::object out;
    out["workers"] = std::move(workers);
    out["cursor"] = found.cursor;
    co_return out;
  }

  // The queue's schedules, a page: each as stored, or why it cannot be read.
  awaitable<json::value> schedule_page(const std::string& q, const boost::urls::url_view& u) {
    schedule_book book(store, q);
    auto found = co_await call(book.list(param(u, "cursor"), limit_param(u, 50, 500)), "listing the schedules");
    json::array items;
    for (const auto& s : found.items) {
      json::object o;
      o["name"] = s.spec.name;
      o["next"] = s.next.time_since_epoch().count();
      if (!s.error.empty()) {
        o["error"] = s.error;
      } else {
        o["timing"] = s.spec.timing.describe();
        o["type"] = s.spec.job.type;
        o["group"] = s.spec.job.group ? json::value(*s.spec.job.group) : json::value(nullptr);
        o["catch_up"] = s.spec.catch_up;
        o["job"] = to_json(s.spec.job);
      }
      items.push_back(std::move(o));
    }
    json::object out;
    out["schedules"] = std::move(items);
    out["cursor"] = found.cursor;
    co_return out;
  }

  awaitable<json::value> history(const std::string& q, const boost::urls::url_view& u) {
    auto minutes = param(u, "minutes");
    int n = 60;
    if (!minutes.empty()) {
      auto [end, ec] = std::from_chars(minutes.data(), minutes.data() + minutes.size(), n);
      if (ec != std::errc() || end != minutes.data() + minutes.size() || n < 1 || n > 1440)
        throw refusal(http::status::bad_request, fmt::format("minutes '{}' is not a number from 1 to 1440", minutes));
    }
    auto points = co_await call(store.history(q, std::chrono::minutes(n)), "reading the history");
    json::array out;
    for (const auto& p : points) {
      json::object o;
      o["minute"] = p.minute_ms;
      o["counts"] = detail::counts_object(p.counts);
      out.push_back(std::move(o));
    }
    json::object body;
    body["points"] = std::move(out);
    co_return body;
  }

  // /api/queues/<q>/... ; `rest` is what follows the queue's name.
  // /api/queues/<q>/<route>. Names (a group, an id) go in the query, never the path, where '.'
  // and '..' would be taken for steps by browsers.
  awaitable<json::value> queue_api(const request& req, const std::string& q, std::string_view route,
                                   const boost::urls::url_view& u) {
    // Each route takes one method: GET reads, POST acts.
    static constexpr std::string_view reads[] = {"history", "groups", "group",   "job",
                                                 "dead",    "letter", "workers", "schedules"};
    static constexpr std::string_view acts[] = {"group/pause", "group/resume", "dead/requeue",
                                                "dead/purge",  "job/cancel",   "schedule/remove"};
    bool reading = std::find(std::begin(reads), std::end(reads), route) != std::end(reads);
    bool acting = std::find(std::begin(acts), std::end(acts), route) != std::end(acts);
    if (!reading && !acting)
      throw refusal(http::status::not_found, fmt::format("no route '{}' in the dashboard's API", route));
    if (req.method() != (reading ? http::verb::get : http::verb::post))
      throw refusal(http::status::method_not_allowed,
                    fmt::format("'{}' takes {}", route, reading ? "GET" : "POST (with the token)"),
                    reading ? "GET" : "POST");
    if (acting) may_act(req);
    if (route == "history") co_return co_await history(q, u);
    if (route == "groups") co_return co_await group_page(q, u);
    if (route == "group") co_return co_await group(q, required(u, "name"));
    if (route == "job") co_return co_await job(q, required(u, "id"), param(u, "group"));
    if (route == "dead") co_return co_await dead_page(q, u);
    if (route == "letter") {
      auto id = required(u, "id");
      auto d = co_await call(store.dead_letter_of(q, id), "reading the dead letters");
      if (!d) throw refusal(http::status::not_found, fmt::format("no dead letter '{}'", id));
      co_return detail::dead_object(*d);
    }
    if (route == "workers") co_return co_await worker_page(q, u);
    if (route == "schedules") co_return co_await schedule_page(q, u);
    json::object out;
    if (route == "group/pause") {
      out["changed"] = co_await call(store.pause(q, required(u, "name")), "pausing the group");
    } else if (route == "group/resume") {
      auto mode = param(u, "skip") == "1" ? resume_mode::skip : resume_mode::retry;
      out["changed"] = co_await call(store.resume(q, required(u, "name"), mode), "resuming the group");
    } else if (route == "schedule/remove") {
      out["removed"] = co_await call(store.remove_schedule(q, required(u, "name")), "removing the schedule");
    } else if (route == "job/cancel") {
      auto outcome = co_await call(store.cancel(q, required(u, "id")), "cancelling the job");
      out["outcome"] = to_string(outcome);
    } else if (route == "dead/requeue") {
      auto done = co_await call(store.requeue(q, ids_of(req.body()), param(u, "at_head") == "1"), "requeueing");
      out["requeued"] = json::array(done.begin(), done.end());
    } else {
      out["purged"] = co_await call(store.purge(q, ids_of(req.body())), "purging");
    }
    co_return out;
  }

  // Whether the request's Host names one of opts.hosts (any when there are none).
  bool host_allowed(const request& req) const {
    if (opts.hosts.empty()) return true;
    std::string_view host = req[http::field::host];
    if (host.starts_with('[')) {
      host = host.substr(0, host.find(']') + 1);
    } else if (auto colon = host.rfind(':'); colon != std::string_view::npos) {
      host = host.substr(0, colon);
    }
    return std::find(opts.hosts.begin(), opts.hosts.end(), host) != opts.hosts.end();
  }

  awaitable<response> answer(const request& req, std::string_view path) {
    if (!host_allowed(req))
      co_return json_response(req, http::status::misdirected_request,
                              error_object("this dashboard answers only to the names it serves at (Host)"));
    auto parsed = boost::urls::parse_origin_form(path);
    if (!parsed) co_return json_response(req, http::status::bad_request, error_object("the address does not parse"));
    auto u = *parsed;
    std::vector<std::string> seg;
    for (auto s : u.segments()) seg.emplace_back(s);
    if (seg.size() == 1 && seg[0].empty()) seg.clear();  // "/"
    try {
      if (seg.empty() || (seg.size() == 1 && (seg[0] == "app.js" || seg[0] == "style.css"))) {
        if (req.method() != http::verb::get)
          throw refusal(http::status::method_not_allowed, "the pages take GET", "GET");
        if (seg.empty())
          co_return make_response(req, http::status::ok, "text/html; charset=utf-8", dashboard_assets::index);
        if (seg[0] == "app.js")
          co_return make_response(req, http::status::ok, "text/javascript; charset=utf-8", dashboard_assets::app);
        co_return make_response(req, http::status::ok, "text/css; charset=utf-8", dashboard_assets::style);
      }
      if (seg.size() < 2 || seg[0] != "api") throw refusal(http::status::not_found, "no such page");
      if (seg.size() == 2 && seg[1] == "events" && req.method() != http::verb::get)  // (a GET: serve())
        throw refusal(http::status::method_not_allowed, "'events' takes GET", "GET");
      if (seg.size() == 2 && seg[1] == "overview") {
        if (req.method() != http::verb::get)
          throw refusal(http::status::method_not_allowed, "'overview' takes GET", "GET");
        co_return json_response(req, http::status::ok, co_await overview());
      }
      if (seg.size() >= 4 && seg[1] == "queues") {
        const auto& q = queue_named(seg[2]);
        std::string route = seg[3];
        for (std::size_t i = 4; i < seg.size(); ++i) route += "/" + seg[i];
        co_return json_response(req, http::status::ok, co_await queue_api(req, q, route, u));
      }
      throw refusal(http::status::not_found, fmt::format("no {} in the dashboard's API", u.path()));
    } catch (const refusal& e) {
      auto res = json_response(req, e.status, error_object(e.what()));
      if (!e.allow.empty()) res.set(http::field::allow, e.allow);
      co_return res;
    }
  }

  // /api/events: the overview now and every live_period, as server-sent events, until the client
  // goes or stop().
  awaitable<void> events(beast::tcp_stream& stream, const request& req) {
    http::response<http::empty_body> head(http::status::ok, req.version());
    set_headers(head, "text/event-stream");
    head.keep_alive(false);  // (the events end with the connection)
    http::response_serializer<http::empty_body> sr(head);
    auto [hec, hn] = co_await http::async_write_header(stream, sr, asio::as_tuple(asio::use_awaitable));
    if (hec) co_return;
    auto timer = std::make_shared<asio::steady_timer>(stream.get_executor());
    {
      std::lock_guard lock(mutex);
      if (stopped) co_return;
      timers[timer.get()] = timer;
    }
    struct leave {
      impl& self;
      asio::steady_timer* t;
      ~leave() {
        std::lock_guard lock(self.mutex);
        self.timers.erase(t);
      }
    } guard{*this, timer.get()};
    for (;;) {
      auto data = "event: overview\ndata: " + json::serialize(co_await overview()) + "\n\n";
      stream.expires_after(std::chrono::seconds(10));  // a client that stops reading is let go
      auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(data), asio::as_tuple(asio::use_awaitable));
      if (wec) co_return;
      stream.expires_never();
      {
        std::lock_guard lock(mutex);  // (a stop() that came during the write finds no wait to cut)
        if (stopped) co_return;
        timer->expires_after(opts.live_period);
      }
      co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));  // (cut short by stop())
    }
  }

  void stop() {
    std::lock_guard lock(mutex);
    stopped = true;
    // Each cancel on its timer's executor: the stream may run on another thread.
    for (auto& [raw, weak] : timers)
      if (auto t = weak.lock()) asio::post(t->get_executor(), [t] { t->cancel(); });
  }

  asio::any_io_executor ex;
  backend& store;
  dashboard_options opts;
  std::mutex mutex;
  bool stopped = false;
  std::map<asio::steady_timer*, std::weak_ptr<asio::steady_timer>> timers;  // of the event streams
};

dashboard::dashboard(asio::any_io_executor ex, backend& store, dashboard_options opts)
    : impl_(std::make_shared<impl>(std::move(ex), store, std::move(opts))) {}

dashboard::~dashboard() { impl_->stop(); }

void dashboard::stop() { impl_->stop(); }

awaitable<bool> dashboard::serve(beast::tcp_stream& stream, const request& req, std::string_view path) {
  auto self = impl_;
  if (path.empty() || path.starts_with('?')) {  // mounted at /x, asked for /x[?...]: the pages'
    // links are relative to /x/
    std::string_view target = req.target();
    auto query = target.substr(target.size() - path.size());
    response res(http::status::moved_permanently, req.version());
    res.set(http::field::location, fmt::format("{}/{}", target.substr(0, target.size() - path.size()), query));
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    auto [ec, n] = co_await http::async_write(stream, res, asio::as_tuple(asio::use_awaitable));
    co_return !ec && req.keep_alive();
  }
  if (path == "/api/events" && req.method() == http::verb::get && self->host_allowed(req)) {
    co_await self->events(stream, req);
    co_return false;
  }
  auto res = co_await self->answer(req, path);
  auto [ec, n] = co_await http::async_write(stream, res, asio::as_tuple(asio::use_awaitable));
  co_return !ec && res.keep_alive();
}

struct dashboard_server::state {
  state(asio::any_io_executor ex, const asio::ip::tcp::endpoint& at, std::shared_ptr<dashboard> b)
      : board(std::move(b)),
        listener(
            std::move(ex), at,
            [board = board](beast::tcp_stream& stream, detail::http_listener::request& req) {
              return board->serve(stream, req, req.target());
            },
            "dashboard") {}
  std::shared_ptr<dashboard> board;
  detail::http_listener listener;
};

dashboard_server::dashboard_server(asio::any_io_executor ex, const asio::ip::tcp::endpoint& at,
                                   std::shared_ptr<dashboard> board)
    : state_(std::make_unique<state>(std::move(ex), at, std::move(board))) {}

dashboard_server::~dashboard_server() { stop(); }

asio::ip::tcp::endpoint dashboard_server::local_endpoint() const { return state_->listener.local_endpoint(); }

void dashboard_server::start() { state_->listener.start(); }

void dashboard_server::stop() {
  state_->listener.stop();
  state_->board->stop();
}

asio::awaitable<void> dashboard_server::async_stop() {
  stop();
  co_await state_->listener.async_stop();
}

}  // namespace jobrt
