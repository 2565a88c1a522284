// One suite, two backends: every case runs on the memory backend and on Redis. The job runtime
// core: exclusion, order, fairness, the fast path, leases.
#include "conformance/conformance.hpp"

#include <fmt/ranges.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/thread_pool.hpp>

#include <future>
#include <set>

CONFORMANCE("exclusion and order: 8 workers (half of them pipelined) x 200 groups x 50 jobs") {
  run(
      [kind](asio::io_context& ctx) -> awaitable<void> {
        backends b(ctx, kind);
        constexpr int groups = 200, per_group = 50;
        std::mutex m;
        std::vector<event> events;
        std::map<std::string, int> runs;  // job → times run
        int done = 0;
        auto h = [&](job_context& c) -> awaitable<void> {
          auto seq = c.payload().at("seq").as_int64();
          {
            std::lock_guard lock(m);
            events.push_back({c.group(), seq, c.fence(), true});
            ++runs[c.id()];
          }
          if (seq % 3 == 0)
            co_await sleep_for(std::chrono::milliseconds(1));
          else
            co_await asio::post(co_await asio::this_coro::executor, use_awaitable);
          std::lock_guard lock(m);
          events.push_back({c.group(), seq, c.fence(), false});
          ++done;
        };
        std::vector<std::unique_ptr<worker>> workers;
        for (int w = 0; w < 8; ++w) {
          auto o = b.worker_opts(16);
          o.burst = static_cast<std::size_t>(1 + w % 3);
          if (w >= 4) o.follow = follow_policy::pipelined;
          workers.push_back(std::make_unique<worker>(ctx.get_executor(), b.make(), o));
          workers.back()->add_handler("step", h);
          workers.back()->start();
        }
        producer p(b.make(), b.queue());
        std::vector<job_spec> specs;
        for (int s = 0; s < per_group; ++s)
          for (int g = 0; g < groups; ++g) specs.push_back(make_job("step", {{"seq", s}}, fmt::format("g{}", g)));
        auto ids = co_await p.enqueue_bulk(std::move(specs));
        CHECK(ids.size() == groups * per_group);
        CHECK(co_await eventually([&] { return done == groups * per_group; }, std::chrono::seconds(120)));
        for (auto& w : workers) co_await w->stop(std::chrono::seconds(5));

        std::map<std::string, std::int64_t> running_seq, last_seq, last_fence;
        int overlaps = 0, inversions = 0, fence_regressions = 0;
        for (auto& e : events) {
          if (e.start) {
            if (running_seq.count(e.group)) ++overlaps;
            running_seq[e.group] = e.seq;
            auto it = last_seq.find(e.group);
            if (it != last_seq.end() && e.seq != it->second + 1) ++inversions;
            last_seq[e.group] = e.seq;
            auto f = last_fence.find(e.group);
            if (f != last_fence.end() && e.fence <= f->second) ++fence_regressions;
            last_fence[e.group] = e.fence;
          } else {
            running_seq.erase(e.group);
          }
        }
        CHECK(overlaps == 0);
        CHECK(inversions == 0);
        CHECK(fence_regressions == 0);
        CHECK(runs.size() == static_cast<std::size_t>(groups * per_group));
        int twice = 0;
        for (auto& [id, n] : runs) twice += n != 1;
        CHECK(twice == 0);
        auto counts = co_await b.make().counts(b.queue());
        CHECK(counts.enqueued == groups * per_group);
        CHECK(counts.completed == groups * per_group);
        CHECK(counts.started == groups * per_group);
        CHECK(counts.running == 0);
        CHECK(counts.ready_lanes == 0);
      },
      std::chrono::seconds(180));
}

CONFORMANCE("fairness: one-job groups are not starved by a group of 10000") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 10000; ++i) specs.push_back(make_job("t", {{"i", i}}, "big"));
    for (int g = 0; g < 100; ++g) specs.push_back(make_job("t", {{"i", -1}}, fmt::format("small{}", g)));
    co_await p.enqueue_bulk(std::move(specs));
    std::vector<std::string> order;
    auto o = b.worker_opts(1);
    o.burst = 4;
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      order.push_back(c.group());
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return order.size() >= 300; }));
    co_await w.stop(std::chrono::seconds(5));
    // Round robin: the big group gets at most one burst per turn, then every small group its one.
    std::size_t last_small = 0;
    for (std::size_t i = 0; i < order.size(); ++i)
      if (order[i] != "big") last_small = i;
    MESSAGE("last one-job group started at position " << last_small);
    // Sharded, the round robin is each shard's, and the worker's claims go to the shards in
    // turn: the big group's turn comes once its shard's small groups (about 100 / S) had theirs,
    // as the other shards' run: a burst or two more before the last small group.
    std::size_t bursts = sharded(kind) ? 4 : 1;
    CHECK(last_small < 100 + 4 * bursts + 1);
  });
}

CONFORMANCE("counts name when the next job to start was enqueued, from the head of the ready list") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    CHECK((co_await store.counts(b.queue())).next_enqueued_ms == 0);  // nothing ready
    producer p(store, b.queue());
    auto before =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    co_await p.enqueue(make_job("t", {}, "g"));  // a group's lane first: its head's time
    co_await sleep_for(std::chrono::milliseconds(20));
    co_await p.enqueue(make_job("t", {}));
    auto grouped = (co_await store.counts(b.queue())).next_enqueued_ms;
    CHECK(grouped >= before);
    CHECK(grouped < before + 20);
    claim_options co{"w", 1, std::chrono::seconds(30)};
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 1);
    auto loose = (co_await store.counts(b.queue())).next_enqueued_ms;  // now the ungrouped job, inline
    CHECK(loose >= grouped + 20);
  });
}

CONFORMANCE("fast path: ungrouped jobs run in parallel up to the concurrency") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 100; ++i) specs.push_back(make_job("t", {{"i", i}}));
    co_await p.enqueue_bulk(std::move(specs));
    int running = 0, peak = 0, done = 0;
    worker w(ctx.get_executor(), b.make(), b.worker_opts(20));
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      peak = std::max(peak, ++running);
      // Long enough for the claims that fill all 20 slots to land while the first jobs still run,
      // also on a sharded cluster under a sanitizer.
      co_await sleep_for(std::chrono::milliseconds(100));
      --running;
      ++done;
    });
    auto start = std::chrono::steady_clock::now();
    w.start();
    CHECK(co_await eventually([&] { return done == 100; }));
    auto took = std::chrono::steady_clock::now() - start;
    co_await w.stop(std::chrono::seconds(5));
    CHECK(peak == 20);
    // 5 waves of 100 ms; serial would be 10 s.
    CHECK(took < std::chrono::milliseconds(2500));
  });
}

// jobrt makes its strands over an io_context's own executor type; any other executor gets strands
// over the type-erased one. This runs the second kind: everything on a thread pool of 2.
CONFORMANCE("on a thread pool's executor, a group runs in order one job at a time and ungrouped jobs all run") {
  asio::thread_pool pool(2);
  auto ex = pool.get_executor();
  auto store = new_backend(kind, ex);
  const auto queue = key_prefix() + "pool";
  std::mutex m;
  std::vector<int> order;  // the group's jobs, as they started
  int in_group = 0, overlaps = 0, ungrouped = 0;
  auto body = [&]() -> awaitable<void> {
    producer p(*store, queue);
    std::vector<job_spec> specs;
    for (int i = 0; i < 40; ++i) {
      specs.push_back(make_job("t", {{"i", i}}, std::string("g")));
      specs.push_back(make_job("t", {{"i", -1}}));
    }
    co_await p.enqueue_bulk(std::move(specs));
    worker_options o;
    o.queue = queue;
    o.concurrency = 8;
    o.claim_wait = std::chrono::milliseconds(300);
    worker w(ex, *store, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto i = c.payload().at("i").to_number<int>();
      {
        std::lock_guard lock(m);
        if (i < 0) {
          ++ungrouped;
          co_return;
        }
        order.push_back(i);
        if (++in_group > 1) ++overlaps;
      }
      co_await sleep_for(std::chrono::milliseconds(1));
      std::lock_guard lock(m);
      --in_group;
    });
    w.start();
    bool all = co_await eventually(
        [&] {
          std::lock_guard lock(m);
          return order.size() == 40 && ungrouped == 40;
        },
        std::chrono::seconds(20));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(all);
  };
  std::promise<std::exception_ptr> ended;
  asio::co_spawn(ex, body(), [&](std::exception_ptr e) { ended.set_value(e); });
  auto done = ended.get_future();
  // The body gives up by itself well within this (20 s, then a stop of at most 5): past it, the
  // pool stops before the test's locals go, which its threads may still be using.
  if (done.wait_for(std::chrono::seconds(40)) != std::future_status::ready) {
    pool.stop();
    pool.join();
    FAIL("the test's coroutine did not finish within 40 s");
  }
  if (auto e = done.get()) std::rethrow_exception(e);
  std::vector<int> expected(40);
  for (int i = 0; i < 40; ++i) expected[static_cast<std::size_t>(i)] = i;
  CHECK(order == expected);
  CHECK(overlaps == 0);
  CHECK(ungrouped == 40);
}

