// Jobs enqueued with a keep (job_spec::keep), found by id on every backend: pending, delayed,
// waiting for a retry, completed (until their keep runs out), and out of the index once dead.
#include "conformance/conformance.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Leases the ready jobs (at most `max`) and finishes each as `finish` says (nullopt: keeps the lease).
template <class F>
awaitable<void> lease_and(backend& store, const std::string& queue, std::size_t max, F finish) {
  claim_options o;
  o.worker = "w";
  o.max = max;
  std::vector<finish_item> items;
  for (auto& c : co_await store.claim(queue, o)) {
    if (auto item = finish(c)) {
      item->token = c.token;
      if (c.job.id.find_first_not_of("0123456789") != std::string::npos) item->unique_id = c.job.id;  // a producer's
      items.push_back(std::move(*item));
    }
  }
  co_await store.finish(queue, "w", std::move(items), std::chrono::seconds(30));
}

// Once the waiters' subscriptions hold: their notices (one a shard, which move the version of
// ends as an end does) have all come, and the version stays put for 200 ms. (At most 5 s.)
awaitable<void> settled(backend& store, const std::string& queue) {
  auto version = store.ended_version(queue);
  for (int quiet = 0, i = 0; quiet < 4 && i < 100; ++i) {
    co_await sleep_for(std::chrono::milliseconds(50));
    auto now = store.ended_version(queue);
    quiet = now == version ? quiet + 1 : 0;
    version = now;
  }
}

}  // namespace

CONFORMANCE("kept jobs: found by id while pending, delayed, retrying and done, but not once dead nor when not kept") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto a = (co_await p.enqueue(kept("t", std::nullopt, "a-1"))).id;
    auto first = (co_await p.enqueue(kept("t", std::string("g")))).id;
    auto second = (co_await p.enqueue(kept("t", std::string("g")))).id;
    auto later_spec = kept("t", std::string("h"));
    later_spec.delay = std::chrono::hours(1);
    auto later = (co_await p.enqueue(later_spec)).id;
    auto plain = (co_await p.enqueue(make_job("t", boost::json::object{}))).id;

    auto look = [&](std::string id) { return b.make().kept_job_of(b.queue(), std::move(id)); };
    auto ka = co_await look(a);
    REQUIRE(ka);
    CHECK(ka->status == kept_job::state::pending);
    CHECK(ka->group.empty());
    CHECK(ka->record.id == a);
    CHECK(decode_job("0|" + a + "|" + ka->record.body, "").type == "t");
    auto ks = co_await look(second);
    REQUIRE(ks);
    CHECK(ks->status == kept_job::state::pending);
    CHECK(ks->group == "g");
    auto kl = co_await look(later);
    REQUIRE(kl);
    CHECK(kl->status == kept_job::state::delayed);
    CHECK(kl->group == "h");
    CHECK(kl->at_ms > now_ms() + 3'000'000);
    CHECK_FALSE(co_await look(plain));
    CHECK_FALSE(co_await look("nobody"));

    // a and the plain job complete, the group's first fails for good.
    co_await lease_and(store, b.queue(), 10, [&](const claimed_job& c) -> std::optional<finish_item> {
      finish_item f;
      f.kind = c.job.id == first ? finish_kind::fail : finish_kind::ack;
      f.error = "no";
      if (c.job.id == a) {
        f.unique_id = a;
        f.result = R"({"rows":3})";
      }
      return f;
    });
    auto done = co_await look(a);
    REQUIRE(done);
    CHECK(done->status == kept_job::state::done);
    CHECK(done->result == R"({"rows":3})");
    CHECK(done->at_ms > 0);
    CHECK(done->record.id == a);
    CHECK_FALSE(co_await look(first));
    CHECK(co_await store.dead_letter_of(b.queue(), first));

    // The group's next fails and waits a minute for its retry, its attempt counted.
    co_await lease_and(store, b.queue(), 10, [&](const claimed_job& c) -> std::optional<finish_item> {
      finish_item f;
      f.kind = finish_kind::retry;
      f.delay = std::chrono::minutes(1);
      CHECK(c.job.id == second);
      return f;
    });
    auto retrying = co_await look(second);
    REQUIRE(retrying);
    CHECK(retrying->status == kept_job::state::delayed);
    CHECK(retrying->record.attempts == 1);

    // Requeued from the dead letters, the failed one is pending again.
    std::vector<std::string> letters(1, first);
    CHECK((co_await store.requeue(b.queue(), std::move(letters), false)).size() == 1);
    auto back = co_await look(first);
    REQUIRE(back);
    CHECK(back->status == kept_job::state::pending);
    CHECK(back->group == "g");
    CHECK(back->record.attempts == 0);

    // A producer id enqueued again while its completed job is kept: taken, nothing stored.
    CHECK((co_await p.enqueue(kept("t", std::nullopt, "a-1"))).duplicate);
    CHECK((co_await look(a))->status == kept_job::state::done);
  });
}

