#include <jobrt/log.hpp>
#include <jobrt/redis/connection.hpp>

#include "redis/cluster_map.hpp"
#include "redis/handshake.hpp"
#include "redis/multiplexer.hpp"
#include "redis/subscriptions.hpp"
#include "redis/tls.hpp"
#include "strand.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <ranges>
#include <set>

namespace jobrt::redis {
namespace detail {

namespace asio = boost::asio;
using boost::system::error_code;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// Completes a user's handler through its own executor. With may_run_inline, that may run it at
// once when this thread runs that executor (the common case: one io_context thread), which saves
// a post per request; the caller must not be inside the operation's initiating function then.
// Re-entering the connection from the handler is safe: no iterator into its state is held across
// a completion.
template <class Handler, class... Args>
void complete_handler(bool may_run_inline, Handler handler, const asio::any_io_executor& fallback, Args... args) {
  auto ex = asio::get_associated_executor(handler, fallback);
  auto f = [h = std::move(handler), ... a = std::move(args)]() mutable {
    auto slot = asio::get_associated_cancellation_slot(h);
    if (slot.is_connected()) slot.clear();
    std::move(h)(std::move(a)...);
  };
  if (may_run_inline)
    asio::dispatch(ex, std::move(f));
  else  // (an any_completion_executor cannot be posted to: post to the I/O executor, then dispatch)
    asio::post(fallback, [ex, f = std::move(f)]() mutable { asio::dispatch(ex, std::move(f)); });
}

template <class Handler, class... Args>
void post_completion(Handler handler, const asio::any_io_executor& fallback, Args... args) {
  complete_handler(false, std::move(handler), fallback, std::move(args)...);
}

bool cancelled(asio::cancellation_state cs) { return cs.cancelled() != asio::cancellation_type::none; }

// An integer option of the TCP level, for the keepalive timings Asio has no names for.
template <int Name>
struct tcp_option {
  int value;
  template <class Protocol>
  int level(const Protocol&) const noexcept {
    return IPPROTO_TCP;
  }
  template <class Protocol>
  int name(const Protocol&) const noexcept {
    return Name;
  }
  template <class Protocol>
  const int* data(const Protocol&) const noexcept {
    return &value;
  }
  template <class Protocol>
  std::size_t size(const Protocol&) const noexcept {
    return sizeof value;
  }
};

}  // namespace

// A request from a user; its handler runs on the user's executor.
class exec_op final : public pending {
 public:
  // fallback: the connection's executor, which outlives every op it holds.
  exec_op(request req, exec_handler handler, const asio::any_io_executor& fallback)
      : pending(std::move(req).payload(), req.size(), req.options, req.has_blocking_command()),
        handler_(std::move(handler)),
        fallback_(fallback),
        pushed_replies_(req.has_pubsub_command()),
        disturbs_(req.disturbs_connection()) {}

  /// Empty, or with commands whose replies are pushed: FIFO matching cannot carry it.
  bool unmatchable() const noexcept { return pushed_replies_ || disturbs_ || expected_replies() == 0; }

  exec_handler& handler() noexcept { return handler_; }
  /// Queued: from now on it completes from I/O or a timer, never inside its initiating function.
  void set_queued() noexcept { queued_ = true; }

 private:
  void on_complete(error_code ec, reply r) override {
    complete_handler(queued_, std::move(handler_), fallback_, ec, std::move(r));
  }

  exec_handler handler_;
  const asio::any_io_executor& fallback_;
  bool pushed_replies_;
  bool disturbs_;  // see request::disturbs_connection
  bool queued_ = false;
};

// A request of the connection's own (PING, SUBSCRIBE); its callback runs on the strand.
class internal_op final : public pending {
 public:
  using callback = std::function<void(error_code, reply&)>;
  internal_op(request req, std::size_t replies, callback cb)
      : pending(std::move(req).payload(), replies, {}, false), cb_(std::move(cb)) {
    one_command_ = true;  // (each is one command: SUBSCRIBE and its kind, or the handshake's)
  }

 private:
  void on_complete(error_code ec, reply r) override {
    if (cb_) cb_(ec, r);
  }
  callback cb_;
};

struct receive_op {
  receive_handler handler;
};

class connection_impl : public std::enable_shared_from_this<connection_impl> {
 public:
  connection_impl(asio::any_io_executor ex, config cfg, connection_role role)
      : ex_(ex),
        strand_(jobrt::detail::make_strand(ex)),
        cfg_(std::move(cfg)),
        role_(role),
        socket_(strand_),
        write_wake_(strand_),
        deadline_timer_(strand_),
        backoff_timer_(strand_),
        connect_timer_(strand_),
        resolver_(strand_),
        read_buffer_(64 * 1024) {
    if (role_ == connection_role::subscriber)
      mux_.push_filter = [this](reply& r) { return on_push(r); };
    else if (!cfg_.sentinels.empty())
      mux_.push_filter = [this](reply& r) {
        // (Before Redis 7 a script's write refused reads "ERR Error running script ... -READONLY ...".)
        if (r.is_error() && (r.error_message().starts_with("READONLY") ||
                             r.error_message().find("-READONLY ") != std::string_view::npos))
          demoted();
        return false;
      };
  }

