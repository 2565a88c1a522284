// The dashboard's JSON API, from C++: over the memory backend and a real redis-server, each
// route, the token and read-only mode, the event stream, and a store that does not answer.
// (The pages are tested in a browser: tests/dashboard.)
#include "support/redis_server.hpp"
#include "support/run.hpp"

#include <jobrt/dashboard.hpp>
#include <jobrt/memory_backend.hpp>
#include <jobrt/metrics.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/scheduler.hpp>
#include <jobrt/worker.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/json/parse.hpp>

#include <doctest/doctest.h>

#include <map>
#include <string>

namespace asio = boost::asio;
namespace json = boost::json;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;

namespace {

struct answer {
  int status = 0;
  std::string head;
  std::string body;
  json::value json() const { return json::parse(body); }
};

// One HTTP/1.0 request to the dashboard at `port` (the server closes after its answer).
awaitable<answer> ask(unsigned short port, std::string method, std::string target, std::string token = {},
                      std::string body = {}) {
  asio::ip::tcp::socket s(co_await asio::this_coro::executor);
  co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
  auto req = fmt::format("{} {} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n{}\r\n{}", method, target,
                         body.size(), token.empty() ? "" : "X-Jobrt-Token: " + token + "\r\n", body);
  co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
  std::string text;
  co_await asio::async_read(s, asio::dynamic_buffer(text), asio::as_tuple(asio::use_awaitable));
  answer a;
  auto end = text.find("\r\n\r\n");
  REQUIRE(end != std::string::npos);
  a.head = text.substr(0, end);
  a.body = text.substr(end + 4);
  a.status = std::stoi(text.substr(9, 3));
  co_return a;
}

job_spec make(std::string type, json::value payload, std::string group = {}) {
  job_spec s;
  s.type = std::move(type);
  s.payload = std::move(payload);
  if (!group.empty()) s.group = std::move(group);
  return s;
}

// A dashboard on the memory backend, for queue "q", with these options.
struct fixture {
  explicit fixture(asio::io_context& ctx, dashboard_options o = {}) : store(ctx.get_executor()) {
    if (o.queues.empty()) o.queues = {"q"};
    board = std::make_shared<dashboard>(ctx.get_executor(), store, o);
    server = std::make_unique<dashboard_server>(ctx.get_executor(),
                                                asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), board);
    server->start();
    port = server->local_endpoint().port();
  }
  memory_backend store;
  std::shared_ptr<dashboard> board;
  std::unique_ptr<dashboard_server> server;
  unsigned short port = 0;
};

dashboard_options with_token(std::string token) {
  dashboard_options o;
  o.token = std::move(token);
  return o;
}

}  // namespace

