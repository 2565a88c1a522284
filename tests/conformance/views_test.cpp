// The operators' views (what the dashboard reads), on every backend: workers' reports, the
// per-minute history, groups by prefix, a group's state, and dead letters by filter, each walked
// page by page with its cursor.
#include "conformance/conformance.hpp"

#include <set>

namespace {

// Leases every ready job and fails it with "<error prefix> <i>", i being its payload's "i".
awaitable<void> fail_all(backend& b, const std::string& queue, const std::string& error_prefix) {
  claim_options o;
  o.worker = "w";
  o.max = 1000;
  auto jobs = co_await b.claim(queue, o);
  std::vector<finish_item> items;
  for (auto& c : jobs) {
    finish_item f;
    f.token = c.token;
    f.kind = finish_kind::fail;
    auto body = boost::json::parse(c.job.body);
    f.error = fmt::format("{} {}", error_prefix, body.at("payload").at("i").as_int64());
    items.push_back(std::move(f));
  }
  co_await b.finish(queue, "w", std::move(items), std::chrono::seconds(30));
}

}  // namespace

CONFORMANCE("views: worker reports are listed page by page until they run out") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    for (int i = 0; i < 5; ++i) {
      worker_report r;
      r.id = fmt::format("w{}", i);
      r.host = "h";
      r.pid = 100 + i;
      r.concurrency = 4;
      r.running = 1;
      r.jobs.push_back({"17", "g<b>", "import", 1234});
      co_await store.report_worker(b.queue(), r, i == 0 ? std::chrono::milliseconds(300) : std::chrono::seconds(60));
    }
    std::map<std::string, worker_report> seen;
    std::string cursor;
    int pages = 0;
    do {
      auto p = co_await b.make().workers(b.queue(), cursor, 2);
      for (auto& r : p.items) seen[r.id] = r;
      cursor = p.cursor;
      REQUIRE(++pages < 20);
    } while (!cursor.empty());
    REQUIRE(seen.size() == 5);
    const auto& w3 = seen.at("w3");
    CHECK(w3.pid == 103);
    CHECK(w3.concurrency == 4);
    REQUIRE(w3.jobs.size() == 1);
    CHECK(w3.jobs[0].group == "g<b>");
    CHECK(w3.jobs[0].since_ms == 1234);
    CHECK(w3.at_ms > 0);
    co_await sleep_for(std::chrono::milliseconds(400));
    auto after = co_await b.make().workers(b.queue(), "", 100);
    std::set<std::string> ids;
    for (auto& r : after.items) ids.insert(r.id);
    CHECK(ids == std::set<std::string>{"w1", "w2", "w3", "w4"});
    CHECK(after.cursor.empty());
  });
}

CONFORMANCE("views: a running worker reports its jobs and records the queue's history") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(2);
    o.id = "reporter";
    o.reap_period = std::chrono::milliseconds(100);
    worker w(ctx.get_executor(), b.make(), o);
    bool release = false;
    w.add_handler("hold", [&](job_context&) -> awaitable<void> {
      while (!release) co_await sleep_for(std::chrono::milliseconds(10));
    });
    w.start();
    producer p(b.make(), b.queue());
    auto spec = make_job("hold", {}, "tenant-7");
    auto id = co_await p.enqueue(spec);
    worker_report mine;
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          auto page = co_await b.make().workers(b.queue(), "", 10);
          for (auto& r : page.items)
            if (r.id == "reporter" && r.running == 1) mine = r;
          co_return mine.running == 1;
        },
        std::chrono::seconds(10)));
    CHECK(mine.concurrency == 2);
    CHECK(mine.pid == ::getpid());
    CHECK(mine.started_ms > 0);
    REQUIRE(mine.jobs.size() == 1);
    CHECK(mine.jobs[0].id == id.id);
    CHECK(mine.jobs[0].group == "tenant-7");
    CHECK(mine.jobs[0].type == "hold");
    // The minute's history point, stored by the worker (one a minute, whoever comes first).
    std::vector<history_point> points;
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          points = co_await b.make().history(b.queue(), std::chrono::minutes(60));
          co_return !points.empty();
        },
        std::chrono::seconds(10)));
    CHECK(!(co_await b.make().claim_history(b.queue())));  // (this minute has its point)
    release = true;
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("views: one history point a minute, with the counts given") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    // One caller a minute is to record (a minute may turn between the calls: then both are).
    auto claimed_at = std::chrono::system_clock::now();
    CHECK(co_await store.claim_history(b.queue()));
    bool again_claimed = co_await b.make().claim_history(b.queue());
    auto minute_now = [](auto t) { return std::chrono::duration_cast<std::chrono::minutes>(t.time_since_epoch()); };
    if (minute_now(claimed_at) == minute_now(std::chrono::system_clock::now())) CHECK(!again_claimed);
    queue_counts c;
    c.enqueued = 10;
    c.completed = 7;
    c.failed = 1;
    c.ready_lanes = 3;
    // (A minute may turn between the calls: then the second stores too, as the next minute's.)
    auto before = std::chrono::system_clock::now();
    CHECK(co_await store.record_history(b.queue(), c));
    bool again = co_await store.record_history(b.queue(), c);
    auto minute_of = [](auto t) { return std::chrono::duration_cast<std::chrono::minutes>(t.time_since_epoch()); };
    if (minute_of(before) == minute_of(std::chrono::system_clock::now())) CHECK(!again);
    auto points = co_await b.make().history(b.queue(), std::chrono::minutes(60));
    REQUIRE(!points.empty());
    CHECK(points.front().minute_ms % 60000 == 0);
    CHECK(points.front().counts.enqueued == 10);
    CHECK(points.front().counts.completed == 7);
    CHECK(points.front().counts.failed == 1);
    CHECK(points.front().counts.ready_lanes == 3);
    CHECK((co_await b.make().history(b.queue(), std::chrono::minutes(0))).size() <= 1);
  });
}