  const asio::any_io_executor& get_executor() const noexcept { return ex_; }
  const config& get_config() const noexcept { return cfg_; }
  bool is_connected() const noexcept { return connected_; }
  std::uint64_t connect_count() const noexcept { return connects_; }
  std::int64_t client_id() const noexcept { return client_id_; }

  std::string last_error() const {
    std::lock_guard lock(error_mutex_);
    return last_error_;
  }

  connect_failure last_failure() const {
    std::lock_guard lock(error_mutex_);
    return last_failure_;
  }

  void start() {
    asio::post(strand_, [self = shared_from_this()] {
      if (self->started_ || self->closed_) return;
      self->started_ = true;
      auto rethrow = [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);  // a bug: let io_context::run() report it
      };
      asio::co_spawn(self->strand_, run(self), rethrow);
      asio::co_spawn(self->strand_, deadline_loop(self), rethrow);
    });
  }

  void close() {
    asio::post(strand_, [self = shared_from_this()] { self->do_close(); });
  }

  void exec(request req, exec_handler handler) {
    auto op = std::make_shared<exec_op>(std::move(req), std::move(handler), ex_);
    auto slot = asio::get_associated_cancellation_slot(op->handler());
    if (slot.is_connected()) {
      slot.assign([weak_op = std::weak_ptr<exec_op>(op), weak_self = weak_from_this()](asio::cancellation_type) {
        auto self = weak_self.lock();
        if (!self) return;
        asio::post(self->strand_, [self, weak_op] {
          auto o = weak_op.lock();
          if (!o || o->done()) return;
          if (!(o->written() && o->keep_once_written()))
            self->cancel(*o, asio::error::operation_aborted);
          else if (o->written_cancel_wait().count() > 0)
            self->cut_deadline(*o, clock::now() + o->written_cancel_wait());
        });
      });
    }
    // dispatch: when the caller already runs on our strand (a handler completed inline), enqueue
    // at once instead of paying for a post.
    asio::dispatch(strand_,
                   [self = shared_from_this(), op = std::move(op)]() mutable { self->enqueue(std::move(op)); });
  }

  void change_subscriptions(std::vector<std::string> names, channel_kind kind, bool add) {
    asio::post(strand_, [self = shared_from_this(), names = std::move(names), kind, add]() mutable {
      for (auto& command : self->subs_.change(std::move(names), kind, add)) {
        if (!self->connected_) return;  // (re)connecting sends the whole set
        auto confirmed = [self = self.get(), add, c = command](error_code ec, reply& r) {
          if (!ec && add) {
            message m{{}, {}, {}, true};
            if (c.kind == channel_kind::shard) m.channel = c.names.front();  // (one a command)
            self->deliver(std::move(m));
          }
          if (ec == errc::server_error && add) self->refused(c, r);
        };
        self->send_internal(request(command.name, command.names), command.names.size(), confirmed);
      }
    });
  }

  void receive(receive_handler handler) {
    auto op = std::make_shared<receive_op>(receive_op{std::move(handler)});
    auto slot = asio::get_associated_cancellation_slot(op->handler);
    if (slot.is_connected()) {
      slot.assign([weak_op = std::weak_ptr<receive_op>(op), weak_self = weak_from_this()](asio::cancellation_type) {
        auto self = weak_self.lock();
        if (!self) return;
        asio::post(self->strand_, [self, weak_op] {
          auto o = weak_op.lock();
          auto& q = self->receivers_;
          auto it = std::find(q.begin(), q.end(), o);
          if (!o || it == q.end()) return;
          q.erase(it);
          post_completion(std::move(o->handler), self->ex_, error_code(asio::error::operation_aborted), message{});
        });
      });
    }
    // dispatch: when the strand is free (or this runs on it: a receiver completed inline, see
    // deliver), queue at once instead of paying for a post. The handler is still never called
    // from here: post_completion.
    asio::dispatch(strand_, [self = shared_from_this(), op = std::move(op)]() mutable {
      if (self->closed_)
        post_completion(std::move(op->handler), self->ex_, error_code(errc::closed), message{});
      else if (auto m = self->subs_.next())
        post_completion(std::move(op->handler), self->ex_, error_code(), std::move(*m));
      else
        self->receivers_.push_back(std::move(op));
    });
  }

 private:
  // --- requests (all on the strand) ---

  void enqueue(std::shared_ptr<exec_op> op) {
    if (closed_) {
      mux_.cancel(*op, errc::closed);
      return;
    }
    if (role_ == connection_role::shared && op->blocking()) {
      mux_.cancel(*op, errc::blocking_command_on_shared_connection);
      return;
    }
    if (op->unmatchable()) {
      mux_.cancel(*op, errc::invalid_request);
      return;
    }
    if (down_ && !op->wait_for_reconnect()) {
      mux_.cancel(*op, errc::not_connected);
      return;
    }
    auto deadline = op->deadline();
    if (op->done()) return;  // cancelled before it got here
    op->set_queued();
    mux_.add(std::move(op));
    if (deadline < armed_deadline_) {
      armed_deadline_ = deadline;
      deadline_timer_.expires_at(deadline);  // wakes deadline_loop, which re-arms
    }
    wake_writer();
  }

  // A written request's deadline comes sooner (request_options::written_cancel_wait).
  void cut_deadline(pending& op, clock::time_point t) {
    op.cut_deadline(t);
    if (op.deadline() < armed_deadline_) {
      armed_deadline_ = op.deadline();
      deadline_timer_.expires_at(armed_deadline_);  // wakes deadline_loop, which re-arms
    }
  }