TEST_CASE("dashboard API: overview, groups by prefix, a group, and its pause and resume with the token") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    fixture f(ctx, with_token("s3cret"));
    producer p(f.store, "q");
    std::vector<job_spec> specs;
    for (int i = 0; i < 30; ++i)
      specs.push_back(make("t", json::object{{"i", i}}, fmt::format("{}:{}", i % 2 ? "acme" : "beta", i)));
    co_await p.enqueue_bulk(std::move(specs));

    auto o = co_await ask(f.port, "GET", "/api/overview");
    REQUIRE(o.status == 200);
    auto v = o.json();
    CHECK(v.at("queues").at(0).at("name") == "q");
    CHECK(v.at("queues").at(0).at("counts").at("enqueued") == 30);
    CHECK(v.at("queues").at(0).at("counts").at("groups") == 30);
    CHECK(v.at("actions") == true);
    CHECK(o.head.find("Content-Type: application/json") != std::string::npos);

    std::set<std::string> acme;
    std::string cursor;
    for (int pages = 0; pages < 100; ++pages) {
      auto g = co_await ask(f.port, "GET", "/api/queues/q/groups?prefix=acme%3A&limit=4&cursor=" + cursor);
      REQUIRE(g.status == 200);
      auto body = g.json();
      for (const auto& e : body.at("groups").as_array()) {
        acme.insert(std::string(e.at("group").as_string()));
        CHECK(e.at("depth") == 1);
        CHECK(e.at("head").at("type") == "t");
      }
      cursor = std::string(body.at("cursor").as_string());
      if (cursor.empty()) break;
    }
    CHECK(acme.size() == 15);

    auto one = co_await ask(f.port, "GET", "/api/queues/q/group?name=acme%3A3");
    REQUIRE(one.status == 200);
    CHECK(one.json().at("head").at("payload").at("i") == 3);
    CHECK(one.json().at("paused").is_null());
    CHECK(one.json().at("running").is_null());

    CHECK((co_await ask(f.port, "POST", "/api/queues/q/group/pause?name=acme%3A3")).status == 401);
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/group/pause?name=acme%3A3", "wrong!")).status == 401);
    auto paused = co_await ask(f.port, "POST", "/api/queues/q/group/pause?name=acme%3A3", "s3cret");
    REQUIRE(paused.status == 200);
    CHECK(paused.json().at("changed") == true);
    CHECK((co_await f.store.paused_groups("q")).size() == 1);
    auto seen = co_await ask(f.port, "GET", "/api/queues/q/group?name=acme%3A3");
    CHECK(seen.json().at("paused").at("halted") == false);
    auto resumed = co_await ask(f.port, "POST", "/api/queues/q/group/resume?name=acme%3A3", "s3cret");
    CHECK(resumed.json().at("changed") == true);
    CHECK((co_await f.store.paused_groups("q")).empty());

    CHECK((co_await ask(f.port, "GET", "/api/queues/other/groups")).status == 404);
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/nothing")).status == 404);
    CHECK((co_await ask(f.port, "DELETE", "/api/queues/q/groups")).status == 405);
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/group/pause?name=g")).status == 405);
    CHECK((co_await ask(f.port, "POST", "/api/overview")).status == 405);
    auto events_posted = co_await ask(f.port, "POST", "/api/events");
    CHECK(events_posted.status == 405);
    CHECK(events_posted.head.find("\r\nAllow: GET") != std::string::npos);
    CHECK((co_await ask(f.port, "GET", "/api/events?x=1")).status == 404);  // (the stream takes no query)
    auto acted_with_get = co_await ask(f.port, "GET", "/api/queues/q/group/resume?name=g");
    CHECK(acted_with_get.head.find("\r\nAllow: POST") != std::string::npos);
    CHECK((co_await ask(f.port, "PUT", "/app.js")).head.find("\r\nAllow: GET") != std::string::npos);
    auto nameless = co_await ask(f.port, "GET", "/api/queues/q/group");
    CHECK(nameless.status == 400);
    CHECK(nameless.json().at("error") == "parameter 'name' is missing");
    auto dots = co_await ask(f.port, "GET", "/api/queues/q/group?name=..");
    CHECK(dots.status == 200);
    CHECK(dots.json().at("group") == "..");
    auto bad = co_await ask(f.port, "GET", "/api/queues/q/groups?cursor=zzz");
    CHECK(bad.status == 400);
    CHECK(bad.json().at("error").as_string().find("zzz") != json::string::npos);
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/groups?limit=0")).status == 400);
  });
}