CONFORMANCE("views: groups are found by prefix page by page, and a group's state at once") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    std::set<std::string> acme, all;
    for (int i = 0; i < 120; ++i) {
      auto g = fmt::format("{}:{}", i % 3 == 0 ? "acme" : "beta", i);
      (i % 3 == 0 ? acme : all).insert(g);
      specs.push_back(make_job("t", boost::json::object{{"i", i}}, g));
    }
    specs.push_back(make_job("t", boost::json::object{{"i", 0}}, std::string("acme:0")));  // a second job
    all.insert(acme.begin(), acme.end());
    co_await p.enqueue_bulk(std::move(specs));
    auto walk = [&](std::string prefix) -> awaitable<std::multiset<std::string>> {
      std::multiset<std::string> found;
      std::string cursor;
      int pages = 0;
      do {
        auto page = co_await b.make().groups(b.queue(), prefix, cursor, 7);
        // (On Redis, about the limit: the SCAN step that reached it may bring more.)
        if (kind == backend_kind::memory || kind == backend_kind::sharded_memory) CHECK(page.items.size() <= 7);
        found.insert(page.items.begin(), page.items.end());
        cursor = page.cursor;
        REQUIRE(++pages < 1000);
      } while (!cursor.empty());
      co_return found;
    };
    auto found = co_await walk("acme:");
    CHECK(std::set<std::string>(found.begin(), found.end()) == acme);
    CHECK(found.size() == acme.size());  // (nothing changed during the walk: each once)
    auto every = co_await walk("");
    CHECK(std::set<std::string>(every.begin(), every.end()) == all);
    CHECK((co_await walk("zeta")).empty());
    CHECK_THROWS_AS(co_await b.make().groups(b.queue(), "", "not a cursor", 10), std::invalid_argument);
    // (All digits, but past 2^64: refused here, not by the server)
    CHECK_THROWS_AS(co_await b.make().groups(b.queue(), "", "99999999999999999999", 10), std::invalid_argument);
    CHECK_THROWS_AS(co_await b.make().groups(b.queue(), "", "r99999999999999999999", 10), std::invalid_argument);

    auto s = co_await b.make().group_of(b.queue(), "acme:0");
    CHECK(s.group == "acme:0");
    CHECK(s.depth == 2);
    REQUIRE(s.head);
    CHECK(s.head->body.find("\"i\":0") != std::string::npos);
    CHECK(!s.paused);
    CHECK(co_await b.make().pause(b.queue(), "acme:0"));
    s = co_await b.make().group_of(b.queue(), "acme:0");
    REQUIRE(s.paused);
    CHECK(!s.paused->halted);
    auto none = co_await b.make().group_of(b.queue(), "nobody");
    CHECK(none.depth == 0);
    CHECK(!none.head);
    // A group waiting out a retry's backoff says until when.
    auto target = beside(kind, "retry-me", "retry-me");
    auto job = make_job("t", boost::json::object{{"i", 1}}, target);
    co_await p.enqueue(job);
    claim_options o;
    o.worker = "w";
    o.max = 1000;
    auto leased = co_await b.make().claim(b.queue(), o);
    std::vector<finish_item> items;
    for (auto& c : leased) {
      finish_item f;
      f.token = c.token;
      f.kind = c.group == target ? finish_kind::retry : finish_kind::release;
      f.delay = std::chrono::minutes(5);
      items.push_back(std::move(f));
    }
    co_await b.make().finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
    auto waiting = co_await b.make().group_of(b.queue(), target);
    auto now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    CHECK(waiting.waiting_until_ms > now_ms + 60000);
    CHECK(waiting.depth == 1);
  });
}