CONFORMANCE("bursts keep to the concurrency: a follower whose keep lands while the slots are taken waits for one") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    constexpr int groups = 12, per_group = 8;
    std::vector<job_spec> specs;
    for (int j = 0; j < per_group; ++j)
      for (int g = 0; g < groups; ++g) specs.push_back(make_job("t", {{"g", g}, {"j", j}}, fmt::format("g{}", g)));
    co_await p.enqueue_bulk(std::move(specs));
    auto o = b.worker_opts(3);
    o.burst = 4;
    worker w(ctx.get_executor(), b.make(), o);
    int running = 0, peak = 0, done = 0;
    std::vector<std::vector<std::int64_t>> ran(groups);  // by group: the jobs in the order they started
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      peak = std::max(peak, ++running);
      auto g = c.payload().at("g").as_int64(), j = c.payload().at("j").as_int64();
      ran[static_cast<std::size_t>(g)].push_back(j);
      // Keeps land while the other slots are busy.
      co_await sleep_for(std::chrono::milliseconds(1 + (g + j) % 3));
      --running;
      ++done;
    });
    w.start();
    CHECK(co_await eventually([&] { return done == groups * per_group; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(peak == 3);
    std::vector<std::int64_t> in_order;
    for (std::int64_t j = 0; j < per_group; ++j) in_order.push_back(j);
    for (std::size_t g = 0; g < groups; ++g)
      CHECK_MESSAGE(ran[g] == in_order, fmt::format("group {}: {}", g, fmt::join(ran[g], " ")));
    CHECK(w.counters().leases_lost == 0);
    CHECK(w.counters().completed == groups * per_group);
  });
}

CONFORMANCE("watchdog: a handler running 5x the lease TTL keeps its lease") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(4);
    o.lease_ttl = std::chrono::milliseconds(300);
    std::vector<std::string> log;
    bool cancelled = false;
    auto h = [&](job_context& c) -> awaitable<void> {
      log.push_back(fmt::format("start {}", c.payload().at("i").as_int64()));
      if (c.payload().at("i").as_int64() == 0) co_await sleep_for(std::chrono::milliseconds(1500));
      cancelled = cancelled || c.cancelled();
      log.push_back(fmt::format("end {}", c.payload().at("i").as_int64()));
    };
    worker w1(ctx.get_executor(), b.make(), o), w2(ctx.get_executor(), b.make(), o);
    w1.add_handler("t", h);
    w2.add_handler("t", h);
    w1.start();
    w2.start();
    producer p(b.make(), b.queue());
    auto job1 = make_job("t", {{"i", 0}}, "g");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job1);
    auto job2 = make_job("t", {{"i", 1}}, "g");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job2);
    CHECK(co_await eventually([&] { return log.size() == 4; }));
    co_await w1.stop(std::chrono::seconds(5));
    co_await w2.stop(std::chrono::seconds(5));
    CHECK(log == std::vector<std::string>{"start 0", "end 0", "start 1", "end 1"});
    CHECK_FALSE(cancelled);
    CHECK(w1.counters().leases_lost + w2.counters().leases_lost == 0);
    CHECK(w1.counters().renewals + w2.counters().renewals >= 8);
  });
}

CONFORMANCE("lost lease: the handler is cancelled within one watchdog period and cannot ack") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(1);
    o.lease_ttl = std::chrono::milliseconds(600);  // watchdog every 200 ms
    std::string token;
    std::chrono::steady_clock::time_point lost_at{}, cancelled_at{};
    std::uint64_t renewals_at_loss = 0, renewals_at_cancel = 0;
    bool finished_normally = false;
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      token = group_token(kind, c.fence(), c.group());
      try {
        co_await sleep_for(std::chrono::seconds(10));
        finished_normally = true;
      } catch (const boost::system::system_error&) {
        cancelled_at = std::chrono::steady_clock::now();
        renewals_at_cancel = w.counters().renewals;
        CHECK(c.cancelled());
        throw;
      }
    });
    w.start();
    producer p(b.make(), b.queue());
    auto job3 = make_job("t", {{"i", 0}}, "g");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job3);
    CHECK(co_await eventually([&] { return !token.empty(); }));
    // Someone else ends the lease (an operator, or a reaper after a pause past the TTL).
    lost_at = std::chrono::steady_clock::now();
    renewals_at_loss = w.counters().renewals;
    if (plain_keys(kind)) {
      auto& r = static_cast<redis_backend&>(b.make());
      auto active = redis_backend::key_prefix(b.queue()) + "active";
      co_await r.exec(redis::request("ZREM", active, token), active);
    } else {
      finish_item steal;
      steal.token = token;
      std::vector<finish_item> items{steal};
      auto res = co_await b.make().finish(b.queue(), "intruder", items, o.lease_ttl);
      CHECK(res.at(0).lease_held);
    }
    CHECK(co_await eventually([&] { return cancelled_at != std::chrono::steady_clock::time_point{}; }));
    auto delay = cancelled_at - lost_at;
    MESSAGE("cancelled " << std::chrono::duration_cast<std::chrono::milliseconds>(delay).count()
                         << " ms after the lease was lost");
    // By the first watchdog call after the loss (the second, when one was on its way then):
    // within one period of the watchdog's own clock. The wall clock gets slack for a busy machine.
    CHECK(renewals_at_cancel - renewals_at_loss <= 2);
    CHECK(renewals_at_cancel > renewals_at_loss);
    CHECK(delay < std::chrono::milliseconds(200 + 400));
    CHECK_FALSE(finished_normally);
    CHECK(co_await eventually([&] { return w.in_flight() == 0; }));
    CHECK(w.counters().leases_lost == 1);
    CHECK(w.counters().completed == 0);
    CHECK(w.counters().failed == 0);
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("bad input at enqueue is refused and stores nothing") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer_options po;
    po.max_body_bytes = 1000;
    producer p(b.make(), b.queue(), po);
    auto refused = [&](job_spec s) -> awaitable<std::string> {
      try {
        co_await p.enqueue(std::move(s));
      } catch (const std::invalid_argument& e) {
        co_return e.what();
      }
      co_return "accepted";
    };
    auto no_type = make_job("", {});
    CHECK((co_await refused(no_type)) == "job type is empty");
    auto big = make_job("t", boost::json::string(std::string(2000, 'x')));
    CHECK((co_await refused(big)).find("bytes encoded; the limit is 1000") != std::string::npos);
    auto bad_id = make_job("t", {});
    bad_id.id = "a|b";
    CHECK((co_await refused(bad_id)) == "job id 'a|b' contains '|'");
    auto digits = make_job("t", {});  // the queue assigns such ids: a producer's could collide
    digits.id = "1042";
    CHECK((co_await refused(digits)) ==
          "job id '1042' is all digits, like the ids the queue assigns; give it a prefix");
    auto far = make_job("t", {});
    far.delay = std::chrono::hours(24 * 366 * 40000);
    CHECK((co_await refused(far)).starts_with("job delay is "));
    auto endless = make_job("t", {});  // (in the clock's nanoseconds, it would come out negative)
    endless.timeout = std::chrono::milliseconds::max();
    CHECK((co_await refused(endless)) == "job timeout is 9223372036854775807 ms; it must be from 0 (none) to a year");
    // The backends check the same behind the producer's back, before they store anything.
    std::vector<encoded_job> raw(2);
    raw[0].body = raw[1].body = R"({"type":"t"})";
    raw[0].id = "ok-1";
    raw[1].id = "17";
    // Both raise the same errc for the same cause, with the same words.
    auto backend_refusal =
        [&](std::vector<encoded_job> jobs) -> awaitable<std::pair<boost::system::error_code, std::string>> {
      try {
        co_await b.make().enqueue(b.queue(), std::move(jobs));
      } catch (const boost::system::system_error& e) {
        co_return std::make_pair(e.code(), std::string(e.what()));
      }
      co_return std::make_pair(boost::system::error_code(), std::string("accepted"));
    };
    auto id = co_await backend_refusal(raw);  // (no structured bindings in coroutines: GCC 12)
    CHECK(id.first == errc::bad_job_id);
    CHECK_MESSAGE(id.second.starts_with("job id '17' is all digits"), id.second);
    raw[1].id = "ok-2";
    raw[1].body = R"({"type":"t","max":0})";
    auto max = co_await backend_refusal(raw);
    CHECK(max.first == errc::bad_max_attempts);
    CHECK_MESSAGE(max.second.starts_with("job max_attempts is 0; it must be at least 1"), max.second);
    raw[1].body = R"({"type":"t"})";
    raw[1].delay_ms = 1'000'000'000'000'000;
    auto due = co_await backend_refusal(raw);
    CHECK(due.first == errc::bad_due);
    CHECK_MESSAGE(due.second.starts_with("job 2 due"), due.second);
    std::string not_json;
    try {
      producer::parse_payload("{\"a\": 1,");
    } catch (const std::invalid_argument& e) {
      not_json = e.what();
    }
    CHECK(not_json.starts_with("payload is not JSON"));
    // One bad job in a bulk call refuses the whole call.
    std::vector<job_spec> bulk;
    bulk.push_back(make_job("t", {}));
    bulk.push_back(make_job("", {}));
    std::string bulk_error;
    try {
      co_await p.enqueue_bulk(std::move(bulk));
    } catch (const std::invalid_argument& e) {
      bulk_error = e.what();
    }
    CHECK(bulk_error == "job 2 of 2: job type is empty");
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.enqueued == 0);
    CHECK(counts.ready_lanes == 0);
  });
}