TEST_CASE("dashboard API: dead letters by filter, one by id, requeued and purged, and a job by id") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    fixture f(ctx, with_token("t0ken"));
    producer p(f.store, "q");
    std::vector<job_spec> specs;
    for (int i = 0; i < 12; ++i) specs.push_back(make(i % 3 ? "mail" : "import", json::object{{"i", i}}));
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co;
    co.worker = "w";
    co.max = 100;
    auto leased = co_await f.store.claim("q", co);
    REQUIRE(leased.size() == 12);
    std::vector<finish_item> items;
    for (std::size_t i = 0; i < leased.size(); ++i) {
      finish_item it;
      it.token = leased[i].token;
      it.kind = finish_kind::fail;
      it.error = i % 2 ? "SMTP <refused>" : "timeout";
      items.push_back(std::move(it));
    }
    co_await f.store.finish("q", "w", std::move(items), std::chrono::seconds(30));

    auto mail = co_await ask(f.port, "GET", "/api/queues/q/dead?type=mail&text=smtp&limit=100");
    REQUIRE(mail.status == 200);
    auto letters = mail.json().at("letters").as_array();
    for (const auto& d : letters) {
      CHECK(d.at("type") == "mail");
      CHECK(d.at("error") == "SMTP <refused>");  // as text: the API returns it as it is
    }
    CHECK(!letters.empty());
    auto id = std::string(letters.at(0).at("id").as_string());
    auto one = co_await ask(f.port, "GET", "/api/queues/q/letter?id=" + id);
    CHECK(one.json().at("id").as_string() == id);
    auto job = co_await ask(f.port, "GET", "/api/queues/q/job?id=" + id);
    CHECK(job.json().at("state") == "dead");
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/job?id=nope")).status == 404);
    // Kept jobs: one behind another in its group (pending, with its record), one done.
    auto kept = make("mail", json::object{{"i", 99}});
    kept.group = "kg";
    kept.keep = std::chrono::hours(1);
    kept.id = "kept-1";
    co_await p.enqueue(kept);
    kept.id = "kept-2";
    co_await p.enqueue(kept);
    auto behind = (co_await ask(f.port, "GET", "/api/queues/q/job?id=kept-2")).json();
    CHECK(behind.at("state") == "pending");
    CHECK(behind.at("job").at("payload").at("i") == 99);
    CHECK(behind.at("group").at("depth") == 2);
    auto first = co_await f.store.claim("q", co);
    REQUIRE(first.size() == 1);
    finish_item ack;
    ack.token = first[0].token;
    ack.unique_id = "kept-1";
    ack.result = R"({"sent":1})";
    std::vector<finish_item> acks(1, ack);
    co_await f.store.finish("q", "w", std::move(acks), std::chrono::seconds(30));
    auto done = (co_await ask(f.port, "GET", "/api/queues/q/job?id=kept-1")).json();
    CHECK(done.at("state") == "done");
    CHECK(done.at("at").as_int64() > 0);
    CHECK(done.at("job").at("type") == "mail");
    CHECK(done.at("result").at("sent") == 1);  // JSON, not text
    CHECK(behind.at("job").at("keep_ms") == 3600000);
    // kept-2, pending, cancelled: an action (with the token), then its state.
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/job/cancel?id=kept-2")).status == 401);
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/job/cancel?id=kept-2")).status == 405);
    auto cancelled = co_await ask(f.port, "POST", "/api/queues/q/job/cancel?id=kept-2", "t0ken");
    REQUIRE(cancelled.status == 200);
    CHECK(cancelled.json().at("outcome") == "cancelled");
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/job/cancel?id=kept-1", "t0ken")).json().at("outcome") == "done");
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/job/cancel?id=nope", "t0ken")).json().at("outcome") ==
          "not found");
    auto gone = (co_await ask(f.port, "GET", "/api/queues/q/job?id=kept-2")).json();
    CHECK(gone.at("state") == "cancelled");
    CHECK(gone.at("at").as_int64() > 0);

    auto requeue_body = fmt::format(R"({{"ids":["{}"]}})", id);
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/dead/requeue", "", requeue_body)).status == 401);
    auto requeued = co_await ask(f.port, "POST", "/api/queues/q/dead/requeue", "t0ken", requeue_body);
    REQUIRE(requeued.status == 200);
    CHECK(requeued.json().at("requeued").at(0).as_string() == id);
    CHECK((co_await f.store.counts("q")).dead == 11);
    auto empty = co_await ask(f.port, "POST", "/api/queues/q/dead/purge", "t0ken", R"({"ids":[]})");
    CHECK(empty.status == 400);
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/dead/purge", "t0ken", "not json")).status == 400);
    std::string too_many = R"({"ids":[)";  // (one script call an action: at most 1,000 ids)
    for (int i = 0; i < 1001; ++i) too_many += (i > 0 ? ",\"x" : "\"x") + std::to_string(i) + "\"";
    auto refused = co_await ask(f.port, "POST", "/api/queues/q/dead/purge", "t0ken", too_many + "]}");
    CHECK(refused.status == 400);
    CHECK(refused.json().at("error").as_string() == "\"ids\" holds 1001 ids: at most 1000 an action");
    auto all = (co_await ask(f.port, "GET", "/api/queues/q/dead?limit=100")).json();
    std::string ids = "[";
    for (const auto& d : all.at("letters").as_array())
      ids += (ids.size() > 1 ? ",\"" : "\"") + std::string(d.at("id").as_string()) + "\"";
    ids += "]";
    auto purged = co_await ask(f.port, "POST", "/api/queues/q/dead/purge", "t0ken", R"({"ids":)" + ids + "}");
    CHECK(purged.json().at("purged") == 11);
    CHECK((co_await f.store.counts("q")).dead == 0);
  });
}