  void send_internal(request req, std::size_t replies, internal_op::callback cb) {
    mux_.add(std::make_shared<internal_op>(std::move(req), replies, std::move(cb)));
    wake_writer();
  }

  void wake_writer() {
    if (writer_idle_) write_wake_.cancel();
  }

  void cancel(pending& op, error_code ec) {
    if (mux_.cancel(op, ec) && role_ != connection_role::shared) reset_connection();
  }

  // A blocking command cannot be taken back once written: drop the connection so the server
  // stops serving it, and reconnect at once.
  void reset_connection() {
    reset_requested_ = true;
    lost("reset after a blocking command was abandoned");
    error_code ignored;
    socket_.close(ignored);
  }

  // --- Sentinel ---

  // The primary refused a write as a replica (READONLY): it was demoted while this connection
  // was up. The reply goes to its request as it is; the connection is made again after the
  // shortest backoff, asking the sentinels anew (not at once: a sentinel that has not heard of
  // the failover names the same server, which a user that may not run ROLE would take again).
  void demoted() {
    if (ending_) return;
    lost(fmt::format("{}:{} refused a write as a replica (READONLY)", primary_.host, primary_.port));
    error_code ignored;
    socket_.close(ignored);
  }

  // Listens at sentinel `at` for +switch-master: when the sentinels switch this connection's
  // primary, the connection is made again at once (asking them anew), rather than when the old
  // primary drops it or refuses a write. Best effort: the sentinel listened to may go away; the
  // ROLE check at each connect is what keeps writes off a replica.
  void watch_switches(std::size_t k, const config& at) {
    if (closed_) return;  // (close() came while the sentinel answered)
    watching_ = true;
    watched_ = k;
    watch_ = std::make_unique<subscriber>(ex_, at);
    watch_->subscribe({"+switch-master"});
    watch_->start();
    asio::co_spawn(strand_, follow_switches(shared_from_this()), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);  // a bug: let io_context::run() report it
    });
  }

  static asio::awaitable<void> follow_switches(std::shared_ptr<connection_impl> self) {
    for (;;) {
      auto [ec, m] = co_await self->watch_->async_receive(use_tuple);
      if (ec || self->closed_) co_return;  // (closed with this connection)
      // "<name> <old ip> <old port> <new ip> <new port>"
      std::vector<std::string_view> words;
      for (auto w : std::views::split(std::string_view(m.payload), ' ')) words.emplace_back(w.begin(), w.end());
      if (m.confirmation || words.size() != 5 || words[0] != self->cfg_.sentinel_master) continue;
      config::endpoint now{std::string(words[3]), std::string(words[4])};
      // The next attempt asks the sentinel that announced it first, and checks its answer
      // against it (another may not have heard yet).
      self->sentinel_first_ = self->watched_;
      if (!self->connected_ || self->ending_) {  // (an attempt under way may have asked before the switch)
        self->announced_ = std::move(now);
        self->backoff_timer_.cancel();
        continue;
      }
      self->announced_.reset();
      if (now.host == self->primary_.host && now.port == self->primary_.port) continue;  // (there already)
      self->announced_ = now;
      self->reset_requested_ = true;
      self->lost(fmt::format("the sentinels switched the primary to {}:{}", now.host, now.port));
      error_code ignored;
      self->socket_.close(ignored);
    }
  }

  void do_close() {
    if (closed_) return;
    closed_ = true;
    if (watch_) watch_->close();
    connected_ = false;
    error_code ignored;
    socket_.close(ignored);
    write_wake_.cancel();
    deadline_timer_.cancel();
    backoff_timer_.cancel();
    connect_timer_.cancel();
    resolver_.cancel();
    mux_.fail_all(errc::closed);
    for (auto& r : receivers_) post_completion(std::move(r->handler), ex_, error_code(errc::closed), message{});
    receivers_.clear();
  }

  void set_last_error(std::string text, connect_failure kind = connect_failure::other) {
    std::lock_guard lock(error_mutex_);
    last_error_ = std::move(text);
    last_failure_ = kind;
  }

  // --- pub/sub ---

  bool on_push(reply& r) {
    auto m = subs_.from_push(r);
    if (m) deliver(std::move(*m));
    return m.has_value();
  }

  void deliver(message m) {
    if (receivers_.empty()) {
      // Nobody receives as fast as messages come: rather than grow without end, the queue is
      // replaced by a notice, which tells receivers that messages were missed.
      if (auto dropped = subs_.queue(std::move(m), cfg_.max_queued_messages)) {
        auto text = fmt::format("subscriber to {}: {} messages queued and none received; dropped for a notice",
                                cfg_.address(), dropped);
        jobrt::log(log_level::warn, "redis", "{}", text);
        set_last_error(std::move(text));
      }
      return;
    }
    auto op = std::move(receivers_.front());
    receivers_.pop_front();
    // Called while replies are read (never inside receive()), like exec completions: run the
    // receiver at once when this thread runs its executor, instead of a post per message. Its
    // next receive() finds the strand here and queues itself without a post either.
    complete_handler(true, std::move(op->handler), ex_, error_code(), std::move(m));
  }

  // A subscription the server refused (an ACL user without the channel, say): the server answers
  // the whole command with one error. It is dropped (asking again at each reconnect would only be
  // refused again), logged, and kept as the connection's last error: nothing else would tell.
  // A shard channel is not lost that way: before Redis 7.0 it becomes a plain channel (there,
  // SPUBLISH falls back to PUBLISH), and a node that does not serve its slot gets a notice that
  // tells the receiver to subscribe where it is served.
  void refused(const subscriptions::command& c, const reply& r) {
    subs_.forget(c.names, c.kind);
    auto why = r.is_error() ? r.error_message() : std::string_view("no reason given");
    if (c.kind == channel_kind::shard) {
      if (why.starts_with("ERR unknown command")) {
        change_subscriptions(c.names, channel_kind::channel, true);
        return;
      }
      if (classify(why).kind != cluster_error::other) {
        for (const auto& n : c.names) {
          message m{n, {}, {}, false};
          m.dropped = true;
          deliver(std::move(m));
        }
        return;
      }
    }
    auto text = fmt::format("{} {} refused by {}: {}", c.name, fmt::join(c.names, " "), cfg_.address(), why);
    jobrt::log(log_level::warn, "redis", "{} (no messages will come from it)", text);
    set_last_error(std::move(text));
  }

  // After a (re)connect: everything held, and one confirmation notice once all of it is in place.
  void resubscribe() {
    auto commands = subs_.resubscribe();
    if (commands.empty()) return;
    auto remaining = std::make_shared<std::size_t>(commands.size());
    for (auto& c : commands) {
      auto confirmed = [this, remaining, c](error_code ec, reply& r) {
        if (ec == errc::server_error) refused(c, r);
        if ((!ec || ec == errc::server_error) && --*remaining == 0) deliver(message{{}, {}, {}, true});
      };
      send_internal(request(c.name, c.names), c.names.size(), confirmed);
    }
  }

  // --- the loops ---

  static asio::awaitable<void> deadline_loop(std::shared_ptr<connection_impl> self) {
    while (!self->closed_) {
      self->deadline_timer_.expires_at(self->armed_deadline_);
      co_await self->deadline_timer_.async_wait(use_tuple);
      if (self->closed_) break;
      // A request that times out while there is no connection says so: the cause is the
      // connection, and last_error() tells why.
      error_code ec = self->connected_ ? error_code(errc::timeout) : error_code(errc::not_connected);
      // Completions run inline may queue requests with deadlines of their own: they lower
      // armed_deadline_ from max, and the result is the earlier of theirs and the rest.
      self->armed_deadline_ = clock::time_point::max();
      auto expired = self->mux_.expire(clock::now(), ec);
      self->armed_deadline_ = std::min(self->armed_deadline_, expired.next);
      if (expired.abandoned_written && self->role_ != connection_role::shared) self->reset_connection();
    }
  }

  static asio::awaitable<void> run(std::shared_ptr<connection_impl> self) {
    // When the io_context is destroyed with this loop suspended, its frame is destroyed: so are
    // the requests still held, whose handlers can never run. They may own this connection's owner
    // (a coroutine of a cluster client awaits a reply here while holding the client, which holds
    // the connection): kept, they would keep each other alive for ever.
    struct on_destroy {
      connection_impl& c;
      ~on_destroy() {
        auto requests = c.mux_.release_all();
        auto receivers = std::move(c.receivers_);
        c.receivers_.clear();
      }
    } guard{*self};
    auto wait = self->cfg_.reconnect_wait_min;
    while (!self->closed_) {
      auto [failure, kind] = co_await self->connect_with_timeout();
      if (self->closed_) break;
      if (failure.empty() && !self->cfg_.sentinels.empty()) {
        // A switch announced while the attempt went on, to another primary than the one asked
        // (a sentinel that had not heard of it yet): ask again. Nothing suspends from here until
        // connected_, so a later announcement finds the connection up and drops it.
        if (auto a = std::exchange(self->announced_, std::nullopt);
            a && (a->host != self->primary_.host || a->port != self->primary_.port)) {
          failure = fmt::format("connect to {}: the sentinels announced the primary {}:{} meanwhile",
                                self->cfg_.address(), a->host, a->port);
          kind = connect_failure::not_ready;
          self->close_socket();
          self->set_last_error(std::move(failure), kind);
          continue;  // (at once: the announcement was used up, so this happens once)
        }
      }
      if (failure.empty()) {
        wait = self->cfg_.reconnect_wait_min;
        self->loss_reason_.clear();
        self->ending_ = false;
        self->connected_ = true;
        self->down_ = false;
        ++self->connects_;
        self->resubscribe();
        co_await (self->read_loop() || self->write_loop() || self->health_loop());
        self->connected_ = false;
        self->client_id_ = 0;
        error_code ignored;
        self->socket_.close(ignored);
        self->mux_.on_connection_lost();
        self->down_ = true;
        self->mux_.fail_unwritten(errc::not_connected);
        if (self->closed_) break;
        self->set_last_error(fmt::format("connection to {} lost: {}", self->cfg_.address(), self->loss_reason_));
        if (std::exchange(self->reset_requested_, false)) continue;
      } else {
        self->set_last_error(std::move(failure), kind);
        self->down_ = true;
        self->mux_.fail_unwritten(errc::not_connected);
      }
      self->backoff_timer_.expires_after(wait);
      co_await self->backoff_timer_.async_wait(use_tuple);
      wait = std::min(wait * 2, self->cfg_.reconnect_wait_max);
    }
  }

  // How an attempt to connect ended: failure is "" on success.
  struct attempt {
    std::string failure;
    connect_failure kind = connect_failure::none;
  };

  // A failed step of an attempt, with its kind.
  class attempt_error : public std::runtime_error {
   public:
    attempt_error(connect_failure kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
    connect_failure kind() const noexcept { return kind_; }

   private:
    connect_failure kind_;
  };

  asio::awaitable<attempt> connect_with_timeout() {
    connect_timer_.expires_after(cfg_.connect_timeout);
    // `||` waits for the first branch that *succeeds*, so the attempt reports failure as a value.
    auto result = co_await (try_connect() || connect_deadline());
    auto a = result.index() == 0 ? std::get<0>(result)
                                 : attempt{fmt::format("timed out after {} ms", cfg_.connect_timeout.count()),
                                           connect_failure::not_ready};
    if (a.failure.empty()) co_return a;
    close_socket();
    sentinel_asking_.reset();
    if (auto k = std::exchange(sentinel_timed_out_, std::nullopt)) {  // the next attempt begins after it
      sentinel_first_ = (*k + 1) % cfg_.sentinels.size();
      a.failure = fmt::format("sentinel {}:{}: {}", cfg_.sentinels[*k].host, cfg_.sentinels[*k].port, a.failure);
    } else if (at_primary_) {
      a.failure = fmt::format("{}:{} (the sentinels' primary): {}", primary_.host, primary_.port, a.failure);
      // The primary the sentinels name is down, or its name gone: they fail over soon.
      if (a.kind == connect_failure::refused || a.kind == connect_failure::unresolved)
        a.kind = connect_failure::not_ready;
    }
    a.failure = fmt::format("connect to {}: {}", cfg_.address(), a.failure);
    co_return a;
  }

  // The resolver cannot be cancelled per operation, and `||` waits for both branches: the
  // timeout branch cancels it (and the socket) itself.
  asio::awaitable<void> connect_deadline() {
    auto [ec] = co_await connect_timer_.async_wait(use_tuple);
    if (ec) co_return;                       // the attempt finished first (or close() came): nothing to cut short
    sentinel_timed_out_ = sentinel_asking_;  // (before the socket's close moves the attempt on)
    resolver_.cancel();
    error_code ignored;
    socket_.close(ignored);
  }

  asio::awaitable<attempt> try_connect() {
    try {
      co_await connect_and_handshake();
    } catch (const attempt_error& e) {
      co_return attempt{e.what(), e.kind()};
    } catch (const std::exception& e) {
      co_return attempt{e.what(), connect_failure::other};
    }
    co_return attempt{};
  }

  asio::awaitable<void> connect_and_handshake() {
    error_code ec;
    close_socket();
    at_primary_ = false;
    if (!cfg_.unix_path.empty()) {
      if (cfg_.tls)  // (no URL gives both: a config set in code)
        throw attempt_error(connect_failure::other, "TLS is for host:port connections, not a unix socket");
      std::tie(ec) = co_await socket_.async_connect(asio::local::stream_protocol::endpoint(cfg_.unix_path), use_tuple);
      if (ec)
        throw attempt_error(
            ec == asio::error::connection_refused || ec == boost::system::errc::no_such_file_or_directory
                ? connect_failure::refused
                : connect_failure::other,
            fmt::format("{}: {}", cfg_.unix_path, ec.message()));
    } else if (cfg_.sentinels.empty()) {
      co_await connect_tcp(cfg_);
    } else {
      auto at = cfg_;
      auto primary = co_await ask_sentinels();
      at.host = primary.host;
      at.port = primary.port;
      primary_ = std::move(primary);
      at_primary_ = true;
      co_await connect_tcp(at);
    }

    // The handshake in one write, before any queued request (handshake.hpp).
    handshake hello(cfg_);
    auto said = hello.check(co_await exchange(hello.commands()));
    if (said.failure != connect_failure::none) throw attempt_error(said.failure, said.why);
    client_id_ = said.client_id;
    last_read_ = clock::now();
  }

  // Connects the socket to at.host:at.port, and over TLS when at.tls.
  asio::awaitable<void> connect_tcp(const config& at) {
    auto [rec, endpoints] = co_await resolver_.async_resolve(at.host, at.port, use_tuple);
    if (rec)  // (host_not_found_try_again: a name server did not answer, which may pass)
      throw attempt_error(rec == asio::error::host_not_found ? connect_failure::unresolved : connect_failure::other,
                          fmt::format("cannot resolve '{}': {}", at.host, rec.message()));
    error_code ec = asio::error::host_not_found;
    for (const auto& entry : endpoints) {
      error_code ignored;
      socket_.close(ignored);
      std::tie(ec) = co_await socket_.async_connect(entry.endpoint(), use_tuple);
      if (!ec) break;
    }
    if (ec)
      throw attempt_error(ec == asio::error::connection_refused ? connect_failure::refused : connect_failure::other,
                          ec.message());
    error_code ignored;
    socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
    // A server that vanished without a word (host down, cable out) is found by the health
    // check, except under a blocking command, which is silent on purpose: there TCP keepalive
    // finds it, after 15 s of silence and 3 probes 5 s apart, rather than the system's 2 hours.
    socket_.set_option(asio::socket_base::keep_alive(true), ignored);
#ifdef TCP_KEEPIDLE
    socket_.set_option(tcp_option<TCP_KEEPIDLE>{15}, ignored);
    socket_.set_option(tcp_option<TCP_KEEPINTVL>{5}, ignored);
    socket_.set_option(tcp_option<TCP_KEEPCNT>{3}, ignored);
#endif
    if (at.tls) co_await tls_handshake(at);
  }

  // Writes req on the fresh connection and reads a reply to each of its commands.
  asio::awaitable<std::vector<reply>> exchange(const request& req) {
    auto [wec, written] = co_await write_all(asio::buffer(req.payload()));
    if (wec) throw attempt_error(connect_failure::other, handshake_failure(wec));
    resp_parser parser;
    std::vector<reply> replies;
    while (replies.size() < req.size()) {
      reply r;
      auto res = parser.next(r);
      if (res == resp_parser::result::reply) {
        replies.push_back(std::move(r));
      } else if (res == resp_parser::result::error) {
        throw attempt_error(connect_failure::other, fmt::format("protocol error: {}", parser.error_message()));
      } else {
        auto [rec, n] = co_await read_some(asio::buffer(read_buffer_));
        if (rec) throw attempt_error(connect_failure::other, handshake_failure(rec));
        parser.feed(read_buffer_.data(), n);
      }
    }
    co_return replies;
  }

  // Under Sentinel: where the primary is, as the first sentinel that knows says, beginning with
  // the one that answered last. What each one said, or why it could not be asked, makes the
  // error when none knows; its kind is theirs when they all failed alike (a sentinel that knows
  // no such primary counts as `unresolved`), else `other`.
  asio::awaitable<config::endpoint> ask_sentinels() {
    std::vector<std::string> said;
    std::optional<connect_failure> kind;
    auto failed = [&](connect_failure k, std::string why) {
      kind = !kind || *kind == k ? k : connect_failure::other;
      said.push_back(std::move(why));
    };
    const auto n = cfg_.sentinels.size();
    const auto first = sentinel_first_;  // (a switch heard meanwhile may change it)
    for (std::size_t i = 0; i < n; ++i) {
      auto k = (first + i) % n;
      auto at = cfg_.sentinel(k);
      sentinel_asking_ = k;
      try {
        co_await connect_tcp(at);
        handshake hello(at);  // (its AUTH, a name, CLIENT ID and PING, then the question)
        request ask = hello.commands();
        ask.push("SENTINEL", "GET-MASTER-ADDR-BY-NAME", cfg_.sentinel_master);
        auto replies = co_await exchange(ask);
        close_socket();
        auto answer = std::move(replies.back());
        replies.pop_back();
        auto hello_said = hello.check(replies);
        if (hello_said.failure != connect_failure::none) throw attempt_error(hello_said.failure, hello_said.why);
        if (answer.is_error()) throw attempt_error(connect_failure::other, std::string(answer.error_message()));
        if (answer.is_nil()) {
          failed(connect_failure::unresolved,
                 fmt::format("{}:{} knows no primary '{}'", at.host, at.port, cfg_.sentinel_master));
          continue;
        }
        const auto& address = answer.as_array();
        if (address.size() != 2) throw reply_type_error("not [host, port]");
        sentinel_first_ = k;
        sentinel_asking_.reset();
        if (!watching_) watch_switches(k, at);
        co_return config::endpoint{address[0].as_string(), address[1].as_string()};
      } catch (const attempt_error& e) {
        close_socket();
        failed(e.kind(), fmt::format("{}:{}: {}", at.host, at.port, e.what()));
      } catch (const reply_type_error&) {
        close_socket();
        failed(connect_failure::other, fmt::format("{}:{}: an answer that is not [host, port]", at.host, at.port));
      }
    }
    sentinel_asking_.reset();
    throw attempt_error(
        kind.value_or(connect_failure::other),
        fmt::format("no sentinel named the primary '{}': {}", cfg_.sentinel_master, fmt::join(said, "; ")));
  }

  void close_socket() {
    tls_.reset();
    error_code ignored;
    socket_.close(ignored);
  }

  // The current connection is over: nothing more may be written to it (a request written now
  // would fail as "maybe run" although it never left).
  void lost(std::string why) {
    ending_ = true;
    if (loss_reason_.empty()) loss_reason_ = std::move(why);
  }

  // TLS over the connected socket (rediss://): the server's certificate checked as cfg_ says.
  // The context is made again at each connect: a CA file, or a client certificate renewed on
  // disk, is used from the next connection on.
  asio::awaitable<void> tls_handshake(const config& at) {
    try {
      tls_context_ = std::make_shared<asio::ssl::context>(make_tls_context(at));
      tls_.emplace(socket_, *tls_context_);
      auto name = tls_name(at);
      if (!name.empty() && SSL_set_tlsext_host_name(tls_->native_handle(), name.c_str()) != 1)
        throw std::runtime_error(fmt::format("TLS: cannot send '{}' as the server's name (SNI)", name));
      tls_expect(tls_->native_handle(), at);
    } catch (const std::exception& e) {
      throw attempt_error(connect_failure::other, e.what());
    }
    auto [ec] = co_await tls_->async_handshake(asio::ssl::stream_base::client, use_tuple);
    if (ec)
      throw attempt_error(connect_failure::other,
                          fmt::format("TLS handshake failed: {}", tls_failure(ec, tls_->native_handle())));
  }

  // The connection's bytes, through TLS when it has it (the loops below do the same inline).
  asio::awaitable<std::tuple<error_code, std::size_t>> read_some(asio::mutable_buffer buffer) {
    if (tls_) co_return co_await tls_->async_read_some(buffer, use_tuple);
    co_return co_await socket_.async_read_some(buffer, use_tuple);
  }
  asio::awaitable<std::tuple<error_code, std::size_t>> write_all(asio::const_buffer buffer) {
    if (tls_) co_return co_await asio::async_write(*tls_, buffer, use_tuple);
    co_return co_await asio::async_write(socket_, buffer, use_tuple);
  }
  // Why the first exchange failed: as describe, and over TLS, when the server asked for a client
  // certificate and none was given, that first (a server that requires one may close before its
  // alert is read).
  std::string handshake_failure(const error_code& ec) {
    if (tls_ && tls_client_certificate_wanted(tls_->native_handle()))
      return fmt::format(
          "the server asked for a client certificate and none was given (rediss://...?cert=FILE&key=FILE); then: {}",
          describe(ec));
    return describe(ec);
  }
  // What a read or write error means, in words (a TLS alert's text names the alert).
  std::string describe(const error_code& ec) const {
    if (ec == asio::error::eof) return "the server closed the connection";
    if (tls_ && ec == asio::ssl::error::stream_truncated) return "the server closed the connection (TLS)";
    if (ec.category() == asio::error::get_ssl_category()) return fmt::format("TLS: {}", ec.message());
    return ec.message();
  }

  asio::awaitable<void> read_loop() {
    for (;;) {
      error_code ec;
      std::size_t n = 0;
      if (tls_)
        std::tie(ec, n) = co_await tls_->async_read_some(asio::buffer(read_buffer_), use_tuple);
      else
        std::tie(ec, n) = co_await socket_.async_read_some(asio::buffer(read_buffer_), use_tuple);
      if (ec) {
        lost(describe(ec));
        co_return;
      }
      last_read_ = clock::now();
      mux_.feed(read_buffer_.data(), n);
      // Complete replies a few at a time. Their handlers usually queue new requests at once;
      // letting the writer send those before the rest are processed keeps the server busy while
      // we work, instead of server and client taking turns.
      for (bool more = true; more;) {
        error_code perr;
        try {
          perr = mux_.drain(16, more);
        } catch (const std::exception& e) {  // a handler run inline threw: end this connection, loudly
          lost(fmt::format("exception while completing requests: {}", e.what()));
          co_return;
        }
        if (perr) {
          lost(fmt::format("{}: {}", perr.message(), mux_.last_protocol_error()));
          co_return;
        }
        if (more && writer_idle_ && mux_.has_waiting()) {
          wake_writer();
          co_await asio::post(strand_, asio::use_awaitable);  // the writer runs first
        }
      }
    }
  }

  asio::awaitable<void> write_loop() {
    for (;;) {
      if (ending_) co_return;
      if (!mux_.has_waiting()) {
        write_wake_.expires_at(clock::time_point::max());
        writer_idle_ = true;
        co_await write_wake_.async_wait(use_tuple);
        writer_idle_ = false;
        if (cancelled(co_await asio::this_coro::cancellation_state)) co_return;
        continue;
      }
      if (mux_.in_flight() == 0) waiting_since_ = clock::now();  // silence counts from here too
      const std::string& bytes = mux_.prepare_write();
      error_code ec;
      if (tls_)
        std::tie(ec, std::ignore) = co_await asio::async_write(*tls_, asio::buffer(bytes), use_tuple);
      else
        std::tie(ec, std::ignore) = co_await asio::async_write(socket_, asio::buffer(bytes), use_tuple);
      mux_.commit_write();
      if (ec) {
        lost(describe(ec));
        co_return;
      }
    }
  }

  asio::awaitable<void> health_loop() {
    const auto interval = cfg_.health_interval;
    asio::steady_timer timer(strand_);
    if (interval.count() <= 0) {  // disabled: wait until the connection ends
      timer.expires_at(clock::time_point::max());
      co_await timer.async_wait(use_tuple);
      co_return;
    }
    for (;;) {
      timer.expires_after(interval / 4);
      co_await timer.async_wait(use_tuple);
      if (cancelled(co_await asio::this_coro::cancellation_state)) co_return;
      if (mux_.blocked()) continue;  // a blocking command is silent on purpose
      // Silence: since the last read, or since requests were written to an idle connection.
      auto idle = clock::now() - std::max(last_read_, waiting_since_);
      if (mux_.in_flight() > 0 && idle >= 2 * interval) {
        lost(fmt::format("{} (no reply for {} ms)", error_code(errc::health_check_failed).message(),
                         std::chrono::duration_cast<std::chrono::milliseconds>(idle).count()));
        co_return;
      }
      if (mux_.in_flight() == 0 && !mux_.has_waiting() && idle >= interval) send_internal(request("PING"), 1, nullptr);
    }
  }

  asio::any_io_executor ex_;
  asio::any_io_executor strand_;
  config cfg_;
  connection_role role_;
  multiplexer mux_;
  asio::generic::stream_protocol::socket socket_;
  std::shared_ptr<asio::ssl::context> tls_context_;                                // rediss://: made at each connect
  std::optional<asio::ssl::stream<asio::generic::stream_protocol::socket&>> tls_;  // over socket_, per connection
  asio::steady_timer write_wake_;                                                  // the writer's condition variable
  asio::steady_timer deadline_timer_;  // armed at the earliest request deadline
  asio::steady_timer backoff_timer_;
  asio::steady_timer connect_timer_;
  asio::ip::tcp::resolver resolver_;
  clock::time_point armed_deadline_ = clock::time_point::max();
  clock::time_point last_read_{};
  clock::time_point waiting_since_{};
  std::vector<char> read_buffer_;
  std::string loss_reason_;
  bool started_ = false;
  bool closed_ = false;
  bool reset_requested_ = false;
  bool writer_idle_ = false;  // write_loop waits on write_wake_
  bool ending_ = false;       // the current connection is being torn down
  std::atomic<bool> connected_{false};
  std::atomic<std::uint64_t> connects_{0};
  std::atomic<std::int64_t> client_id_{0};
  mutable std::mutex error_mutex_;
  std::string last_error_;
  connect_failure last_failure_ = connect_failure::none;
  // Lost, or an attempt failed, and not connected again since: requests that do not wait for a
  // reconnect fail at once.
  bool down_ = false;
  // Sentinel
  config::endpoint primary_;                    // where the sentinels said the primary is, at the last connect
  bool at_primary_ = false;                     // the attempt got that far
  std::size_t sentinel_first_ = 0;              // asked first: the last that answered
  std::optional<std::size_t> sentinel_asking_;  // asked now, by this attempt
  bool watching_ = false;
  std::size_t watched_ = 0;                        // the sentinel the watch listens at
  std::optional<std::size_t> sentinel_timed_out_;  // asked when the attempt's time ran out
  std::optional<config::endpoint> announced_;      // a switch heard while not connected
  std::unique_ptr<subscriber> watch_;              // at a sentinel, to +switch-master
  // subscriber
  subscriptions subs_;
  std::deque<std::shared_ptr<receive_op>> receivers_;
};

}  // namespace detail