CONFORMANCE("kept jobs: a completed job is found for its keep, then not") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto spec = kept("t", std::nullopt);
    spec.keep = std::chrono::milliseconds(300);
    auto id = (co_await p.enqueue(spec)).id;
    auto ack = [](const claimed_job&) -> std::optional<finish_item> { return finish_item{}; };
    co_await lease_and(store, b.queue(), 1, ack);
    auto done = co_await store.kept_job_of(b.queue(), id);
    REQUIRE(done);
    CHECK(done->status == kept_job::state::done);
    co_await sleep_for(std::chrono::milliseconds(400));
    CHECK_FALSE(co_await store.kept_job_of(b.queue(), id));
    // Another completion takes the entry that ran out away; the new one stays.
    auto next = (co_await p.enqueue(spec)).id;
    co_await lease_and(store, b.queue(), 1, ack);
    CHECK_FALSE(co_await store.kept_job_of(b.queue(), id));
    CHECK(co_await store.kept_job_of(b.queue(), next));
  });
}

CONFORMANCE("kept jobs: a producer id stays taken until the keep after its job's end runs out") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    auto spec = kept("t", std::string("g"), "m-1");
    spec.keep = std::chrono::milliseconds(300);
    CHECK_FALSE((co_await p.enqueue(spec)).duplicate);
    auto ack = [](const claimed_job&) -> std::optional<finish_item> { return finish_item{}; };
    co_await lease_and(store, b.queue(), 1, ack);
    CHECK((co_await store.kept_job_of(b.queue(), "m-1"))->status == kept_job::state::done);
    // Done and kept: taken, alone, in a batch and with a max group size (which it does not count).
    CHECK((co_await p.enqueue(spec)).duplicate);
    auto plain = make_job("t", boost::json::object{}, std::string("g"));
    plain.id = "m-1";
    plain.max_group_size = 1;
    std::vector<job_spec> batch{plain, make_job("t", boost::json::object{}, std::string("g"))};
    batch[1].max_group_size = 1;
    auto stored = co_await p.enqueue_bulk(batch);
    CHECK(stored.at(0).duplicate);
    CHECK_FALSE(stored.at(1).duplicate);
    CHECK(co_await store.group_size(b.queue(), "g") == 1);
    co_await lease_and(store, b.queue(), 1, ack);
    // Once the keep ran out, the id is free again: a new job.
    co_await sleep_for(std::chrono::milliseconds(400));
    CHECK_FALSE((co_await p.enqueue(spec)).duplicate);
    CHECK((co_await store.kept_job_of(b.queue(), "m-1"))->status == kept_job::state::pending);
  });
}