TEST_CASE("dashboard API: a dashboard told its host names answers no other (DNS rebinding)") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    dashboard_options o;
    o.hosts = {"localhost", "127.0.0.1", "[::1]"};
    fixture f(ctx, o);
    CHECK((co_await ask(f.port, "GET", "/api/overview")).status == 200);  // Host: localhost
    auto raw = [&](std::string host) -> awaitable<std::string> {
      asio::ip::tcp::socket s(co_await asio::this_coro::executor);
      co_await s.async_connect({asio::ip::make_address("127.0.0.1"), f.port}, asio::use_awaitable);
      auto req = fmt::format("GET /api/overview HTTP/1.0\r\nHost: {}\r\n\r\n", host);
      co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
      std::string text;
      co_await asio::async_read(s, asio::dynamic_buffer(text), asio::as_tuple(asio::use_awaitable));
      co_return text;
    };
    CHECK((co_await raw("127.0.0.1:8080")).starts_with("HTTP/1.0 200"));
    CHECK((co_await raw("[::1]:8080")).starts_with("HTTP/1.0 200"));
    CHECK((co_await raw("attacker.example:8080")).starts_with("HTTP/1.0 421"));
    CHECK((co_await raw("attacker.example")).starts_with("HTTP/1.0 421"));
  });
}

TEST_CASE("dashboard API: the schedules, an unreadable one with why, and one removed with the token") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    fixture f(ctx, with_token("t0ken"));
    schedule_book book(f.store, "q");
    schedule_spec s;
    s.name = "nightly";
    s.timing = schedule_timing::cron("0 3 * * *", "Europe/Paris");
    s.job.type = "report";
    s.job.group = "tenant:7";
    s.catch_up = 2;
    auto added = co_await book.add(s);
    stored_schedule broken;
    broken.name = "broken";
    broken.spec = "{not json";
    broken.next_ms = 1;
    co_await f.store.put_schedule("q", broken);
    broken.name = "odd";
    broken.spec = R"({"every_ms":1000,"anchor_ms":0,"catch_up":0,"job":{"type":"t","colour":"red"}})";
    co_await f.store.put_schedule("q", broken);

    auto listed = co_await ask(f.port, "GET", "/api/queues/q/schedules");
    REQUIRE(listed.status == 200);
    auto body = listed.json();
    std::map<std::string, json::object> by_name;
    for (const auto& one : body.at("schedules").as_array())
      by_name[std::string(one.at("name").as_string())] = one.as_object();
    REQUIRE(by_name.size() == 3);
    CHECK(
        by_name["odd"].at("error") ==
        R"(schedule 'odd': its job: unknown field "colour": {"every_ms":1000,"anchor_ms":0,"catch_up":0,"job":{"type":"t","colour)"
        R"(":"red"}})");
    const auto& nightly = by_name["nightly"];
    CHECK(nightly.at("timing") == "cron '0 3 * * *' in Europe/Paris");
    CHECK(nightly.at("type") == "report");
    CHECK(nightly.at("group") == "tenant:7");
    CHECK(nightly.at("catch_up") == 2);
    CHECK(nightly.at("next") == added.next.time_since_epoch().count());
    CHECK(nightly.at("job").at("type") == "report");
    CHECK(by_name["broken"].at("error").as_string().size() > 0);
    CHECK(by_name["broken"].at("next") == 1);
    CHECK(body.at("cursor") == "");

    CHECK((co_await ask(f.port, "POST", "/api/queues/q/schedule/remove?name=nightly")).status == 401);
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/schedule/remove?name=nightly", "t0ken")).status == 405);
    auto removed = co_await ask(f.port, "POST", "/api/queues/q/schedule/remove?name=nightly", "t0ken");
    REQUIRE(removed.status == 200);
    CHECK(removed.json().at("removed") == true);
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/schedule/remove?name=nightly", "t0ken")).json().at("removed") ==
          false);
    CHECK((co_await ask(f.port, "POST", "/api/queues/q/schedule/remove", "t0ken")).status == 400);
    auto left = (co_await ask(f.port, "GET", "/api/queues/q/schedules")).json().at("schedules").as_array();
    REQUIRE(left.size() == 2);
    CHECK(left[0].at("name") != "nightly");
    CHECK(left[1].at("name") != "nightly");
  });
}