CONFORMANCE("the same id twice is one job") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto s = make_job("t", {{"x", 1}});
    s.id = "order-17";
    auto first = co_await p.enqueue(s);
    auto second = co_await p.enqueue(s);
    CHECK(first.id == "order-17");
    CHECK_FALSE(first.duplicate);
    CHECK(second.duplicate);
    int runs = 0;
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      CHECK(c.id() == "order-17");
      ++runs;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 1; }));
    CHECK(runs == 1);
    // Finished: the id may be used again.
    CHECK_FALSE((co_await p.enqueue(s)).duplicate);
    CHECK(co_await eventually([&] { return w.counters().completed == 2; }));
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("bad input at run time: a type no worker runs and a throwing handler fail the job and the worker goes on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto o = b.worker_opts(4);
    o.unhandled_limit = std::chrono::milliseconds(0);  // dead-lettered once the worker has asked whether any runs it
    o.reap_period = std::chrono::milliseconds(50);
    o.unhandled_delay = std::chrono::milliseconds(10);
    worker w(ctx.get_executor(), b.make(), o);
    int ok = 0;
    w.add_handler("ok", [&](job_context&) -> awaitable<void> {
      ++ok;
      co_return;
    });
    w.add_handler("throws", [&](job_context& c) -> awaitable<void> {
      if (!c.payload().is_object()) throw std::runtime_error("payload must be an object");
      co_return;
    });
    w.start();
    auto job4 = make_job("nobody", {}, "g");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job4);
    co_await p.enqueue(make_job("throws", "text", "g"));
    auto job5 = make_job("ok", {}, "g");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job5);
    CHECK(co_await eventually([&] { return ok == 1; }));
    co_await w.stop(std::chrono::seconds(5));  // (its last finish may still be on its way)
    CHECK(w.counters().failed == 2);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.dead == 2);
    CHECK(counts.failed == 2);
    CHECK(counts.completed == 1);
    // Each dead letter says why: the unknown type by name, the handler's own error.
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 2);
    std::map<std::string, std::string> error_of;  // by job type
    for (auto& d : dead) {
      CHECK(d.group == "g");
      auto body = boost::json::parse(d.record.substr(d.record.find('|', d.record.find('|') + 1) + 1));
      error_of[std::string(body.at("type").as_string())] = d.error;
    }
    CHECK(error_of["nobody"].starts_with("no handler for type nobody: no worker has been able to run it for"));
    CHECK(error_of["throws"] == "payload must be an object");
  });
}

CONFORMANCE("grouping rules route jobs of one tenant and entity into one group") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer_options po;
    po.rules = grouping_rules::from_json(
        boost::json::parse(R"({"rules": [{"match": {"app": "crm"}, "key": "{entity}:{tenant}"}]})"));
    producer p(b.make(), b.queue(), po);
    std::vector<std::string> groups;
    worker w(ctx.get_executor(), b.make(), b.worker_opts(4));
    w.add_handler("import", [&](job_context& c) -> awaitable<void> {
      groups.push_back(c.group());
      co_return;
    });
    w.start();
    auto job6 = make_job(
        "import",
        {{"app", "crm"}, {"entity", "invoice"}, {"tenant", 7}});  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job6);
    auto job7 = make_job(
        "import",
        {{"app", "erp"}, {"entity", "invoice"}, {"tenant", 7}});  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job7);
    CHECK(co_await eventually([&] { return groups.size() == 2; }));
    std::multiset<std::string> got(groups.begin(), groups.end());
    CHECK(got == std::multiset<std::string>{"", "invoice:7"});
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("graceful stop hands back what it did not finish") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    int started = 0;
    w.add_handler("slow", [&](job_context&) -> awaitable<void> {
      ++started;
      co_await sleep_for(std::chrono::seconds(30));
    });
    w.start();
    auto job8 = make_job("slow", {}, "a");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job8);
    auto job9 = make_job("slow", {}, "b");  // (built before co_await: see ARCHITECTURE.md)
    co_await p.enqueue(job9);
    CHECK(co_await eventually([&] { return started == 2; }));
    co_await w.stop(std::chrono::milliseconds(100));
    CHECK(w.counters().released == 2);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.running == 0);
    CHECK(counts.ready_lanes == 2);
    // Another worker runs them.
    worker next(ctx.get_executor(), b.make(), b.worker_opts(2));
    int ran = 0;
    next.add_handler("slow", [&](job_context& c) -> awaitable<void> {
      CHECK(c.attempt() == 1);  // handed back, not counted as an attempt
      ++ran;
      co_return;
    });
    next.start();
    CHECK(co_await eventually([&] { return ran == 2; }));
    co_await next.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("a burst's job that ends during stop's grace starts no follower, which runs later as its first attempt") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(2);
    o.burst = 2;
    o.lease_ttl = std::chrono::milliseconds(600);  // the grace below outlasts it
    o.reap_period = std::chrono::milliseconds(100);
    worker w(ctx.get_executor(), b.make(), o);
    bool stopping = false;
    int slow_started = 0;
    std::vector<std::string> runs;
    w.add_handler("slow", [&](job_context&) -> awaitable<void> {  // holds the grace open
      ++slow_started;
      co_await sleep_for(std::chrono::seconds(30));
    });
    w.add_handler("k", [&](job_context& c) -> awaitable<void> {
      runs.push_back(c.id());
      // Done only once stop has begun: a plain ack, no keep.
      co_await eventually([&] { return stopping; });
    });
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs{make_job("slow", {}), make_job("k", {}, "g"), make_job("k", {}, "g")};
    auto ids = co_await p.enqueue_bulk(std::move(specs));
    CHECK(w.state() == worker_state::created);
    w.start();
    CHECK(co_await eventually([&] { return slow_started == 1 && runs.size() == 1; }));
    CHECK(w.state() == worker_state::running);
    bool stopped = false;
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          co_await w.stop(std::chrono::milliseconds(2000));
          stopped = true;
        },
        asio::detached);
    CHECK(co_await eventually([&] { return w.state() == worker_state::draining; }));  // stop() is under way
    stopping = true;
    CHECK(co_await eventually([&] { return stopped; }, std::chrono::seconds(10)));
    CHECK(w.state() == worker_state::stopped);
    CHECK(runs.size() == 1);  // the follower did not start
    // It never started: the next worker runs it as its first attempt.
    worker next(ctx.get_executor(), b.make(), b.worker_opts(2));
    int attempt = 0;
    next.add_handler("k", [&](job_context& c) -> awaitable<void> {
      CHECK(c.id() == ids[2].id);
      attempt = c.attempt();
      co_return;
    });
    next.add_handler("slow", [&](job_context&) -> awaitable<void> { co_return; });
    next.start();
    CHECK(co_await eventually([&] { return attempt != 0; }));
    CHECK(attempt == 1);
    co_await next.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("a worker says when it waits for work: running, holding no job, its claim waiting in the backend") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(2);
    o.claim_wait = std::chrono::seconds(30);  // a claim that waits ends only with work or stop
    worker w(ctx.get_executor(), b.make(), o);
    bool release = false;
    int ran = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      co_await eventually([&] { return release; });
      ++ran;
    });
    CHECK_FALSE(w.waiting_for_work());  // not started
    w.start();
    CHECK(co_await eventually([&] { return w.waiting_for_work(); }));
    // Enqueued now, the job is taken by the claim that waits: at once, not after claim_wait.
    producer p(b.make(), b.queue());
    auto enqueued = std::chrono::steady_clock::now();
    co_await p.enqueue(make_job("t", {}, "g"));
    CHECK(co_await eventually([&] { return w.in_flight() == 1; }));
    CHECK(std::chrono::steady_clock::now() - enqueued < std::chrono::seconds(10));
    CHECK_FALSE(w.waiting_for_work());  // it holds a job
    release = true;
    CHECK(co_await eventually([&] { return w.waiting_for_work(); }));
    CHECK(ran == 1);
    CHECK(w.counters().completed == 1);
    co_await w.stop(std::chrono::seconds(5));
    CHECK_FALSE(w.waiting_for_work());
  });
}

