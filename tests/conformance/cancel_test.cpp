// Cancelling kept jobs by id (backend::cancel) on every backend: pending and delayed ones never
// start, a running one's handler is cancelled, and the group goes on in order either way.
#include "conformance/conformance.hpp"

namespace {

// One claim of up to `max` jobs with up to 5 followers each: "<id>[<follower ids>]" per job,
// sorted and joined by spaces, and their tokens.
awaitable<std::pair<std::string, std::vector<std::string>>> claim_all(backend& store, const std::string& queue,
                                                                      std::size_t max = 10) {
  claim_options o;
  o.worker = "w";
  o.max = max;
  o.ahead = 5;
  std::vector<std::string> shown, tokens;
  for (auto& c : co_await store.claim(queue, o)) {
    std::string s = c.job.id + "[";
    for (auto& f : c.ahead) s += (s.back() == '[' ? "" : " ") + f.id;
    shown.push_back(s + "]");
    tokens.push_back(c.token);
  }
  std::sort(shown.begin(), shown.end());
  co_return std::make_pair(fmt::format("{}", fmt::join(shown, " ")), std::move(tokens));
}

awaitable<void> ack_all(backend& store, const std::string& queue, const std::vector<std::string>& tokens) {
  std::vector<finish_item> items;
  for (auto& t : tokens) {
    finish_item f;
    f.token = t;
    f.want_next = finish_item::next_policy::yes;  // (a cancelled next job is not leased: see below)
    items.push_back(std::move(f));
  }
  auto done = co_await store.finish(queue, "w", std::move(items), std::chrono::seconds(30));
  for (auto& r : done) {
    CHECK(r.lease_held);
    CHECK_FALSE(r.next);
  }
}

}  // namespace

CONFORMANCE("cancel: a pending or delayed kept job never starts, and its group goes on in order") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;
    specs.push_back(kept("t", std::string("g"), "c-1"));
    specs.push_back(kept("t", std::string("g"), "c-2"));
    specs.push_back(kept("t", std::string("g"), "c-3"));
    specs.push_back(kept("t", std::nullopt, "c-u"));
    specs.push_back(make_job("t", boost::json::object{}, std::nullopt));  // not kept
    auto later = kept("t", std::string("h"), "c-d");
    later.delay = std::chrono::milliseconds(200);
    specs.push_back(std::move(later));
    auto stored = co_await p.enqueue_bulk(std::move(specs));
    const auto plain = stored[4].id;

    CHECK(co_await p.cancel("c-2") == cancel_outcome::cancelled);
    CHECK(co_await p.cancel("c-u") == cancel_outcome::cancelled);
    CHECK(co_await p.cancel("c-d") == cancel_outcome::cancelled);
    CHECK(co_await p.cancel("c-2") == cancel_outcome::already);
    CHECK(co_await p.cancel(plain) == cancel_outcome::not_found);
    CHECK(co_await p.cancel("no-such-job") == cancel_outcome::not_found);
    auto k = co_await store.kept_job_of(b.queue(), "c-2");
    REQUIRE(k);
    CHECK(k->status == kept_job::state::cancelled);
    CHECK(k->at_ms > 0);
    CHECK(k->group == "g");
    auto found = co_await find_job(store, b.queue(), "c-d");
    REQUIRE(found);
    CHECK(found->status == job_status::state::cancelled);
    // A producer waiting for it hears at once: it will not run.
    auto waited = co_await p.wait("c-u", std::chrono::seconds(20));
    REQUIRE(waited);
    CHECK(waited->status == job_status::state::cancelled);
    std::vector<held_job> asked;  // (no braced lists in a coroutine: GCC 12)
    for (std::string id = "c-1"; !id.empty(); id = id == "c-1"   ? "c-2"
                                                   : id == "c-2" ? "c-u"
                                                   : id == "c-u" ? "none"
                                                                 : "") {
      asked.emplace_back();
      asked.back().id = id;
    }
    std::string said;
    for (bool x : co_await store.cancelled(b.queue(), asked)) said += x ? '1' : '0';
    CHECK(said == "0110");

    // c-1 goes without its cancelled follower; c-u is dropped, the plain job runs.
    auto [first, first_tokens] = co_await claim_all(store, b.queue());
    CHECK(first == (plain < "c-1" ? plain + "[] c-1[]" : "c-1[] " + plain + "[]"));
    co_await ack_all(store, b.queue(), first_tokens);  // c-1's next, c-2, is not leased with the ack
    auto [second, second_tokens] = co_await claim_all(store, b.queue());
    CHECK(second == "c-3[]");  // c-2 dropped where it came up
    co_await ack_all(store, b.queue(), second_tokens);
    co_await sleep_for(std::chrono::milliseconds(250));
    co_await store.promote(b.queue(), 100);
    auto [third, third_tokens] = co_await claim_all(store, b.queue());
    CHECK(third.empty());  // c-d came due and was dropped
    CHECK(third_tokens.empty());

    auto c = co_await store.counts(b.queue());
    CHECK(c.started == 3);
    CHECK(c.completed == 3);
    CHECK(c.groups == 0);
    CHECK(c.ready_lanes == 0);
    CHECK(c.dead == 0);
    for (std::string id = "c-2"; !id.empty(); id = id == "c-2" ? "c-u" : id == "c-u" ? "c-d" : "") {
      auto gone = co_await store.kept_job_of(b.queue(), id);
      REQUIRE(gone);
      CHECK(gone->status == kept_job::state::cancelled);
      CHECK(co_await p.cancel(id) == cancel_outcome::already);
    }
    CHECK(co_await p.cancel("c-1") == cancel_outcome::done);
    // Their producer ids stay taken while they are kept.
    CHECK((co_await p.enqueue(kept("t", std::string("g"), "c-2"))).duplicate);
    CHECK((co_await store.kept_job_of(b.queue(), "c-2"))->status == kept_job::state::cancelled);
    CHECK((co_await p.enqueue(kept("t", std::nullopt, "c-u"))).duplicate);
  });
}