TEST_CASE("dashboard API: read-only and tokenless dashboards take no action") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    dashboard_options ro;
    ro.token = "x";
    ro.read_only = true;
    fixture f(ctx, ro);
    auto r = co_await ask(f.port, "POST", "/api/queues/q/group/pause?name=g", "x");
    CHECK(r.status == 403);
    CHECK(r.json().at("error").as_string().find("read-only") != json::string::npos);
    CHECK((co_await ask(f.port, "GET", "/api/overview")).json().at("actions") == false);
    fixture none(ctx);
    CHECK((co_await ask(none.port, "POST", "/api/queues/q/group/pause?name=g", "")).status == 403);
  });
}

TEST_CASE("dashboard API: workers, their running jobs, a group's lease holder, history and live events") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    dashboard_options o;
    o.live_period = std::chrono::milliseconds(100);
    fixture f(ctx, o);
    worker_options wo;
    wo.queue = "q";
    wo.id = "busy-1";
    wo.concurrency = 3;
    wo.reap_period = std::chrono::milliseconds(100);
    worker w(ctx.get_executor(), f.store, wo);
    bool release = false;
    w.add_handler("hold", [&](job_context&) -> awaitable<void> {
      while (!release) co_await sleep_for(std::chrono::milliseconds(10));
    });
    w.start();
    producer p(f.store, "q");
    auto spec = make("hold", json::object{}, "tenant-9");
    auto id = (co_await p.enqueue(spec)).id;
    json::value mine;
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          auto page = (co_await ask(f.port, "GET", "/api/queues/q/workers")).json();
          for (const auto& e : page.at("workers").as_array())
            if (e.at("id") == "busy-1" && e.at("running") == 1) mine = e;
          co_return !mine.is_null();
        },
        std::chrono::seconds(10)));
    CHECK(mine.at("concurrency") == 3);
    CHECK(mine.at("jobs").at(0).at("group") == "tenant-9");
    auto g = (co_await ask(f.port, "GET", "/api/queues/q/group?name=tenant-9")).json();
    CHECK(g.at("running").at("worker") == "busy-1");
    auto job = (co_await ask(f.port, "GET", "/api/queues/q/job?id=" + id)).json();
    CHECK(job.at("state") == "running");
    auto history = (co_await ask(f.port, "GET", "/api/queues/q/history?minutes=60")).json();
    CHECK(history.at("points").as_array().size() == 1);  // the worker stored this minute's
    CHECK((co_await ask(f.port, "GET", "/api/queues/q/history?minutes=0")).status == 400);

    // Events: the overview at once and every live_period.
    asio::ip::tcp::socket s(ctx);
    co_await s.async_connect({asio::ip::make_address("127.0.0.1"), f.port}, asio::use_awaitable);
    std::string req = "GET /api/events HTTP/1.1\r\nHost: localhost\r\n\r\n";
    co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
    std::string text, first;
    int events = 0;
    while (events < 3) {
      auto n = co_await asio::async_read_until(s, asio::dynamic_buffer(text), "\n\n", asio::use_awaitable);
      if (first.empty()) first = text.substr(0, n);  // the head and the first event
      if (text.substr(0, n).find("event: overview\n") != std::string::npos) ++events;
      text.erase(0, n);
    }
    CHECK(first.find("\r\nContent-Type: text/event-stream\r\n") != std::string::npos);
    CHECK(first.find("\r\nX-Content-Type-Options: nosniff\r\n") != std::string::npos);
    CHECK(first.find("\r\nContent-Security-Policy: ") != std::string::npos);
    CHECK(events == 3);
    f.board->stop();  // ends the stream
    auto [ec, n] = co_await asio::async_read(s, asio::dynamic_buffer(text), asio::as_tuple(asio::use_awaitable));
    CHECK(ec == asio::error::eof);
    release = true;
    co_await w.stop(std::chrono::seconds(5));
  });
}