CONFORMANCE("crash recovery: a lease nobody renews expires and a live worker runs the job again") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto first = make_job("t", {{"n", 1}}, "g");
    auto second = make_job("t", {{"n", 2}}, "g");
    auto loose = make_job("t", {{"n", 3}});
    co_await p.enqueue(first);
    co_await p.enqueue(second);
    co_await p.enqueue(loose);
    // A worker that dies right after claiming: its leases (300 ms) are never renewed.
    claim_options crashed{"crashed-worker", 10, std::chrono::milliseconds(300)};
    auto held = co_await b.make().claim(b.queue(), crashed);
    CHECK(held.size() == 2);  // the group's head and the ungrouped job
    auto started = std::chrono::steady_clock::now();

    auto o = b.worker_opts(4);
    o.lease_ttl = std::chrono::milliseconds(600);  // watchdog and reaper every 200 ms
    worker w(ctx.get_executor(), b.make(), o);
    std::vector<std::pair<std::int64_t, int>> runs;  // n, attempt
    std::chrono::steady_clock::time_point recovered_at{};
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      if (c.payload().at("n").as_int64() == 1) recovered_at = std::chrono::steady_clock::now();
      runs.emplace_back(c.payload().at("n").as_int64(), c.attempt());
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return runs.size() == 3; }));
    co_await w.stop(std::chrono::seconds(5));
    std::sort(runs.begin(), runs.end());
    // The crashed worker's two jobs ran again, attempt counted; the group kept its order.
    CHECK(runs == std::vector<std::pair<std::int64_t, int>>{{1, 2}, {2, 1}, {3, 2}});
    auto took = recovered_at - started;
    MESSAGE("recovered " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                         << " ms after the claim (lease 300 ms, reaper every 200 ms)");
    // (Sharded, the reaper learns where leases may have run out from the notes their holders
    // make with each renewal, a third of a TTL ahead: that much later.)
    CHECK(took < std::chrono::milliseconds(300 + 200 + 200 + (sharded(kind) ? 100 : 0)));
    CHECK(w.counters().recovered == 2);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.recovered == 2);
    CHECK(counts.completed == 3);
    CHECK(counts.running == 0);
    // Its finish, were it to come back, is refused.
    finish_item late;
    late.token = held.at(0).token;
    std::vector<finish_item> items{late};
    auto res = co_await b.make().finish(b.queue(), "crashed-worker", items, o.lease_ttl);
    CHECK_FALSE(res.at(0).lease_held);
  });
}

CONFORMANCE("job timeout: the handler is cancelled at its deadline and the attempt fails") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto slow = make_job("slow", {}, "g");
    slow.timeout = std::chrono::milliseconds(100);
    slow.max_attempts = 1;                  // no retry: its one failure is a dead letter
    auto next = make_job("slow", {}, "g");  // no timeout: runs after the first fails
    co_await p.enqueue(slow);
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    std::chrono::steady_clock::time_point started{}, cancelled{};
    int runs = 0;
    w.add_handler("slow", [&](job_context& c) -> awaitable<void> {
      if (++runs > 1) co_return;
      started = std::chrono::steady_clock::now();
      try {
        co_await sleep_for(std::chrono::seconds(10));
      } catch (const boost::system::system_error&) {
        cancelled = std::chrono::steady_clock::now();
        CHECK(c.cancelled());
        throw;
      }
    });
    w.start();
    co_await p.enqueue(next);
    CHECK(co_await eventually([&] { return runs == 2; }));
    co_await w.stop(std::chrono::seconds(5));
    auto after = cancelled - started;
    CHECK(after >= std::chrono::milliseconds(100));
    CHECK(after < std::chrono::milliseconds(300));
    CHECK(w.counters().failed == 1);
    CHECK(w.counters().completed == 1);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.dead == 1);
    auto dead = co_await b.make().dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].error == "timed out after 100 ms");
  });
}

CONFORMANCE("enqueue_bulk that fails after a batch was stored says how many jobs are stored") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    gated_backend gate(ctx.get_executor(), b.make());
    producer_options po;
    po.batch = 2;
    producer p(gate, b.queue(), po);
    std::vector<job_spec> specs;
    for (int i = 0; i < 5; ++i) specs.push_back(make_job("t", {{"i", i}}));
    gate.fail_enqueue_after(1);  // batches of 2, 2 and 1: the second fails
    std::size_t stored = 0;
    std::string what, nested;
    try {
      co_await p.enqueue_bulk(std::move(specs));
    } catch (const partial_enqueue& e) {
      stored = e.stored();
      what = e.what();
      try {
        std::rethrow_if_nested(e);
      } catch (const std::exception& inner) {
        nested = inner.what();
      }
    }
    CHECK(stored == 2);
    CHECK(what.find("jobs 1 to 2 of 5 are stored") != std::string::npos);
    CHECK(what.find("enqueue failed (injected)") != std::string::npos);
    CHECK(nested == "enqueue failed (injected)");
    CHECK((co_await b.make().counts(b.queue())).enqueued == 2);
    // Failing in the first batch, nothing is stored: the backend's own error, as for enqueue.
    gate.fail_enqueue_after(0);
    std::string first;
    std::vector<job_spec> two;
    two.push_back(make_job("t", {}));
    two.push_back(make_job("t", {}));
    try {
      co_await p.enqueue_bulk(std::move(two));
    } catch (const partial_enqueue&) {
      first = "partial";
    } catch (const std::exception& e) {
      first = e.what();
    }
    CHECK(first == "enqueue failed (injected)");
  });
}

CONFORMANCE("a bulk enqueue bigger than a call keeps each group's order and each job's place in the results") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    // One group of 1,200 and 100 jobs of none: a sharded queue's producer sends them in one
    // call, whose part for the group's shard goes in calls of 500, one after the other.
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 1200; ++i) specs.push_back(make_job("t", {{"i", i}}, "big"));
    for (int i = 0; i < 100; ++i) specs.push_back(make_job("t", {{"i", 1200 + i}}));
    auto results = co_await p.enqueue_bulk(std::move(specs));
    REQUIRE(results.size() == 1300);
    // A queue's (a shard's) ids grow in the order it stores jobs: the group's in the order given.
    int inversions = 0;
    for (std::size_t i = 1; i < 1200; ++i)
      if (std::stoll(results[i].id) <= std::stoll(results[i - 1].id)) ++inversions;
    CHECK(inversions == 0);
    std::set<std::string> ids;
    for (auto& r : results) ids.insert(r.id);
    CHECK(ids.size() == 1300);
    CHECK(co_await store.group_size(b.queue(), "big") == 1200);
    CHECK((co_await store.counts(b.queue())).enqueued == 1300);
    // Every job's result names it: claimed, each job is where its result says.
    claim_options co;
    co.worker = "w";
    co.max = 200;
    std::map<std::string, std::int64_t> seen;  // id → the i it carries
    for (int round = 0; round < 20 && seen.size() < 101; ++round)
      for (auto& j : co_await store.claim(b.queue(), co))
        seen[j.job.id] = boost::json::parse(j.job.body).at("payload").at("i").as_int64();
    REQUIRE(seen.size() == 101);  // the ungrouped jobs and the group's head
    CHECK(seen.at(results[0].id) == 0);
    for (int i = 0; i < 100; ++i) CHECK(seen.at(results[1200 + static_cast<std::size_t>(i)].id) == 1200 + i);
  });
}

CONFORMANCE("a record written elsewhere with a timeout past what the clock holds runs to its end") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    // Not through a producer, which refuses it: in the steady clock's nanoseconds it would
    // come out negative, a deadline already past, and every run would time out.
    std::vector<encoded_job> raw(1);
    raw[0].body = R"({"type":"t","timeout":9223372036854775807})";
    co_await b.make().enqueue(b.queue(), raw);
    worker w(ctx.get_executor(), b.make(), b.worker_opts(1));
    int ended = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      co_await sleep_for(std::chrono::milliseconds(20));
      ++ended;
    });
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed + w.counters().failed + w.counters().retried > 0; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(ended == 1);
    CHECK(w.counters().completed == 1);
  });
}