CONFORMANCE("kept jobs: a worker's runs, bursts of a group included, leave every job done") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 40; ++i)
      specs.push_back(kept("t", i % 4 == 0 ? std::nullopt : std::optional(std::string("g"))));
    std::vector<std::string> ids;
    for (auto& r : co_await p.enqueue_bulk(std::move(specs))) ids.push_back(r.id);
    worker w(ctx.get_executor(), b.make(), b.worker_opts(4));
    w.add_handler("t", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          for (auto& id : ids) {
            auto k = co_await b.make().kept_job_of(b.queue(), id);
            if (!k || k->status != kept_job::state::done) co_return false;
          }
          co_return true;
        },
        std::chrono::seconds(20)));
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("kept jobs: a handler's result is kept with a kept job, and one over the bound fails its run") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    std::vector<job_spec> specs;
    for (int i = 0; i < 12; ++i) {
      auto s = kept("sum", i % 3 == 0 ? std::nullopt : std::optional(std::string("g")));
      boost::json::object payload;  // (no braced list of temporaries in a coroutine: GCC 12)
      payload["n"] = i;
      s.payload = std::move(payload);
      if (i == 11) s.keep = std::chrono::milliseconds(0);  // not kept: its result goes nowhere
      specs.push_back(std::move(s));
    }
    auto big = kept("big", std::nullopt, "big-1");
    big.max_attempts = 1;
    specs.push_back(std::move(big));
    std::vector<std::string> ids;
    for (auto& r : co_await p.enqueue_bulk(std::move(specs))) ids.push_back(r.id);
    auto o = b.worker_opts(2);
    o.max_result_bytes = 40;
    worker w(ctx.get_executor(), b.make(), o);
    w.add_handler("sum", [](job_context& c) -> awaitable<void> {
      boost::json::object r;
      r["twice"] = c.payload().at("n").as_int64() * 2;
      c.set_result(r);
      co_return;
    });
    w.add_handler("big", [](job_context& c) -> awaitable<void> {
      c.set_result(boost::json::value(std::string(100, 'x')));
      co_return;
    });
    w.start();
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          auto c = co_await b.make().counts(b.queue());
          co_return c.completed == 12 && c.dead == 1;
        },
        std::chrono::seconds(15)));
    co_await w.stop(std::chrono::seconds(5));
    for (int i = 0; i < 11; ++i) {
      auto k = co_await b.make().kept_job_of(b.queue(), ids[static_cast<std::size_t>(i)]);
      REQUIRE(k);
      CHECK(k->status == kept_job::state::done);
      CHECK(k->result == fmt::format(R"({{"twice":{}}})", i * 2));
    }
    CHECK_FALSE(co_await b.make().kept_job_of(b.queue(), ids[11]));
    auto letter = co_await b.make().dead_letter_of(b.queue(), "big-1");
    REQUIRE(letter);
    CHECK(letter->error.find("result is 102 bytes encoded; the limit is 40") != std::string::npos);
  });
}