TEST_CASE("dashboard API: a Redis that does not answer is an error in the answer, not a hang") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis::config dead;
    dead.host = "127.0.0.1";
    dead.port = std::to_string(free_port());  // nothing listens there
    redis_backend store(ctx.get_executor(), dead);
    dashboard_options o;
    o.queues = {"q"};
    o.call_limit = std::chrono::milliseconds(500);
    o.store_error = [&store] { return store.connection().last_error(); };
    auto board = std::make_shared<dashboard>(ctx.get_executor(), store, o);
    dashboard_server server(ctx.get_executor(), asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), board);
    server.start();
    auto port = server.local_endpoint().port();
    auto began = std::chrono::steady_clock::now();
    auto overview = co_await ask(port, "GET", "/api/overview");
    CHECK(overview.status == 200);
    CHECK(!overview.json().at("queues").at(0).at("error").as_string().empty());
    auto groups = co_await ask(port, "GET", "/api/queues/q/groups");
    CHECK(groups.status == 503);
    CHECK(groups.json().at("error").as_string().find("refused") != json::string::npos);
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(5));
    server.stop();
  });
}

TEST_CASE("dashboard API: the same over a real redis-server") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    redis_backend store(ctx.get_executor(), shared_redis());
    auto queue = key_prefix() + "dash";
    dashboard_options o;
    o.queues = {queue};
    o.token = "tok";
    auto board = std::make_shared<dashboard>(ctx.get_executor(), store, o);
    dashboard_server server(ctx.get_executor(), asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), board);
    server.start();
    auto port = server.local_endpoint().port();
    producer p(store, queue);
    auto spec = make("t", json::object{{"x", "<script>alert(1)</script>"}}, "g/with/slashes");
    co_await p.enqueue(spec);
    auto base = "/api/queues/" + queue;
    auto g = co_await ask(port, "GET", base + "/group?name=g%2Fwith%2Fslashes");
    REQUIRE(g.status == 200);
    CHECK(g.json().at("depth") == 1);
    CHECK(g.json().at("head").at("payload").at("x") == "<script>alert(1)</script>");
    // (A page reads a bounded part of the shared server's keys: the walk may take several.)
    std::vector<std::string> found;
    std::string cursor;
    for (int pages = 0; pages < 1000; ++pages) {
      auto page = (co_await ask(port, "GET", base + "/groups?prefix=g%2F&cursor=" + cursor)).json();
      for (const auto& e : page.at("groups").as_array()) found.emplace_back(e.at("group").as_string());
      cursor = std::string(page.at("cursor").as_string());
      if (cursor.empty()) break;
    }
    CHECK(found == std::vector<std::string>{"g/with/slashes"});
    CHECK((co_await ask(port, "POST", base + "/group/pause?name=g%2Fwith%2Fslashes", "tok")).json().at("changed") ==
          true);
    CHECK((co_await ask(port, "POST", base + "/group/resume?name=g%2Fwith%2Fslashes&skip=1", "tok")).status == 200);
    CHECK((co_await store.counts(queue)).dead == 1);  // skipped: its job went to the dead letters
    server.stop();
  });
}