CONFORMANCE("a job whose leases keep expiring is dead-lettered after its attempts") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto once = make_job("t", {}, "g");
    once.max_attempts = 1;
    co_await p.enqueue(once);
    claim_options crashed{"crashed-worker", 1, std::chrono::milliseconds(100)};
    CHECK((co_await b.make().claim(b.queue(), crashed)).size() == 1);
    auto o = b.worker_opts(1);
    o.lease_ttl = std::chrono::milliseconds(300);
    worker w(ctx.get_executor(), b.make(), o);
    int runs = 0;
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ++runs;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return w.counters().failed == 1; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(runs == 0);  // never run a second time: it had one attempt
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.dead == 1);
    CHECK(counts.recovered == 1);
  });
}

CONFORMANCE("a grouping rule that gives an empty key refuses the job") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer_options po;
    grouping_rule rule;
    rule.key = "{tenant}";
    po.rules.add(rule);
    producer p(b.make(), b.queue(), po);
    auto job = make_job("t", {{"tenant", ""}});
    std::string error;
    try {
      co_await p.enqueue(job);
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    CHECK(error == "grouping rule with key '{tenant}' gives this job an empty group");
    CHECK((co_await b.make().counts(b.queue())).enqueued == 0);
  });
}

// A burst without round trips: a grouped job's followers come with its lease.
namespace {
job_spec with_id(std::string id, std::string group) {
  auto s = make_job("t", {{"id", id}}, std::move(group));
  s.id = std::move(id);
  return s;
}
// The jobs below have producer-given ids, which finishing releases; a keep names the follower
// that starts next.
finish_item item(const std::string& token, finish_kind kind, std::string producer_id, std::string next = {}) {
  finish_item f;
  f.token = token;
  f.kind = kind;
  f.unique_id = std::move(producer_id);
  f.id = std::move(next);
  return f;
}
}  // namespace

CONFORMANCE("a burst: followers come with the lease, each keep finishes one, and the last ack hands on the next") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    for (auto id : {"a", "b", "c", "d", "e", "f"}) specs.push_back(with_id(id, "g"));
    specs.push_back(with_id("z", beside(kind, "h", "g")));  // (fences are a shard's)
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 10, std::chrono::seconds(30), 2};
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 2);
    auto& g = claimed[0];
    CHECK(g.job.id == "a");
    REQUIRE(g.ahead.size() == 2);
    CHECK(g.ahead[0].id == "b");
    CHECK(g.ahead[1].id == "c");
    CHECK(claimed[1].ahead.empty());         // a group of one job has no followers
    CHECK(claimed[1].fence == g.fence + 3);  // after the fences of g's followers
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.started == 2);  // followers count as started by their keep

    // a and b done, c acked with a request for the next job and 2 followers: d, e and f.
    std::vector<finish_item> items{item(g.token, finish_kind::keep, "a", "b"),
                                   item(g.token, finish_kind::keep, "b", "c"), item(g.token, finish_kind::ack, "c")};
    items[2].want_next = finish_item::next_policy::yes;
    items[2].ahead = 2;
    auto done = co_await store.finish(b.queue(), "w", items, std::chrono::seconds(30));
    REQUIRE(done.size() == 3);
    for (auto& d : done) CHECK(d.lease_held);
    CHECK_FALSE(done[0].next);
    REQUIRE(done[2].next);
    auto next = *done[2].next;
    CHECK(next.job.id == "d");
    REQUIRE(next.ahead.size() == 2);
    CHECK(next.ahead[1].id == "f");
    CHECK(next.fence > claimed[1].fence);
    counts = co_await store.counts(b.queue());
    CHECK(counts.completed == 3);
    CHECK(counts.started == 5);  // a, z; b and c by their keeps; d
    CHECK(counts.running == 2);  // g's new lease and h's

    // A keep on a lease that is gone changes nothing, nor does anything after it.
    std::vector<finish_item> stale{item(g.token, finish_kind::keep, "c")};
    CHECK_FALSE((co_await store.finish(b.queue(), "w", stale, std::chrono::seconds(30)))[0].lease_held);
    std::vector<finish_item> rest{
        item(next.token, finish_kind::keep, "d", "e"), item(next.token, finish_kind::keep, "e", "f"),
        item(next.token, finish_kind::ack, "f"), item(claimed[1].token, finish_kind::ack, "z")};
    done = co_await store.finish(b.queue(), "w", rest, std::chrono::seconds(30));
    for (auto& d : done) CHECK(d.lease_held);
    counts = co_await store.counts(b.queue());
    CHECK(counts.completed == 7);
    CHECK(counts.started == 7);
    CHECK(counts.running == 0);
    CHECK(counts.groups == 0);
    CHECK((co_await store.claim(b.queue(), co)).empty());
    auto report = co_await store.check(b.queue(), false);
    CHECK_MESSAGE(report.problems.empty(), fmt::format("{}", fmt::join(report.problems, "; ")));
  });
}

CONFORMANCE("jobs handed back unstarted go to the head of the ready list, in order, with no attempt counted") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto z = beside(kind, "z", "g"), y = beside(kind, "y", "g");  // (the ready list's order is a shard's)
    std::vector<job_spec> specs{with_id("a", "g"), with_id("b", "g"), with_id(z, ""), with_id(y, "")};
    specs[2].group.reset();  // z and y ungrouped
    specs[3].group.reset();
    co_await p.enqueue_bulk(std::move(specs));
    claim_options co{"w", 2, std::chrono::seconds(30), 1};
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 2);
    auto& g = claimed[0];
    REQUIRE(g.ahead.size() == 1);
    CHECK(claimed[1].job.id == z);
    // a is done and its follower b handed back with z, as a worker does when their leases' local
    // ends came first: both go back in front of y, in this order, and leave the started count.
    std::vector<finish_item> items{item(g.token, finish_kind::keep, "a", "b"), item(g.token, finish_kind::release, "b"),
                                   item(claimed[1].token, finish_kind::release, z)};
    auto done = co_await store.finish(b.queue(), "w", items, std::chrono::seconds(30));
    REQUIRE(done.size() == 3);
    for (auto& d : done) CHECK(d.lease_held);
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.started == 1);  // a
    CHECK(counts.completed == 1);
    CHECK(counts.deferred == 0);
    CHECK(counts.running == 0);
    CHECK(counts.ready_lanes == 3);
    // A lease handed back is gone: handing it back again changes nothing.
    std::vector<finish_item> again{item(claimed[1].token, finish_kind::release, z)};
    CHECK_FALSE((co_await store.finish(b.queue(), "w", again, std::chrono::seconds(30)))[0].lease_held);

    claim_options all{"w", 10, std::chrono::seconds(30), 0};
    auto next = co_await store.claim(b.queue(), all);
    REQUIRE(next.size() == 3);
    CHECK(text(next[0].job).starts_with("0|b|"));  // no attempt counted
    CHECK(text(next[1].job).starts_with("0|" + z + "|"));
    CHECK(next[2].job.id == y);
  });
}

CONFORMANCE("a burst does not go on \"if nobody waits\" past a job handed back in the same call") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto z = beside(kind, "z", "g");  // (the ready list's order is a shard's)
    std::vector<job_spec> specs{with_id("a", "g"), with_id("b", "g"), with_id(z, "")};
    specs[2].group.reset();
    co_await p.enqueue_bulk(std::move(specs));
    claim_options two{"w", 2, std::chrono::seconds(30), 0}, all{"w", 10, std::chrono::seconds(30), 0};
    auto claimed = co_await store.claim(b.queue(), two);  // (options built before co_await: ARCHITECTURE.md)
    REQUIRE(claimed.size() == 2);                         // g (a) and z: nothing else is ready
    std::vector<finish_item> items{item(claimed[1].token, finish_kind::release, z),
                                   item(claimed[0].token, finish_kind::ack, "a")};
    items[1].want_next = finish_item::next_policy::if_nobody_waits;
    auto done = co_await store.finish(b.queue(), "w", items, std::chrono::seconds(30));
    REQUIRE(done.size() == 2);
    CHECK(done[1].lease_held);
    CHECK_FALSE(done[1].next);  // z waits: g's lane goes back behind it
    auto next = co_await store.claim(b.queue(), all);
    REQUIRE(next.size() == 2);
    CHECK(next[0].job.id == z);
    CHECK(next[1].job.id == "b");
  });
}

