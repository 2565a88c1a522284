// A Redis Stream into a queue (bridge.hpp). One bridge of a consumer group holds the group's
// lock and consumes: it takes over what the group has pending, then reads new entries with a
// blocking XREADGROUP, stores each batch with the producer and acknowledges it. The others wait
// for the lock. State lives on one strand; stop() reaches it by a post. On a Redis Cluster the
// commands go where their key's slot lives (redis_link), and the blocking reader is opened at the
// primary of the stream's slot, and opened again where it moved when a read meets a redirect.
#include "bridge/storing.hpp"
#include "redis/cluster_map.hpp"
#include "redis/redis_link.hpp"
#include "strand.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/error.hpp>
#include <jobrt/log.hpp>
#include <jobrt/mutex.hpp>
#include <jobrt/redis/connection.hpp>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <variant>

namespace jobrt {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr std::string_view source_name = "bridge";

// One entry of a stream reply: its id and fields (none: the entry was deleted meanwhile).
struct entry {
  std::string id;
  std::vector<std::pair<std::string, std::string>> fields;
  bool deleted = false;
};

// The entries of one stream's part of a reply ([[id, [f, v, ...]], ...]).
std::vector<entry> entries_of(const redis::reply& list) {
  std::vector<entry> out;
  if (list.kind() != redis::reply_kind::array) return out;
  for (const auto& item : list.as_array()) {
    if (item.kind() != redis::reply_kind::array) continue;  // (XAUTOCLAIM before 7.0: a deleted entry)
    const auto& parts = item.as_array();
    entry e;
    e.id = parts.at(0).as_string();
    if (parts.size() < 2 || parts[1].is_nil()) {
      e.deleted = true;
    } else {
      const auto& kv = parts[1].as_array();
      for (std::size_t i = 0; i + 1 < kv.size(); i += 2)
        e.fields.emplace_back(kv[i].as_string(), kv[i + 1].as_string());
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

struct stream_bridge::impl {
  impl(asio::any_io_executor ex, stream_source from_, producer to_, bridge_mapping how_)
      : strand(asio::make_strand(ex)),
        from(std::move(from_)),
        to(std::move(to_)),
        how(std::move(how_)),
        link(strand, seeds_of(from)),
        locks(strand, seeds_of(from)),
        wake(strand, asio::steady_timer::time_point::max()) {}

  asio::strand<asio::any_io_executor> strand;
  stream_source from;
  producer to;
  bridge_mapping how;
  detail::redis_link link;                           // XGROUP, XACK, XADD to the dead letters, XINFO
  std::optional<redis::blocking_connection> reader;  // XREADGROUP, XAUTOCLAIM (opened at the first read)
  redis_lock_service locks;
  asio::steady_timer wake;  // at its earliest once stop() was called: every wait on it ends
  std::atomic<bool> stopping{false};
  mutable std::mutex counters_mutex;
  bridge_counters counts;

  static std::vector<redis::config> seeds_of(const stream_source& s) {
    std::vector<redis::config> seeds{s.server};
    seeds.insert(seeds.end(), s.other_seeds.begin(), s.other_seeds.end());
    return seeds;
  }

  template <class F>
  void count(F change) {
    std::lock_guard lock(counters_mutex);
    change(counts);
  }

  std::string source() const { return from.address(); }

  // Waits `d`, or less when stop() comes. False when it came.
  asio::awaitable<bool> pause(std::chrono::milliseconds d) {
    co_await detail::pause_unless_woken(wake, d);
    co_return !stopping;
  }

  // A request on the shared connection (XGROUP, XACK, the dead letters' XADD), bounded by a lock
  // TTL (1 s at least), and cut short (nullopt) `grace` after stop(), or after its start when it
  // came after the stop: while the
  // server cannot be reached it would wait for a reconnect, saying nothing, and a stop with it.
  using outcome = std::pair<boost::system::error_code, redis::reply>;
  asio::awaitable<std::optional<outcome>> call(redis::request req, const std::string& key,
                                               std::chrono::milliseconds grace) {
    req.options.timeout = std::max<std::chrono::milliseconds>(from.lock_ttl, std::chrono::seconds(1));
    co_return co_await detail::unless_stopped(link.try_exec(std::move(req), key), wake, grace);
  }

  // What a failed call met: the server's error, or why there is no connection to it.
  std::string problem_of(const boost::system::error_code& ec, const redis::reply& r) const {
    if (r.is_error()) return std::string(r.error_message());
    auto what = ec.message();
    if (ec == errc::not_connected || ec == errc::timeout)
      if (auto last = link.plain().last_error(); !last.empty()) what += " (" + last + ")";
    return what;
  }

  // Makes the consumer group if it is missing; a failure that waiting may mend is tried again.
  asio::awaitable<bool> make_group() {
    for (;;) {
      auto done = co_await call(redis::request("XGROUP", "CREATE", from.stream, from.group, "0", "MKSTREAM"),
                                from.stream, std::chrono::milliseconds(0));
      if (!done) co_return false;
      auto& [ec, r] = *done;
      if (!ec || r.error_message().starts_with("BUSYGROUP")) co_return true;
      if (r.error_message().starts_with("WRONGTYPE"))
        throw std::runtime_error(fmt::format("bridge: key {} at {} is not a stream", from.stream, source()));
      log(log_level::warn, source_name, "making consumer group {} of stream {} at {}: {}", from.group, from.stream,
          source(), problem_of(ec, r));
      if (!co_await pause(std::chrono::milliseconds(500))) co_return false;
    }
  }

  // Opens the reader at the stream's server: on a cluster, the primary of its slot now. An empty
  // text, or what went wrong.
  asio::awaitable<std::string> open_reader() {
    std::string problem;
    try {
      auto node = co_await link.node_of(from.stream);
      if (!node.client_name.empty()) node.client_name += ":blocking";  // (as the backend's own)
      reader.emplace(strand, node);
      reader->start();
    } catch (const std::exception& e) {
      problem = e.what();
    }
    co_return problem;
  }

  // A read on the blocking connection, cut short by stop(): nullopt then. A failure is logged
  // and gives a nil reply after a pause (the connection reconnects by itself; on a cluster a
  // redirect or a node that cannot be reached makes the reader open again where the slot is
  // now), and sets read_failed: the entries of a reply that was lost are pending here now.
  bool read_failed = false;
  std::chrono::milliseconds finding{0};                 // the pause before the next try to find the stream's node
  std::chrono::steady_clock::time_point finding_since;  // when that began, or was last said
  asio::awaitable<std::optional<redis::reply>> read(redis::request req) {
    if (!reader) {
      auto problem = co_await open_reader();
      if (!problem.empty()) {
        read_failed = true;
        log(log_level::warn, source_name, "finding the server of stream {}: {}", from.stream, problem);
        if (!co_await pause(std::chrono::milliseconds(500))) co_return std::nullopt;
        co_return redis::reply();
      }
    }
    // (On a cluster a node that cannot be reached is not waited for: it may be failing over.)
    if (link.known_cluster() != nullptr) req.options.wait_for_reconnect = false;
    auto done = co_await (reader->async_exec(std::move(req), asio::as_tuple(asio::use_awaitable)) ||
                          wake.async_wait(asio::as_tuple(asio::use_awaitable)));
    if (stopping || done.index() == 1) co_return std::nullopt;
    auto [ec, r] = std::get<0>(std::move(done));
    if (!ec) {
      finding = std::chrono::milliseconds(0);
      co_return std::move(r);
    }
    read_failed = true;
    auto where = reader->get_config().address();
    if (r.error_message().starts_with("WRONGTYPE"))
      throw std::runtime_error(fmt::format("bridge: key {} at {} is not a stream", from.stream, where));
    auto redirect = redis::detail::classify(r.error_message()).kind;
    // (A migration deletes the key where it was: a read blocked there is UNBLOCKED.)
    bool moving = ec != errc::server_error || redirect != redis::detail::cluster_error::other ||
                  r.error_message().starts_with("UNBLOCKED");
    if (r.error_message().starts_with("NOGROUP")) {
      // Deleted under us (XGROUP DESTROY, or a failover to a replica that never had it): made
      // again, from the stream's start, so every entry still in the stream is read again.
      log(log_level::warn, source_name,
          "consumer group {} of stream {} at {} is gone: making it again from the stream's start; entries read "
          "before come again, and those whose jobs' ids are still taken (their keep) are duplicates",
          from.group, from.stream, where);
      if (!co_await make_group()) co_return std::nullopt;
    } else if (auto* cluster = link.known_cluster(); cluster != nullptr && moving) {
      // The slot moved, moves, or its primary is away (failing over, say): the map read again,
      // and the next read opens the reader where the slot is then. The pauses double from 10 ms
      // to 500 ms while it lasts (a failover takes seconds); said at its start, and as a warning
      // every 5 s while it goes on.
      auto now = std::chrono::steady_clock::now();
      if (finding.count() == 0) finding_since = now;
      bool long_spell = now - finding_since >= std::chrono::seconds(5);
      if (finding.count() == 0 || long_spell) {
        auto why = r.is_error() ? std::string(r.error_message()) : ec.message();
        if (!r.is_error() && !reader->last_error().empty()) why += " (" + reader->last_error() + ")";
        log(long_spell ? log_level::warn : log_level::info, source_name,
            "reading stream {} at {}: {}; finding its node again", from.stream, where, why);
        if (long_spell) finding_since = now;
      }
      finding = std::clamp(finding * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(500));
      reader->close();
      reader.reset();
      std::string failed;
      try {
        co_await cluster->refresh();  // (a failed read is kept for the requests' errors; only a closed one throws)
      } catch (const std::exception& e) {
        failed = e.what();
      }
      if (!failed.empty()) log(log_level::warn, source_name, "reading the cluster's slot map: {}", failed);
      if (!co_await pause(finding)) co_return std::nullopt;
    } else {
      log(log_level::warn, source_name, "reading stream {} at {}: {}", from.stream, where,
          r.is_error() ? std::string(r.error_message()) : ec.message());
      if (!co_await pause(std::chrono::milliseconds(500))) co_return std::nullopt;
    }
    co_return redis::reply();
  }

  // Sends `req` on the shared connection until every reply in it is no error; false when stop()
  // came first. (A call on its way at the stop has 5 s more: the batch in hand is dead-lettered
  // and acknowledged, as its jobs' store.)
  asio::awaitable<bool> write(const redis::request& req, const std::string& key, std::string_view what) {
    for (std::chrono::milliseconds wait(100);;) {
      auto done = co_await call(req, key, std::chrono::seconds(5));
      if (!done) co_return false;
      auto& [ec, r] = *done;
      std::string problem = ec ? problem_of(ec, r) : std::string();
      if (problem.empty() && r.kind() == redis::reply_kind::array)
        for (const auto& one : r.as_array())
          if (one.is_error() && problem.empty()) problem = one.error_message();
      if (problem.empty()) co_return true;
      log(log_level::warn, source_name, "{} of stream {}: {}; trying again in {} ms", what, from.stream, problem,
          wait.count());
      if (!co_await pause(wait)) co_return false;
      wait = std::min<std::chrono::milliseconds>(wait * 2, std::chrono::seconds(5));
    }
  }

  // Stores the jobs of these entries, sends the ones that cannot be jobs to the dead letters,
  // then acknowledges them all. False when they were not all acknowledged: stop() came, or the
  // lock was lost before they were stored (the next holder takes them over, in order).
  asio::awaitable<bool> store(std::vector<entry> entries, const lock_lease& held) {
    if (entries.empty()) co_return true;
    std::vector<bridge_message> batch;
    std::vector<const entry*> of_batch;  // the entry of each message
    for (const auto& e : entries) {
      if (e.deleted) continue;  // (deleted while pending: only the ack is left to do)
      bridge_message m;
      m.fields = e.fields;
      m.default_id = from.stream + "@" + e.id;
      batch.push_back(std::move(m));
      of_batch.push_back(&e);
    }
    auto sorted = detail::sort_batch(batch, how, to.options());
    std::vector<std::pair<const entry*, std::string>> refused;
    for (auto& [i, why] : sorted.refused) refused.emplace_back(of_batch[i], std::move(why));
    count([&](bridge_counters& c) { c.received += entries.size(); });
    auto pause_for = [this](std::chrono::milliseconds d) { return pause(d); };
    // (A lock lost before the store: another bridge may consume already, and the order is its.)
    auto results =
        co_await detail::store_jobs(to, std::move(sorted.jobs), wake, pause_for, [&] { return !held.lost(); });
    if (!results) co_return false;
    std::uint64_t duplicates = 0;
    for (const auto& r : *results) duplicates += r.duplicate ? 1 : 0;
    count([&](bridge_counters& c) {
      c.enqueued += results->size() - duplicates;
      c.duplicates += duplicates;
    });
    // The dead letters first, then the ack: a bridge that dies between the two writes a refused
    // entry to the dead letters twice, never none.
    if (!refused.empty()) {
      redis::request dead;
      for (const auto& [e, why] : refused) {
        log(log_level::warn, source_name, "stream {} entry {} cannot become a job: {}", from.stream, e->id, why);
        std::vector<std::string> args;  // (no braced list of temporaries in a coroutine: GCC 12)
        args.emplace_back("reason");
        args.push_back(why);
        args.emplace_back("stream");
        args.push_back(from.stream);
        args.emplace_back("entry");
        args.push_back(e->id);
        for (const auto& [k, v] : e->fields) {
          args.push_back(k);
          args.push_back(v);
        }
        dead.push("XADD", from.dead, "*", args);
      }
      if (!co_await write(dead, from.dead, "writing dead letters")) co_return false;
      count([&](bridge_counters& c) { c.rejected += refused.size(); });
    }
    std::vector<std::string> ids;
    for (const auto& e : entries) ids.push_back(e.id);
    co_return co_await write(redis::request("XACK", from.stream, from.group, ids), from.stream,
                             "acknowledging entries");
  }

  // Takes over every entry the group has pending (a bridge before this one read them and did
  // not acknowledge them, or this one lost a read's reply), in stream order, and stores them.
  asio::awaitable<bool> take_over(const lock_lease& held) {
    std::string cursor = "0-0";
    while (!held.lost()) {
      read_failed = false;
      auto r = co_await read(
          redis::request("XAUTOCLAIM", from.stream, from.group, from.consumer, 0, cursor, "COUNT", from.batch));
      if (!r) co_return false;
      if (r->kind() != redis::reply_kind::array) continue;  // (a failure, logged: again)
      const auto& parts = r->as_array();
      cursor = parts.at(0).as_string();
      auto got = entries_of(parts.at(1));
      count([&](bridge_counters& c) { c.taken_over += got.size(); });
      if (!co_await store(std::move(got), held)) co_return false;
      if (cursor == "0-0") co_return true;
    }
    co_return false;
  }

  // Consumes while it holds the lock. What the group has pending is taken over first, and again
  // once a lock TTL: a bridge that lost the lock and did not know it yet may have read entries
  // since, which it does not store, and which no read of new entries returns.
  asio::awaitable<void> consume(const lock_lease& held) {
    if (!co_await take_over(held)) co_return;
    auto taken_at = std::chrono::steady_clock::now();
    auto block = std::max<std::int64_t>(from.lock_ttl.count() / 3, 10);
    while (!stopping && !held.lost()) {
      if (std::chrono::steady_clock::now() - taken_at >= from.lock_ttl) {
        if (!co_await take_over(held)) co_return;
        taken_at = std::chrono::steady_clock::now();
      }
      auto r = co_await read(redis::request("XREADGROUP", "GROUP", from.group, from.consumer, "COUNT", from.batch,
                                            "BLOCK", block, "STREAMS", from.stream, ">"));
      if (!r) co_return;
      if (read_failed) {  // what the lost reply held is pending here: before anything newer
        if (!co_await take_over(held)) co_return;
        continue;
      }
      if (r->kind() != redis::reply_kind::array) continue;  // timed out (nil)
      for (const auto& stream : r->as_array())
        if (!co_await store(entries_of(stream.as_array().at(1)), held)) co_return;
    }
  }

  asio::awaitable<void> run() {
    // However it ends: the connections closed, and not active.
    struct closer {
      impl& self;
      ~closer() {
        self.count([](bridge_counters& c) { c.active = false; });
        self.locks.close();
        self.link.plain().close();
        if (auto* cluster = self.link.known_cluster()) cluster->close();
        if (self.reader) self.reader->close();
      }
    } closing{*this};
    if (!co_await make_group()) co_return;
    // (Length first: stream "a:b" of group "c" and stream "a" of group "b:c" are two locks.)
    auto lock_name = fmt::format("bridge:{}:{}:{}", from.stream.size(), from.stream, from.group);
    lock_options lo;
    lo.ttl = from.lock_ttl;
    lo.wait = std::chrono::hours(24);
    while (!stopping) {
      auto take = [&]() -> asio::awaitable<lock_lease> {
        try {
          co_return co_await locks.lock(lock_name, lo);
        } catch (const boost::system::system_error& e) {
          if (e.code() != asio::error::operation_aborted && e.code() != lock_error::timeout)
            log(log_level::warn, source_name, "taking the lock of stream {}: {}", from.stream, e.what());
        }
        co_return lock_lease();
      };
      lock_lease held;
      try {
        held = co_await locks.try_lock(lock_name, lo);
      } catch (const boost::system::system_error& e) {
        log(log_level::warn, source_name, "taking the lock of stream {}: {}", from.stream, e.what());
      }
      if (!held) {
        log(log_level::info, source_name, "standing by: another bridge consumes stream {} group {}", from.stream,
            from.group);
        auto got = co_await (take() || wake.async_wait(asio::as_tuple(asio::use_awaitable)));
        if (got.index() == 0) held = std::get<0>(std::move(got));
      }
      if (!held) {
        if (!stopping) co_await pause(std::chrono::milliseconds(500));
        continue;
      }
      if (!stopping) {
        log(log_level::info, source_name, "consuming stream {} group {} as {} into queue {}", from.stream, from.group,
            from.consumer, to.queue());
        count([](bridge_counters& c) { c.active = true; });
        co_await consume(held);
        count([](bridge_counters& c) { c.active = false; });
        if (held.lost()) log(log_level::warn, source_name, "lost the lock of stream {}: standing by", from.stream);
      }
      try {
        co_await held.unlock();          // (a bridge standing by follows at once)
      } catch (const std::exception&) {  // (its TTL ends it)
      }
    }
  }
};

stream_bridge::stream_bridge(asio::any_io_executor ex, stream_source from, producer to, bridge_mapping how)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(from), std::move(to), std::move(how))) {}

stream_bridge::~stream_bridge() = default;

asio::awaitable<void> stream_bridge::run() {
  auto self = impl_;
  co_await detail::run_on(self->strand, self->run());
}

void stream_bridge::stop() {
  impl_->stopping = true;
  asio::post(impl_->strand, [self = impl_] { self->wake.expires_at(asio::steady_timer::time_point::min()); });
}

std::string stream_bridge::source() const { return impl_->from.address(); }

bridge_counters stream_bridge::counters() const {
  std::lock_guard lock(impl_->counters_mutex);
  return impl_->counts;
}

asio::awaitable<bridge_counters> stream_bridge::sample() {
  auto self = impl_;
  redis::request info("XINFO", "GROUPS", self->from.stream);
  info.options.timeout = self->from.lock_ttl;  // (a server that cannot be reached: -1 for both)
  auto [ec, r] = co_await self->link.try_exec(std::move(info), self->from.stream);
  std::int64_t lag = -1, pending = -1;
  if (!ec && r.kind() == redis::reply_kind::array) {
    for (const auto& group : r.as_array()) {
      const auto& kv = group.as_array();
      bool ours = false;
      for (std::size_t i = 0; i + 1 < kv.size(); i += 2)
        if (kv[i].as_string() == "name" && kv[i + 1].as_string() == self->from.group) ours = true;
      if (!ours) continue;
      for (std::size_t i = 0; i + 1 < kv.size(); i += 2) {
        const auto& key = kv[i].as_string();
        if (key == "pending") pending = kv[i + 1].as_integer();
        if (key == "lag" && kv[i + 1].kind() == redis::reply_kind::integer) lag = kv[i + 1].as_integer();
      }
    }
  }
  bridge_counters now;
  self->count([&](bridge_counters& c) {
    c.lag = lag;
    c.pending = pending;
    now = c;
  });
  co_return now;
}

}  // namespace jobrt