TEST_CASE("dashboard server: stop() closes the connections it serves, and a body comes only with a POST") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    fixture f(ctx);
    auto connect = [&]() -> awaitable<asio::ip::tcp::socket> {
      asio::ip::tcp::socket s(ctx);
      co_await s.async_connect({asio::ip::make_address("127.0.0.1"), f.port}, asio::use_awaitable);
      co_return s;
    };
    // All it answers until it closes, given up after 5 s.
    auto rest = [&](asio::ip::tcp::socket& s) -> awaitable<std::string> {
      asio::steady_timer guard(ctx, std::chrono::seconds(5));
      guard.async_wait([&](boost::system::error_code ec) {
        if (!ec) s.close();
      });
      std::string text;
      co_await asio::async_read(s, asio::dynamic_buffer(text), asio::as_tuple(asio::use_awaitable));
      guard.cancel();
      co_return text;
    };
    {
      auto s = co_await connect();
      std::string req = "GET /api/overview HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello";
      co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
      CHECK((co_await rest(s)).empty());  // closed, its body not read
    }
    // A keep-alive connection, idle after its answer, ends with stop().
    auto s = co_await connect();
    std::string req = "GET /api/overview HTTP/1.1\r\nHost: localhost\r\n\r\n", text;
    co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
    auto head = co_await asio::async_read_until(s, asio::dynamic_buffer(text), "\r\n\r\n", asio::use_awaitable);
    CHECK(text.starts_with("HTTP/1.1 200"));
    auto at = text.find("Content-Length: ");
    REQUIRE(at != std::string::npos);
    auto length = std::stoul(text.substr(at + 16));
    if (text.size() < head + length) {
      std::string more(head + length - text.size(), '\0');
      co_await asio::async_read(s, asio::buffer(more), asio::use_awaitable);
    }
    auto began = std::chrono::steady_clock::now();
    f.server->stop();
    CHECK((co_await rest(s)).empty());
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(2));
  });
}

TEST_CASE("metrics server: async_stop() completes only once the scrape under way has ended") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    bool entered = false, rendered = false;
    asio::steady_timer gate(ctx, asio::steady_timer::time_point::max());  // holds the scrape
    metrics_server server(ctx.get_executor(), asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0),
                          [&]() -> awaitable<std::string> {
                            entered = true;
                            co_await gate.async_wait(asio::as_tuple(asio::use_awaitable));
                            rendered = true;
                            co_return std::string("up 1\n");
                          });
    server.start();
    asio::ip::tcp::socket s(ctx);
    co_await s.async_connect(server.local_endpoint(), asio::use_awaitable);
    std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
    REQUIRE(co_await eventually([&] { return entered; }));
    // Stopped while the scrape waits: the stop waits for it, not for the client.
    bool stopped = false, rendered_when_stopped = false;
    asio::co_spawn(ctx, server.async_stop(), [&](std::exception_ptr) {
      stopped = true;
      rendered_when_stopped = rendered;
    });
    co_await sleep_for(std::chrono::milliseconds(100));
    CHECK_FALSE(stopped);
    gate.cancel();
    REQUIRE(co_await eventually([&] { return stopped; }, std::chrono::seconds(5)));
    CHECK(rendered_when_stopped);
    // And with nothing under way it completes at once.
    co_await server.async_stop();
  });
}

TEST_CASE("metrics server: /metrics takes GET (405 and Allow for another method), another path is 404") {
  run([](asio::io_context& ctx) -> awaitable<void> {
    metrics_server server(ctx.get_executor(), asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0),
                          []() -> awaitable<std::string> { co_return std::string("up 1\n"); });
    server.start();
    auto ask_raw = [&](std::string method, std::string target) -> awaitable<std::string> {
      asio::ip::tcp::socket s(ctx);
      co_await s.async_connect(server.local_endpoint(), asio::use_awaitable);
      auto req = fmt::format("{} {} HTTP/1.0\r\nHost: localhost\r\n\r\n", method, target);
      co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
      std::string text;
      co_await asio::async_read(s, asio::dynamic_buffer(text), asio::as_tuple(asio::use_awaitable));
      co_return text;
    };
    auto got = co_await ask_raw("GET", "/metrics");
    CHECK(got.starts_with("HTTP/1.0 200"));
    CHECK(got.ends_with("\r\n\r\nup 1\n"));
    auto posted = co_await ask_raw("POST", "/metrics");
    CHECK(posted.starts_with("HTTP/1.0 405"));
    CHECK(posted.find("\r\nAllow: GET\r\n") != std::string::npos);
    CHECK((co_await ask_raw("GET", "/other")).starts_with("HTTP/1.0 404"));
    co_await server.async_stop();
  });
}