CONFORMANCE("a job requeued to its group's head during a burst runs right after the burst, and none is lost") {
  // (The running job stays its group's head, where a retry, a halt or the reaper looks for it.)
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto x = with_id("x", "g");
    x.max_attempts = 1;
    co_await p.enqueue(x);
    claim_options co{"w", 10, std::chrono::seconds(30), 2};
    auto first = co_await store.claim(b.queue(), co);
    REQUIRE(first.size() == 1);
    std::vector<finish_item> fail{item(first[0].token, finish_kind::fail, "x")};
    co_await store.finish(b.queue(), "w", fail, std::chrono::seconds(30));

    std::vector<job_spec> specs;
    for (auto id : {"a", "b", "c", "d"}) specs.push_back(with_id(id, "g"));
    co_await p.enqueue_bulk(std::move(specs));
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 1);
    auto token = claimed[0].token;
    REQUIRE(claimed[0].ahead.size() == 2);  // a with b and c
    // An operator puts x back "next in its group" while the worker runs a's burst.
    std::vector<std::string> back{"x"};
    CHECK((co_await store.requeue(b.queue(), back, true)) == back);
    // Each keep makes the follower that starts the group's head, x behind it; c fails once and
    // stays at the head, so it runs again before x.
    std::vector<finish_item> items{item(token, finish_kind::keep, "a", "b"), item(token, finish_kind::keep, "b", "c"),
                                   item(token, finish_kind::retry, "c")};
    auto done = co_await store.finish(b.queue(), "w", items, std::chrono::seconds(30));
    for (auto& d : done) CHECK(d.lease_held);

    std::vector<std::string> order;
    claim_options one{"w", 1, std::chrono::seconds(30)};
    for (int i = 0; i < 5; ++i) {
      auto got = co_await store.claim(b.queue(), one);
      if (got.empty()) break;
      order.push_back(got[0].job.id + "#" + std::to_string(got[0].job.attempts));
      std::vector<finish_item> ack{item(got[0].token, finish_kind::ack, got[0].job.id)};
      co_await store.finish(b.queue(), "w", ack, std::chrono::seconds(30));
    }
    CHECK(order == std::vector<std::string>{"c#1", "x#0", "d#0"});
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.completed == 5);  // a, b, x, c, d
    CHECK(counts.failed == 1);     // x's first run
    CHECK(counts.groups == 0);
    auto report = co_await store.check(b.queue(), false);
    CHECK_MESSAGE(report.problems.empty(), fmt::format("{}", fmt::join(report.problems, "; ")));
  });
}

CONFORMANCE("a burst's follower behind more than 1,000 jobs requeued to its group's head still comes first") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    constexpr int requeued = 1001;
    std::vector<job_spec> specs;
    std::vector<std::string> back;
    for (int i = 0; i < requeued; ++i) {
      back.push_back(fmt::format("x{}", i));
      specs.push_back(with_id(back.back(), "g"));
    }
    co_await p.enqueue_bulk(std::move(specs));
    claim_options one{"w", 1, std::chrono::seconds(30)};
    for (int i = 0; i < requeued; ++i) {  // all dead-lettered, one at a time (one group)
      auto got = co_await store.claim(b.queue(), one);
      REQUIRE(got.size() == 1);
      std::vector<finish_item> fail{item(got[0].token, finish_kind::fail, got[0].job.id)};
      co_await store.finish(b.queue(), "w", fail, std::chrono::seconds(30));
    }
    std::vector<job_spec> burst{with_id("a", "g"), with_id("b", "g")};
    co_await p.enqueue_bulk(std::move(burst));
    claim_options co{"w", 1, std::chrono::seconds(30), 1};
    auto claimed = co_await store.claim(b.queue(), co);
    REQUIRE(claimed.size() == 1);
    REQUIRE(claimed[0].ahead.size() == 1);  // a with b
    CHECK((co_await store.requeue(b.queue(), back, true)).size() == requeued);
    // a's keep makes b the head: b's ack must take b, not x0.
    std::vector<finish_item> items{item(claimed[0].token, finish_kind::keep, "a", "b"),
                                   item(claimed[0].token, finish_kind::ack, "b")};
    for (auto& d : co_await store.finish(b.queue(), "w", items, std::chrono::seconds(30))) CHECK(d.lease_held);
    auto next = co_await store.claim(b.queue(), one);
    REQUIRE(next.size() == 1);
    CHECK_MESSAGE(next[0].job.id == "x0", text(next[0].job));
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.completed == 2);
    auto report = co_await store.check(b.queue(), false);
    CHECK_MESSAGE(report.problems.empty(), fmt::format("{}", fmt::join(report.problems, "; ")));
  });
}

CONFORMANCE("a follower starts under its lease with the next fence, but not on a lease with less than half its ttl") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(1);
    o.burst = 3;
    o.lease_ttl = std::chrono::milliseconds(600);
    o.watchdog_period = std::chrono::seconds(30);             // no renewal: the lease ages as the jobs run
    std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // i, fence
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto i = c.payload().at("i").as_int64();
      runs.emplace_back(i, c.fence());
      if (i == 1) co_await sleep_for(std::chrono::milliseconds(400));  // past half the ttl
    });
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 4; ++i) specs.push_back(make_job("t", {{"i", i}}, "g"));
    co_await p.enqueue_bulk(std::move(specs));
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 4; }, std::chrono::seconds(10)));
    co_await w.stop(std::chrono::seconds(5));
    REQUIRE(runs.size() == 4);
    for (int i = 0; i < 4; ++i) CHECK(runs[static_cast<std::size_t>(i)].first == i);
    CHECK(runs[1].second == runs[0].second + 1);  // 1 followed 0 under 0's lease
    CHECK(runs[3].second == runs[2].second + 1);
    // 1 ended with 200 ms of its lease left: 2 came with a lease of its own, after the fence
    // reserved for the follower 1 did not run.
    CHECK(runs[2].second >= runs[1].second + 2);
    CHECK(w.counters().leases_lost == 0);
  });
}

CONFORMANCE(
    "a follower starts only once its predecessor's keep landed: a lost lease starts none, and the group runs again "
    "from that job") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(1);
    o.id = "w-keep";
    o.burst = 3;
    o.lease_ttl = std::chrono::seconds(3);
    o.watchdog_period = std::chrono::seconds(30);  // only the keep can tell the worker
    o.reap_period = std::chrono::seconds(30);
    auto& admin = b.make();
    std::vector<std::string> runs;     // i#attempt
    std::int64_t completed_at_1 = -1;  // the queue's completed count when 1 started
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto i = c.payload().at("i").as_int64();
      runs.push_back(fmt::format("{}#{}", i, c.attempt()));
      if (i == 0 && c.attempt() == 1) {
        // The lease ends under the running job, as after a stall past its TTL: expired and reaped.
        std::vector<std::string> token{group_token(kind, c.fence(), c.group())};
        co_await admin.extend(b.queue(), o.id, token, o.lease_ttl);
        CHECK(co_await admin.expire_own(b.queue(), o.id) == 1);
        CHECK((co_await admin.reap(b.queue(), reap_options{})).leases == 1);
      } else if (i == 1) {
        completed_at_1 = (co_await admin.counts(b.queue())).completed;
      }
    });
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 3; ++i) specs.push_back(make_job("t", {{"i", i}}, "g"));
    co_await p.enqueue_bulk(std::move(specs));
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 3; }, std::chrono::seconds(20)));
    co_await w.stop(std::chrono::seconds(5));
    // 0 went back to its group's head with its attempt counted, and 1 did not start before 0
    // ran again and its keep was stored.
    CHECK(fmt::format("{}", fmt::join(runs, " ")) == "0#1 0#2 1#1 2#1");
    CHECK(completed_at_1 == 1);
    CHECK(w.counters().leases_lost == 1);  // 0's first keep
  });
}

// follow_policy::pipelined: a follower starts when its predecessor succeeded, the keep behind it.
namespace {
std::string joined(const std::vector<std::string>& v) { return fmt::format("{}", fmt::join(v, " ")); }

// Five jobs of one group, one burst, the worker's finish calls held back until all it would start
// has started (or 500 ms went by): what started meanwhile. Then the calls go through, and
// all five must end completed, in order.
awaitable<std::vector<std::string>> started_while_held(backends& b, follow_policy follow, std::string queue) {
  auto ex = co_await asio::this_coro::executor;
  auto& inner = b.make();
  gated_backend gate(ex, inner);
  producer p(inner, queue);
  std::vector<job_spec> specs;
  for (auto id : {"a", "b", "c", "d", "e"}) specs.push_back(with_id(id, "g"));
  co_await p.enqueue_bulk(std::move(specs));
  auto o = b.worker_opts(2);
  o.queue = queue;
  o.burst = 5;
  o.follow = follow;
  std::vector<std::string> started;
  gate.shut();
  worker w(ex, gate, o);
  w.add_handler("t", [&](job_context& c) -> awaitable<void> {
    started.push_back(c.id());
    co_return;
  });
  w.start();
  co_await eventually([&] { return started.size() == 5; }, std::chrono::milliseconds(500));
  auto held = started;
  CHECK((co_await inner.counts(queue)).completed == 0);
  gate.open();
  CHECK(co_await eventually([&] { return w.counters().completed == 5; }));
  co_await w.stop(std::chrono::seconds(5));
  CHECK(joined(started) == "a b c d e");
  auto counts = co_await inner.counts(queue);
  CHECK(counts.completed == 5);
  CHECK(counts.started == 5);
  CHECK(counts.running == 0);
  CHECK(counts.groups == 0);
  co_return held;
}
}  // namespace