CONFORMANCE("views: dead letters are found by group, type and error text, newest first, page by page") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 40; ++i) {
      auto group = i % 2 == 0 ? std::optional<std::string>(fmt::format("g{}", i % 4)) : std::nullopt;
      specs.push_back(make_job(i % 5 == 0 ? "import" : "mail", boost::json::object{{"i", i}}, group));
    }
    co_await p.enqueue_bulk(std::move(specs));
    for (int round = 0; round < 40; ++round) {  // grouped jobs come one lease at a time
      co_await fail_all(b.make(), b.queue(), round % 2 == 0 ? "Timeout at" : "refused by");
      if ((co_await b.make().counts(b.queue())).dead == 40) break;
    }
    REQUIRE((co_await b.make().counts(b.queue())).dead == 40);
    auto all = co_await b.make().dead_letters(b.queue(), 0, 100);
    REQUIRE(all.size() == 40);
    auto walk = [&](dead_filter f) -> awaitable<std::vector<dead_letter>> {
      std::vector<dead_letter> found;
      std::string cursor;
      int pages = 0;
      do {
        auto page = co_await b.make().find_dead(b.queue(), f, cursor, 3);
        CHECK(page.items.size() <= 3);
        found.insert(found.end(), page.items.begin(), page.items.end());
        cursor = page.cursor;
        REQUIRE(++pages < 100);
      } while (!cursor.empty());
      co_return found;
    };
    auto expect = [&](auto pred) {
      std::multiset<std::string> ids;
      for (auto& d : all)
        if (pred(d)) ids.insert(d.id);
      return ids;
    };
    auto ids = [](const std::vector<dead_letter>& v) {
      std::multiset<std::string> out;
      for (auto& d : v) out.insert(d.id);
      return out;
    };
    // (Filters built before co_await: GCC 12 miscompiles a braced temporary in a coroutine.)
    dead_filter any, group_g2{"g2", "", ""}, type_import{"", "import", ""}, text_timeout{"", "", "TIMEOUT"},
        all_three{"g0", "mail", "refused"};
    auto every = co_await walk(any);
    CHECK(ids(every) == expect([](auto&) { return true; }));
    auto newest_first = [](const std::vector<dead_letter>& v) {  // (a sharded queue's: merged)
      return std::is_sorted(v.begin(), v.end(), [](auto& x, auto& y) { return x.at_ms > y.at_ms; });
    };
    CHECK(newest_first(every));
    auto by_group = co_await walk(group_g2);
    CHECK(ids(by_group) == expect([](auto& d) { return d.group == "g2"; }));
    CHECK(!by_group.empty());
    auto by_type = co_await walk(type_import);
    CHECK(ids(by_type) == expect([](auto& d) { return d.record.find("\"type\":\"import\"") != std::string::npos; }));
    CHECK(by_type.size() == 8);
    auto by_text = co_await walk(text_timeout);
    CHECK(ids(by_text) == expect([](auto& d) { return d.error.starts_with("Timeout at"); }));
    CHECK(!by_text.empty());
    CHECK(newest_first(by_text));
    CHECK((co_await walk(all_three)).size() == expect([](auto& d) {
                                                 return d.group == "g0" && d.error.starts_with("refused") &&
                                                        d.record.find("\"type\":\"mail\"") != std::string::npos;
                                               }).size());
    CHECK_THROWS_AS(co_await b.make().find_dead(b.queue(), any, "nonsense", 3), std::invalid_argument);
    // A letter of a page already seen that leaves meanwhile (requeued) makes the walk skip no
    // other, however many letters share its time (a finish call's share one).
    auto first = co_await b.make().find_dead(b.queue(), any, "", 3);
    REQUIRE(first.items.size() == 3);
    std::vector<std::string> gone{first.items[0].id};
    CHECK((co_await b.make().requeue(b.queue(), gone, false)).size() == 1);
    auto seen = ids(first.items);
    std::string cursor = first.cursor;
    for (int pages = 0; !cursor.empty() && pages < 100; ++pages) {
      auto page = co_await b.make().find_dead(b.queue(), any, cursor, 3);
      for (auto& d : page.items) seen.insert(d.id);
      cursor = page.cursor;
    }
    CHECK(seen == ids(all));
  });
}