basic_connection::basic_connection(executor_type ex, config cfg, connection_role role)
    : impl_(std::make_shared<detail::connection_impl>(std::move(ex), std::move(cfg), role)) {}

basic_connection::~basic_connection() { impl_->close(); }

void basic_connection::start() { impl_->start(); }
void basic_connection::close() { impl_->close(); }
basic_connection::executor_type basic_connection::get_executor() const noexcept { return impl_->get_executor(); }
const config& basic_connection::get_config() const noexcept { return impl_->get_config(); }
bool basic_connection::is_connected() const noexcept { return impl_->is_connected(); }
std::string basic_connection::last_error() const { return impl_->last_error(); }
connect_failure basic_connection::last_failure() const { return impl_->last_failure(); }
std::uint64_t basic_connection::connect_count() const noexcept { return impl_->connect_count(); }
std::int64_t basic_connection::client_id() const noexcept { return impl_->client_id(); }

void basic_connection::exec_impl(std::shared_ptr<detail::connection_impl> impl, request req, exec_handler handler) {
  impl->exec(std::move(req), std::move(handler));
}

void subscriber::subscribe(std::vector<std::string> channels) {
  impl_->change_subscriptions(std::move(channels), detail::channel_kind::channel, true);
}
void subscriber::psubscribe(std::vector<std::string> patterns) {
  impl_->change_subscriptions(std::move(patterns), detail::channel_kind::pattern, true);
}
void subscriber::ssubscribe(std::vector<std::string> channels) {
  impl_->change_subscriptions(std::move(channels), detail::channel_kind::shard, true);
}
void subscriber::unsubscribe(std::vector<std::string> channels) {
  impl_->change_subscriptions(std::move(channels), detail::channel_kind::channel, false);
}
void subscriber::punsubscribe(std::vector<std::string> patterns) {
  impl_->change_subscriptions(std::move(patterns), detail::channel_kind::pattern, false);
}

void subscriber::receive_impl(std::shared_ptr<detail::connection_impl> impl, receive_handler handler) {
  impl->receive(std::move(handler));
}

namespace {
template <class Connection>
boost::asio::awaitable<reply> exec_or_throw(Connection& c, request req) {
  auto [ec, r] = co_await c.async_exec(std::move(req), boost::asio::as_tuple(boost::asio::use_awaitable));
  if (ec) {
    std::string what = r.is_error() ? std::string(r.error_message()) : std::string();
    if (ec == errc::not_connected) what = c.last_error();
    // (With an empty what_arg, what() would read ": <message>".)
    if (what.empty()) throw boost::system::system_error(ec);
    throw boost::system::system_error(ec, what);
  }
  co_return r;
}
}  // namespace

boost::asio::awaitable<reply> exec(connection& c, request req) { return exec_or_throw(c, std::move(req)); }
boost::asio::awaitable<reply> exec(blocking_connection& c, request req) { return exec_or_throw(c, std::move(req)); }

}  // namespace jobrt::redis