CONFORMANCE("follow: pipelined followers start while the keeps before them are held back, after-commit ones wait") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    CHECK(joined(co_await started_while_held(b, follow_policy::pipelined, b.queue() + "p")) == "a b c d e");
    CHECK(joined(co_await started_while_held(b, follow_policy::after_commit, b.queue() + "c")) == "a");
  });
}

CONFORMANCE("pipelined: a failed job holds back its followers until it ran again") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto o = b.worker_opts(2);
    o.burst = 4;
    o.follow = follow_policy::pipelined;
    o.retry_backoff.initial = std::chrono::milliseconds(20);
    o.retry_backoff.jitter = 0;
    std::vector<std::string> runs;  // i#attempt
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto i = c.payload().at("i").as_int64();
      runs.push_back(fmt::format("{}#{}", i, c.attempt()));
      if (i == 1 && c.attempt() == 1) throw std::runtime_error("once");
      co_return;
    });
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 4; ++i) specs.push_back(make_job("t", {{"i", i}}, "g"));
    co_await p.enqueue_bulk(std::move(specs));
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 4; }, std::chrono::seconds(10)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(joined(runs) == "0#1 1#1 1#2 2#1 3#1");
    CHECK(w.counters().retried == 1);
    auto counts = co_await b.make().counts(b.queue());
    CHECK(counts.completed == 4);
    CHECK(counts.running == 0);
  });
}

CONFORMANCE(
    "pipelined: a keep that finds its lease lost cancels the follower running under it, and the group runs again "
    "from that job") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    gated_backend gate(ctx.get_executor(), b.make());
    auto o = b.worker_opts(1);
    o.id = "w-pipelined";
    o.burst = 3;
    o.follow = follow_policy::pipelined;
    o.lease_ttl = std::chrono::seconds(10);
    o.watchdog_period = std::chrono::seconds(30);  // only the keep can tell the worker
    o.reap_period = std::chrono::seconds(30);
    std::vector<std::string> runs;  // i#attempt
    bool cancelled = false;
    worker w(ctx.get_executor(), gate, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      auto i = c.payload().at("i").as_int64();
      runs.push_back(fmt::format("{}#{}", i, c.attempt()));
      if (i != 1 || runs.size() != 2) co_return;
      // 1 runs under 0's lease while 0's keep is held back. The lease ends meanwhile (a stall
      // past its TTL: expired and reaped), then the keep goes through and finds it gone.
      std::vector<std::string> token{group_token(kind, c.fence() - 1, c.group())};
      co_await admin.extend(b.queue(), o.id, token, o.lease_ttl);
      CHECK(co_await admin.expire_own(b.queue(), o.id) == 1);
      CHECK((co_await admin.reap(b.queue(), reap_options{})).leases == 1);
      gate.open();
      try {
        co_await sleep_for(std::chrono::seconds(30));
      } catch (const boost::system::system_error&) {
        cancelled = true;
        throw;
      }
    });
    producer p(admin, b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 3; ++i) specs.push_back(make_job("t", {{"i", i}}, "g"));
    co_await p.enqueue_bulk(std::move(specs));
    gate.shut();
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 3; }, std::chrono::seconds(20)));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(cancelled);
    // 0's end was never stored: the group ran again from 0, its attempt counted; 1 had not
    // ended, so it runs again as its first attempt.
    CHECK(joined(runs) == "0#1 1#1 0#2 1#1 2#1");
    CHECK(w.counters().leases_lost == 1);
    auto counts = co_await admin.counts(b.queue());
    CHECK(counts.completed == 3);
    CHECK(counts.running == 0);
    CHECK(counts.dead == 0);
  });
}

CONFORMANCE("a claim that comes back as stop cuts it short is handed back unstarted, no attempt counted") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    gated_backend gate(ctx.get_executor(), b.make());
    gate.shut_claims();
    int runs = 0;
    worker w(ctx.get_executor(), gate, b.worker_opts(4));
    w.add_handler("t", [&](job_context&) -> awaitable<void> {
      ++runs;
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return gate.claims_held() == 1; }));
    producer p(admin, b.queue());
    co_await p.enqueue(make_job("t", {}, "g"));
    // stop() begins (stop_claim is emitted), and then the claim's answer, a lease, comes back.
    bool stopped = false;
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          co_await w.stop(std::chrono::seconds(5));
          stopped = true;
        },
        asio::detached);
    CHECK(co_await eventually([&] { return w.state() == worker_state::draining; }));
    gate.open_claims();
    CHECK(co_await eventually([&] { return stopped; }));
    CHECK(runs == 0);  // nothing new starts once stop has begun
    CHECK(w.counters().released == 1);
    auto counts = co_await admin.counts(b.queue());
    CHECK(counts.running == 0);
    CHECK(counts.ready_lanes == 1);
    // The next worker runs it as its first attempt.
    worker next(ctx.get_executor(), admin, b.worker_opts(1));
    int attempt = 0;
    next.add_handler("t", [&](job_context& c) -> awaitable<void> {
      attempt = c.attempt();
      co_return;
    });
    next.start();
    CHECK(co_await eventually([&] { return attempt != 0; }));
    co_await next.stop(std::chrono::seconds(5));
    CHECK(attempt == 1);
  });
}

CONFORMANCE("pipelined: a follower that stop cuts short goes back behind its predecessor's keep, unstarted") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    gated_backend gate(ctx.get_executor(), b.make());
    auto o = b.worker_opts(1);
    o.burst = 3;
    o.follow = follow_policy::pipelined;
    std::vector<std::string> runs;  // i#attempt
    auto h = [&](job_context& c) -> awaitable<void> {
      auto i = c.payload().at("i").as_int64();
      runs.push_back(fmt::format("{}#{}", i, c.attempt()));
      if (i == 1 && runs.size() == 2) co_await sleep_for(std::chrono::seconds(30));  // until stop cancels it
    };
    worker w(ctx.get_executor(), gate, o);
    w.add_handler("t", h);
    producer p(admin, b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 3; ++i) specs.push_back(make_job("t", {{"i", i}}, "g"));
    co_await p.enqueue_bulk(std::move(specs));
    gate.shut();  // 0's keep waits here while 1 runs
    w.start();
    CHECK(co_await eventually([&] { return runs.size() == 2; }));
    bool stopped = false;
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          co_await w.stop(std::chrono::milliseconds(100));
          stopped = true;
        },
        asio::detached);
    co_await sleep_for(std::chrono::milliseconds(300));  // 1 was cancelled; its hand-back waits behind the keep
    CHECK_FALSE(stopped);
    CHECK(gate.held_back() == 1);
    gate.open();
    CHECK(co_await eventually([&] { return stopped; }, std::chrono::seconds(10)));
    auto counts = co_await admin.counts(b.queue());
    CHECK(counts.completed == 1);
    CHECK(counts.running == 0);
    auto report = co_await admin.check(b.queue(), false);
    CHECK_MESSAGE(report.problems.empty(), fmt::format("{}", fmt::join(report.problems, "; ")));
    // 0 is done; 1 was handed back after it, with no attempt counted.
    worker next(ctx.get_executor(), admin, b.worker_opts(1));
    next.add_handler("t", h);
    next.start();
    CHECK(co_await eventually([&] { return next.counters().completed == 2; }));
    co_await next.stop(std::chrono::seconds(5));
    CHECK(joined(runs) == "0#1 1#1 1#1 2#1");
  });
}

CONFORMANCE("pipelined: a keep sent again after its call failed still lands before the results behind it") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    gated_backend gate(ctx.get_executor(), b.make());
    auto o = b.worker_opts(2);
    o.burst = 3;
    o.follow = follow_policy::pipelined;
    std::vector<std::string> runs;
    worker w(ctx.get_executor(), gate, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      runs.push_back(c.id());
      co_return;
    });
    producer p(admin, b.queue());
    std::vector<job_spec> specs{with_id("a", "g"), with_id("b", "g"), with_id("c", "g")};
    co_await p.enqueue_bulk(std::move(specs));
    gate.fail_next_finish();  // a's keep: sent again after a backoff, while b and c end
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 3; }, std::chrono::seconds(10)));
    co_await w.stop(std::chrono::seconds(5));
    // Sent before the keep, b's keep and c's ack would have ended the lease with c left behind.
    CHECK(joined(runs) == "a b c");
    CHECK(w.counters().leases_lost == 0);
    auto counts = co_await admin.counts(b.queue());
    CHECK(counts.completed == 3);
    CHECK(counts.running == 0);
    CHECK(counts.groups == 0);
  });
}