CONFORMANCE("kept jobs: a producer waits for a job's end, woken by it: done with its result, dead, or not yet") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    w.add_handler("slow", [](job_context& c) -> awaitable<void> {
      co_await sleep_for(std::chrono::milliseconds(300));
      boost::json::object r;
      r["ok"] = true;
      c.set_result(r);
    });
    w.add_handler("bad", [](job_context&) -> awaitable<void> {
      throw permanent_failure("no such row");
      co_return;
    });
    w.start();
    auto began = std::chrono::steady_clock::now();
    auto slow = (co_await p.enqueue(kept("slow", std::string("g")))).id;
    auto done = co_await p.wait(slow, std::chrono::seconds(20));
    auto took = std::chrono::steady_clock::now() - began;
    REQUIRE(done);
    CHECK(done->status == job_status::state::done);
    CHECK(done->result == R"({"ok":true})");
    CHECK(took >= std::chrono::milliseconds(300));
    CHECK(took < std::chrono::seconds(10));  // (woken by its end, not by the timeout)

    auto bad = (co_await p.enqueue(kept("bad", std::nullopt))).id;
    auto dead = co_await p.wait(bad, std::chrono::seconds(20));
    REQUIRE(dead);
    CHECK(dead->status == job_status::state::dead);
    REQUIRE(dead->dead);
    CHECK(dead->dead->error.find("no such row") != std::string::npos);

    // No worker runs "nobody": the wait runs out and says what the job is doing.
    began = std::chrono::steady_clock::now();
    auto waits = (co_await p.enqueue(kept("nobody", std::nullopt))).id;
    auto pending = co_await p.wait(waits, std::chrono::milliseconds(400));
    REQUIRE(pending);
    // (pending, or delayed: the worker, which has no handler for it, hands it back for a while)
    CHECK((pending->status == job_status::state::pending || pending->status == job_status::state::delayed));
    CHECK(std::chrono::steady_clock::now() - began >= std::chrono::milliseconds(400));
    CHECK_FALSE(co_await p.wait("no-such-job", std::chrono::seconds(5)));  // (not kept: at once)
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("kept jobs: enqueue_and_wait looks no job up before its end, and other jobs' ends wake no look on Redis") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    gated_backend counted(ctx.get_executor(), b.make());
    producer p(counted, b.queue());
    CHECK_FALSE(co_await p.wait("none", std::chrono::seconds(5)));  // (subscribed first, as above)
    CHECK_FALSE(co_await p.wait("none", std::chrono::seconds(5)));
    co_await settled(counted, b.queue());
    worker w(ctx.get_executor(), b.make(), b.worker_opts(4));
    w.add_handler("slow", [](job_context& c) -> awaitable<void> {
      co_await sleep_for(std::chrono::milliseconds(300));
      boost::json::object r;
      r["rows"] = 7;
      c.set_result(r);
    });
    w.add_handler("quick", [](job_context&) -> awaitable<void> { co_return; });
    w.start();
    bool on_redis = kind != backend_kind::memory && kind != backend_kind::sharded_memory;
    bool told = on_redis;  // (Redis's news of a job's end carries it)

    auto before = counted.looks();
    auto waited = co_await p.enqueue_and_wait(kept("slow", std::string("g")), std::chrono::seconds(20));
    CHECK_FALSE(waited.enqueued.duplicate);
    REQUIRE(waited.end);
    CHECK(waited.end->id == waited.enqueued.id);
    CHECK(waited.end->status == job_status::state::done);
    CHECK(waited.end->result == R"({"rows":7})");
    if (told)
      CHECK(counted.looks() == before);
    else
      CHECK(counted.looks() - before >= 1);  // (after its end's wake-up)

    // A job of the producer's own id is looked up first (an earlier job of that id may have ended).
    before = counted.looks();
    waited = co_await p.enqueue_and_wait(kept("quick", std::nullopt, "mine-1"), std::chrono::seconds(20));
    REQUIRE(waited.end);
    CHECK(waited.end->status == job_status::state::done);
    CHECK(counted.looks() - before >= 1);
    // A job with no keep is not waited for: its status at once.
    auto plain = job_spec{};
    plain.type = "quick";
    waited = co_await p.enqueue_and_wait(plain, std::chrono::seconds(20));
    CHECK_FALSE(waited.end);

    // A waiter for a job that does not end (due in an hour), while 40 others end: on Redis it is woken by each
    // and looks for none of them.
    auto later = kept("quick", std::nullopt);
    later.delay = std::chrono::hours(1);
    auto stays = (co_await p.enqueue(later)).id;
    std::optional<job_status> late;
    bool back = false;
    auto first_look = counted.looks();
    asio::co_spawn(
        ctx,
        [&]() -> awaitable<void> {
          late = co_await p.wait(stays, std::chrono::seconds(4));
          back = true;
        },
        asio::detached);
    for (int i = 0; i < 500 && counted.looks() == first_look; ++i) co_await sleep_for(std::chrono::milliseconds(10));
    before = counted.looks();
    producer other(b.make(), b.queue());
    std::vector<job_spec> quick;
    for (int i = 0; i < 40; ++i) quick.push_back(kept("quick", std::nullopt));
    auto ended = co_await other.enqueue_bulk(std::move(quick));
    for (const auto& r : ended) {
      auto end = co_await other.wait(r.id, std::chrono::seconds(20));
      REQUIRE(end);
      CHECK(end->status == job_status::state::done);
    }
    co_await sleep_for(std::chrono::milliseconds(100));  // (the last end's message reaches the waiter)
    CHECK_FALSE(back);
    if (on_redis) CHECK(counted.looks() == before);
    for (int i = 0; i < 600 && !back; ++i) co_await sleep_for(std::chrono::milliseconds(10));
    REQUIRE(late);
    CHECK(late->status == job_status::state::delayed);
    co_await w.stop(std::chrono::seconds(5));
  });
}