CONFORMANCE("cancel: a running kept job's handler is cancelled at its lease's renewal, and its group goes on") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    producer p(b.make(), b.queue());
    auto o = b.worker_opts(2);
    o.lease_ttl = std::chrono::milliseconds(900);  // renewed every 300 ms
    worker w(ctx.get_executor(), b.make(), o);
    bool started = false, saw_cancelled = false;
    std::vector<std::string> ran;
    w.add_handler("long", [&](job_context& c) -> awaitable<void> {
      started = true;
      try {
        co_await sleep_for(std::chrono::seconds(60));
      } catch (const boost::system::system_error&) {
        saw_cancelled = c.cancelled();
        throw;
      }
    });
    w.add_handler("t", [&](job_context& c) -> awaitable<void> {
      ran.push_back(c.job().id);
      co_return;
    });
    w.start();
    std::vector<job_spec> specs;
    specs.push_back(kept("long", std::string("g"), "run-1"));
    specs.push_back(kept("t", std::string("g"), "after-1"));
    specs.push_back(make_job("t", boost::json::object{}, std::string("g")));
    auto stored = co_await p.enqueue_bulk(std::move(specs));
    // Running, as its worker reports (once a second).
    CHECK(co_await eventually(
        [&]() -> awaitable<bool> {
          auto s = co_await find_job(b.make(), b.queue(), "run-1");
          co_return s && s->status == job_status::state::running;
        },
        std::chrono::seconds(10)));
    CHECK(started);
    auto began = std::chrono::steady_clock::now();
    CHECK(co_await p.cancel("run-1") == cancel_outcome::cancelled);
    // Running and cancelling, until a renewal (every 300 ms) has cancelled the handler and its run
    // ended: then cancelled (under ASan on a sharded cluster the look can come that late).
    auto cancelling = co_await find_job(b.make(), b.queue(), "run-1");
    REQUIRE(cancelling);
    if (cancelling->status == job_status::state::running)
      CHECK(cancelling->cancelling);
    else
      CHECK(cancelling->status == job_status::state::cancelled);
    // A producer waiting for it hears when its run has ended, cancelled.
    auto waited = co_await p.wait("run-1", std::chrono::seconds(10));
    REQUIRE(waited);
    CHECK(waited->status == job_status::state::cancelled);
    CHECK(saw_cancelled);
    CHECK(co_await eventually([&]() -> awaitable<bool> { co_return ran.size() == 2; }, std::chrono::seconds(10)));
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(5));  // (a renewal or two, not the 60 s)
    CHECK(saw_cancelled);
    REQUIRE(ran.size() == 2);
    CHECK(ran[0] == "after-1");  // in order, after it
    CHECK(ran[1] == stored[2].id);
    auto k = co_await b.make().kept_job_of(b.queue(), "run-1");
    REQUIRE(k);
    CHECK(k->status == kept_job::state::cancelled);
    CHECK_FALSE(co_await b.make().dead_letter_of(b.queue(), "run-1"));
    CHECK(w.counters().cancelled == 1);
    CHECK(w.counters().failed == 0);
    co_await w.stop(std::chrono::seconds(5));
    auto c = co_await b.make().counts(b.queue());
    CHECK(c.completed == 2);
    CHECK(c.groups == 0);
    CHECK(c.running == 0);
  });
}

CONFORMANCE("cancel: a claim behind 120 cancelled jobs still leases the live ones after them, in one call") {
  run([kind](asio::io_context& ctx) -> awaitable<void> {
    backends b(ctx, kind);
    auto& store = b.make();
    producer p(store, b.queue());
    std::vector<job_spec> specs;  // (on a sharded queue, all on the shard of "x")
    for (int i = 0; i < 122; ++i) specs.push_back(kept("t", std::nullopt, beside(kind, fmt::format("x-{}", i), "x")));
    auto stored = co_await p.enqueue_bulk(std::move(specs));
    for (int i = 0; i < 120; ++i)
      CHECK(co_await p.cancel(stored[static_cast<std::size_t>(i)].id) == cancel_outcome::cancelled);
    std::string live = stored[120].id + "[] " + stored[121].id + "[]";
    if (stored[121].id < stored[120].id) live = stored[121].id + "[] " + stored[120].id + "[]";
    // One step of a claim (one script call on Redis) stops once it has passed over 100 lanes,
    // lane by lane (here it reads 3 at a time); the claim goes on with another step, which drops
    // the other 20 and leases both. A claim that stopped at the bound would leave them, and on a
    // sharded queue their shard's mark would be gone with it until the reapers' walk.
    auto [claimed, tokens] = co_await claim_all(store, b.queue(), 3);
    CHECK(claimed == live);
    co_await ack_all(store, b.queue(), tokens);
    auto c = co_await store.counts(b.queue());
    CHECK(c.ready_lanes == 0);
    CHECK(c.completed == 2);
  });
}