CONFORMANCE("pipelined: a follower that cannot start ends behind its predecessor's keep, which completes") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    auto o = b.worker_opts(1);
    o.burst = 3;
    o.follow = follow_policy::pipelined;
    o.unhandled_limit = std::chrono::milliseconds(0);  // dead-lettered once the worker has asked whether any runs it
    o.reap_period = std::chrono::milliseconds(50);
    o.unhandled_delay = std::chrono::milliseconds(10);
    std::vector<std::string> runs;
    worker w(ctx.get_executor(), store, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      runs.push_back(c.id());
      co_return;
    });
    producer p(store, b.queue());
    auto unknown = with_id("b", "g");
    unknown.type = "nobody-handles-this";
    std::vector<job_spec> specs{with_id("a", "g"), unknown, with_id("c", "g")};
    co_await p.enqueue_bulk(std::move(specs));
    w.start();
    CHECK(co_await eventually([&] { return w.counters().completed == 2 && w.counters().failed == 1; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(joined(runs) == "a c");
    auto dead = co_await store.dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].id == "b");  // not a: its keep landed first
    CHECK(dead[0].error.starts_with("no handler for type nobody-handles-this: no worker has been able to run it"));
    auto counts = co_await store.counts(b.queue());
    CHECK(counts.completed == 2);
    CHECK(counts.running == 0);
    CHECK(counts.groups == 0);
    auto report = co_await store.check(b.queue(), false);
    CHECK_MESSAGE(report.problems.empty(), fmt::format("{}", fmt::join(report.problems, "; ")));
  });
}

CONFORMANCE("pipelined: while a failed follower's end and its predecessor's keep wait, the lease is renewed") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    gated_backend gate(ctx.get_executor(), b.make());
    auto o = b.worker_opts(1);
    o.burst = 3;
    o.follow = follow_policy::pipelined;
    o.lease_ttl = std::chrono::milliseconds(600);
    o.watchdog_period = std::chrono::milliseconds(150);
    o.reap_period = std::chrono::milliseconds(100);
    o.unhandled_limit = std::chrono::milliseconds(0);  // dead-lettered once the worker has asked whether any runs it
    o.unhandled_delay = std::chrono::milliseconds(10);
    std::vector<std::string> runs;
    worker w(ctx.get_executor(), gate, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      runs.push_back(fmt::format("{}#{}", c.id(), c.attempt()));
      co_return;
    });
    producer p(admin, b.queue());
    auto unknown = with_id("b", "g");
    unknown.type = "nobody-handles-this";
    std::vector<job_spec> specs{with_id("a", "g"), unknown, with_id("c", "g")};
    co_await p.enqueue_bulk(std::move(specs));
    gate.shut();  // a's keep and b's end wait here, three lease TTLs, while no job of the lease runs
    w.start();
    CHECK(co_await eventually([&] { return gate.held_back() == 1; }));
    co_await sleep_for(std::chrono::milliseconds(1800));
    gate.open();
    CHECK(co_await eventually([&] { return w.counters().completed == 2 && w.counters().failed == 1; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(joined(runs) == "a#1 c#1");  // a was not charged and run again
    CHECK(w.counters().leases_lost == 0);
    auto counts = co_await admin.counts(b.queue());
    CHECK(counts.completed == 2);
    CHECK(counts.recovered == 0);
    CHECK(counts.running == 0);
    auto dead = co_await admin.dead_letters(b.queue(), 0, 10);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].id == "b");
  });
}

// The head job's first lease runs out unused (a worker that died): the reaper sends it back,
// attempt counted, and the group replays from it.
namespace {
awaitable<void> lose_first_lease(backend& admin, const std::string& queue) {
  claim_options dead_worker{"gone", 1, std::chrono::milliseconds(1), 0};
  REQUIRE((co_await admin.claim(queue, dead_worker)).size() == 1);
  co_await sleep_for(std::chrono::milliseconds(20));
  REQUIRE((co_await admin.reap(queue, reap_options{})).leases == 1);
}
}  // namespace

CONFORMANCE("pipelined: after a replay the follower waits for its predecessor's keep") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    producer p(admin, b.queue());
    std::vector<job_spec> specs{with_id("a", "g"), with_id("b", "g")};
    co_await p.enqueue_bulk(std::move(specs));
    co_await lose_first_lease(admin, b.queue());

    gated_backend gate(ctx.get_executor(), b.make());
    auto o = b.worker_opts(1);
    o.burst = 2;
    o.follow = follow_policy::pipelined;
    std::vector<std::string> runs;  // id#attempt
    worker w(ctx.get_executor(), gate, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      runs.push_back(fmt::format("{}#{}", c.id(), c.attempt()));
      co_return;
    });
    gate.shut();
    w.start();
    CHECK(co_await eventually([&] { return gate.held_back() == 1; }));  // a's keep
    co_await sleep_for(std::chrono::milliseconds(200));
    CHECK(joined(runs) == "a#2");  // b waits: a crash now must be charged to b, not to a again
    gate.open();
    CHECK(co_await eventually([&] { return w.counters().completed == 2; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(joined(runs) == "a#2 b#1");
  });
}

CONFORMANCE("pipelined: after a replay the whole lease waits for its keeps, not only the replayed job") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& admin = b.make();
    producer p(admin, b.queue());
    std::vector<job_spec> specs{with_id("a", "g"), with_id("b", "g"), with_id("c", "g")};
    co_await p.enqueue_bulk(std::move(specs));
    co_await lose_first_lease(admin, b.queue());

    gated_backend gate(ctx.get_executor(), b.make());
    auto o = b.worker_opts(1);
    o.burst = 3;
    o.follow = follow_policy::pipelined;
    std::vector<std::string> runs;  // id#attempt
    worker w(ctx.get_executor(), gate, o);
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      runs.push_back(fmt::format("{}#{}", c.id(), c.attempt()));
      if (c.id() == "b") gate.shut();  // b's keep waits at the gate
      co_return;
    });
    w.start();
    CHECK(co_await eventually([&] { return gate.held_back() == 1; }));  // b's keep
    co_await sleep_for(std::chrono::milliseconds(200));
    // b runs for the first time, but under a lease that replays: c waits for b's keep, or a
    // crash now would charge b, which succeeded, after a.
    CHECK(joined(runs) == "a#2 b#1");
    gate.open();
    CHECK(co_await eventually([&] { return w.counters().completed == 3; }));
    co_await w.stop(std::chrono::seconds(5));
    CHECK(joined(runs) == "a#2 b#1 c#1");
  });
}

CONFORMANCE(
    "a job dead-lettered without a run (give up) keeps its group's place at the head, a failed run's goes to the "
    "tail") {
  std::vector<job_spec> specs;  // (built here: GCC 12 miscompiles braced lists in coroutines)
  // (The ready list's order is a shard's: on a sharded queue groups b and c are in a's shard.)
  auto gb = beside(kind, "b", "a"), gc = beside(kind, "c", "a");
  for (auto [id, group] :
       {std::pair{"a1", "a"}, {"a2", "a"}, {"b1", gb.c_str()}, {"b2", gb.c_str()}, {"c1", gc.c_str()}})
    specs.push_back(with_id(id, group));
  run([kind, &specs](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    co_await p.enqueue_bulk(std::move(specs));
    claim_options one{"w", 1, std::chrono::seconds(30), 0};
    auto end = [&](const claimed_job& c, finish_kind how) -> awaitable<void> {
      std::vector<finish_item> items(1, item(c.token, how, c.job.id));
      items[0].error = "no run";
      auto done = co_await store.finish(b.queue(), "w", std::move(items), std::chrono::seconds(30));
      CHECK(done.at(0).lease_held);
    };
    auto next = [&]() -> awaitable<claimed_job> {
      auto got = co_await store.claim(b.queue(), one);
      REQUIRE(got.size() == 1);
      co_return got[0];
    };
    auto a1 = co_await next();
    CHECK(a1.job.id == "a1");
    co_await end(a1, finish_kind::give_up);  // ready: a, b, c
    auto a2 = co_await next();
    CHECK(a2.job.id == "a2");
    co_await end(a2, finish_kind::ack);  // ready: b, c
    auto b1 = co_await next();
    CHECK(b1.job.id == "b1");
    co_await end(b1, finish_kind::fail);  // ready: c, b
    CHECK((co_await next()).job.id == "c1");
    CHECK((co_await store.counts(b.queue())).dead == 2);
  });
}