CONFORMANCE("kept jobs: a waiter takes a job's end from its message where the store sends one, with no second look") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    gated_backend counted(ctx.get_executor(), b.make());
    producer p(counted, b.queue());
    // Subscribed first (the notice that a subscription holds wakes waiters too): a wait for an
    // id that is not kept reads the version, which subscribes on Redis, and returns at once. (Twice:
    // a sharded queue's versions are read once it knows the queue, which its first look does.)
    CHECK_FALSE(co_await p.wait("none", std::chrono::seconds(5)));
    CHECK_FALSE(co_await p.wait("none", std::chrono::seconds(5)));
    co_await settled(counted, b.queue());
    worker w(ctx.get_executor(), b.make(), b.worker_opts(2));
    w.add_handler("slow", [](job_context& c) -> awaitable<void> {
      co_await sleep_for(std::chrono::milliseconds(300));  // (the waiter's first look comes before its end)
      boost::json::object r;
      r["rows"] = 3;
      c.set_result(r);
    });
    w.start();
    auto id = (co_await p.enqueue(kept("slow", std::string("g")))).id;
    auto before = counted.looks();
    auto done = co_await p.wait(id, std::chrono::seconds(20));
    REQUIRE(done);
    CHECK(done->status == job_status::state::done);
    CHECK(done->result == R"({"rows":3})");
    CHECK(done->group == "g");
    // Redis sends the entry with the end's message, from the job's shard on a sharded queue; the
    // memory backend sends no news, and its waiter looks again.
    bool told = kind != backend_kind::memory && kind != backend_kind::sharded_memory;
    if (told)
      CHECK(counted.looks() - before == 1);
    else
      CHECK(counted.looks() - before >= 2);
    if (plain_keys(kind)) {  // the same through a sharded_backend of one shard, as the jobrt command makes
      sharded_backend one(b.make(), 1);
      gated_backend through(ctx.get_executor(), one);
      producer q(through, b.queue());
      CHECK_FALSE(co_await q.wait("none", std::chrono::seconds(5)));
      CHECK_FALSE(co_await q.wait("none", std::chrono::seconds(5)));
      co_await sleep_for(std::chrono::milliseconds(200));
      id = (co_await q.enqueue(kept("slow", std::nullopt))).id;
      before = through.looks();
      done = co_await q.wait(id, std::chrono::seconds(20));
      REQUIRE(done);
      CHECK(done->status == job_status::state::done);
      CHECK(through.looks() - before == 1);

      // The end comes while the waiter's first look is on its way (it read pending): the news
      // came after the version it read, and tells the end with no second look.
      id = (co_await q.enqueue(kept("slow", std::nullopt))).id;
      through.shut_looks();
      std::optional<job_status> late;
      asio::co_spawn(
          ctx, [&]() -> awaitable<void> { late = co_await q.wait(id, std::chrono::seconds(20)); }, asio::detached);
      for (int i = 0; i < 500 && through.looks_held() == 0; ++i) co_await sleep_for(std::chrono::milliseconds(10));
      REQUIRE(through.looks_held() == 1);
      before = through.looks();
      for (int i = 0; i < 1000; ++i) {  // until it is done (the worker runs it)
        auto k = co_await b.make().kept_job_of(b.queue(), id);
        if (k && k->status == kept_job::state::done) break;
        co_await sleep_for(std::chrono::milliseconds(10));
      }
      co_await sleep_for(std::chrono::milliseconds(100));  // (the end's message reaches the waiter)
      through.open_looks();
      for (int i = 0; i < 500 && !late; ++i) co_await sleep_for(std::chrono::milliseconds(10));
      REQUIRE(late);
      CHECK(late->status == job_status::state::done);
      CHECK(through.looks() == before);
    }
    co_await w.stop(std::chrono::seconds(5));
  });
}

TEST_CASE("kept jobs: a keep below zero or over a year is refused, naming it") {
  auto spec = make_job("t", boost::json::object{});
  spec.keep = std::chrono::milliseconds(-1);
  CHECK_THROWS_WITH_AS(producer::check(spec), doctest::Contains("keep is -1 ms"), std::invalid_argument);
  spec.keep = max_job_keep + std::chrono::milliseconds(1);
  CHECK_THROWS_WITH_AS(producer::check(spec), doctest::Contains("keep is"), std::invalid_argument);
  spec.keep = max_job_keep;
  CHECK_NOTHROW(producer::check(spec));
}
