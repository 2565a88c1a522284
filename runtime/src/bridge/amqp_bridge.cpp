// A RabbitMQ queue into a queue of jobs (bridge.hpp). librabbitmq blocks, so the consumer runs
// on a thread of its own, and the connection is that thread's alone: it gathers a batch of
// deliveries, hands it to the io_context (where the producer stores it) and waits for the
// outcome, then publishes the refused messages to the dead-letter queue and acknowledges the
// batch. A failure ends the connection (the broker delivers its unacknowledged messages again)
// and the thread connects again after a wait that stop() cuts short.
#include "backend/job_codec.hpp"
#include "bridge/storing.hpp"
#include "strand.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/log.hpp>

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

namespace jobrt {

namespace asio = boost::asio;
using namespace asio::experimental::awaitable_operators;

namespace {

constexpr amqp_channel_t channel = 1;       // deliveries and their acks
constexpr amqp_channel_t dead_channel = 2;  // dead letters, in transactions

std::string text_of(amqp_bytes_t b) { return std::string(static_cast<const char*>(b.bytes), b.len); }
amqp_bytes_t bytes_of(const std::string& s) { return amqp_bytes_t{s.size(), const_cast<char*>(s.data())}; }

// What went wrong with a call, in words; empty when it went well.
std::string problem_of(const amqp_rpc_reply_t& r, std::string_view what) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL: return {};
    case AMQP_RESPONSE_NONE: return fmt::format("{}: no reply", what);
    case AMQP_RESPONSE_LIBRARY_EXCEPTION: return fmt::format("{}: {}", what, amqp_error_string2(r.library_error));
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        const auto* m = static_cast<const amqp_connection_close_t*>(r.reply.decoded);
        return fmt::format("{}: the server closed the connection: {}", what, text_of(m->reply_text));
      }
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const auto* m = static_cast<const amqp_channel_close_t*>(r.reply.decoded);
        return fmt::format("{}: the server closed the channel: {}", what, text_of(m->reply_text));
      }
      return fmt::format("{}: the server's error (method {:#x})", what, r.reply.id);
  }
  return fmt::format("{}: an unknown reply", what);
}

// What came instead of a delivery (amqp_consume_message's AMQP_STATUS_UNEXPECTED_STATE: the
// frame waits to be read): the broker closing the channel or the connection, say, with its
// reason (a delivery not acknowledged within its consumer_timeout, a queue deleted).
std::string unexpected_frame(amqp_connection_state_t conn) {
  amqp_frame_t frame{};
  timeval limit{1, 0};
  if (amqp_simple_wait_frame_noblock(conn, &frame, &limit) != AMQP_STATUS_OK) return "an unexpected frame";
  if (frame.frame_type != AMQP_FRAME_METHOD) return fmt::format("an unexpected frame (type {})", frame.frame_type);
  switch (frame.payload.method.id) {
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const auto* m = static_cast<const amqp_channel_close_t*>(frame.payload.method.decoded);
      return fmt::format("the server closed the channel: {}", text_of(m->reply_text));
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
      const auto* m = static_cast<const amqp_connection_close_t*>(frame.payload.method.decoded);
      return fmt::format("the server closed the connection: {}", text_of(m->reply_text));
    }
    case AMQP_BASIC_CANCEL_METHOD: return "the server cancelled the consumer (its queue deleted, say)";
    default: return fmt::format("an unexpected method {:#x}", frame.payload.method.id);
  }
}

// The id of a message without message_id: "sha256-" and the first 32 hex digits of its body's.
std::string body_id(const std::string& body) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(body.data(), body.size(), digest, &size, EVP_sha256(), nullptr);
  std::string out = "sha256-";
  for (unsigned int i = 0; i < 16 && i < size; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

// A header's value as a field: text as it is, numbers and booleans written out; others: none.
std::optional<std::string> header_text(const amqp_field_value_t& v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES: return text_of(v.value.bytes);
    case AMQP_FIELD_KIND_BOOLEAN: return v.value.boolean ? "true" : "false";
    case AMQP_FIELD_KIND_I8: return std::to_string(v.value.i8);
    case AMQP_FIELD_KIND_U8: return std::to_string(v.value.u8);
    case AMQP_FIELD_KIND_I16: return std::to_string(v.value.i16);
    case AMQP_FIELD_KIND_U16: return std::to_string(v.value.u16);
    case AMQP_FIELD_KIND_I32: return std::to_string(v.value.i32);
    case AMQP_FIELD_KIND_U32: return std::to_string(v.value.u32);
    case AMQP_FIELD_KIND_I64: return std::to_string(v.value.i64);
    case AMQP_FIELD_KIND_U64: return std::to_string(v.value.u64);
    default: return std::nullopt;
  }
}

// A delivery as the mapping sees it: its headers and its type and message_id properties as
// fields, its body as the payload's text; its id the message_id, or without one the body's hash.
bridge_message message_of(const amqp_envelope_t& e) {
  bridge_message m;
  const auto& p = e.message.properties;
  if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0)
    for (int i = 0; i < p.headers.num_entries; ++i)
      if (auto v = header_text(p.headers.entries[i].value))
        m.fields.emplace_back(text_of(p.headers.entries[i].key), *v);
  if ((p._flags & AMQP_BASIC_TYPE_FLAG) != 0) m.fields.emplace_back("type", text_of(p.type));
  m.body = text_of(e.message.body);
  if ((p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0 && p.message_id.len > 0) {
    m.default_id = text_of(p.message_id);
    // Publishers often number their messages; the queue keeps all-digit ids for those it assigns,
    // so such a message's job is "msg-" and its number (the same again when it comes again).
    if (detail::assigned_id(m.default_id)) m.default_id.insert(0, "msg-");
  } else {
    m.default_id = body_id(*m.body);
  }
  return m;
}

// One connection: closed and freed when it goes.
class connection {
 public:
  connection() : state_(amqp_new_connection()) {}
  ~connection() {
    if (open_) amqp_connection_close(state_, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(state_);
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  amqp_connection_state_t get() const noexcept { return state_; }
  void opened() noexcept { open_ = true; }

 private:
  amqp_connection_state_t state_;
  bool open_ = false;
};

using refusals = std::vector<std::pair<std::size_t, std::string>>;

}  // namespace

struct amqp_bridge::impl : std::enable_shared_from_this<amqp_bridge::impl> {
  impl(asio::any_io_executor ex, amqp_source from_, producer to_, bridge_mapping how_)
      : strand(asio::make_strand(ex)),
        from(std::move(from_)),
        to(std::move(to_)),
        how(std::move(how_)),
        wake(strand, asio::steady_timer::time_point::max()),
        ended(strand, asio::steady_timer::time_point::max()) {}

  asio::strand<asio::any_io_executor> strand;
  amqp_source from;
  producer to;
  bridge_mapping how;
  asio::steady_timer wake;   // at its earliest once stop() was called: pauses end
  asio::steady_timer ended;  // at its earliest once the thread ended
  std::atomic<bool> stopping{false};
  std::mutex mutex;  // the counters, and the thread's waits between connections
  std::condition_variable stopped;
  bridge_counters counts;
  std::thread thread;
  std::exception_ptr failure;  // what ended the thread, if not stop()

  template <class F>
  void count(F change) {
    std::lock_guard lock(mutex);
    change(counts);
  }

  // On the strand: stores a batch's jobs; the refused messages, or nullopt when stop() came first.
  // (The batch is shared with the thread, which publishes the refused ones.)
  using shared_batch = std::shared_ptr<const std::vector<bridge_message>>;
  asio::awaitable<std::optional<refusals>> store(shared_batch batch) {
    auto sorted = detail::sort_batch(*batch, how, to.options());
    count([&](bridge_counters& c) { c.received += batch->size(); });
    auto pause = [this](std::chrono::milliseconds d) -> asio::awaitable<bool> {
      co_await detail::pause_unless_woken(wake, d);
      co_return !stopping;
    };
    auto results = co_await detail::store_jobs(to, std::move(sorted.jobs), wake, pause, [] { return true; });
    if (!results) co_return std::nullopt;
    std::uint64_t duplicates = 0;
    for (const auto& r : *results) duplicates += r.duplicate ? 1 : 0;
    count([&](bridge_counters& c) {
      c.enqueued += results->size() - duplicates;
      c.duplicates += duplicates;
      c.rejected += sorted.refused.size();
    });
    co_return std::move(sorted.refused);
  }

  // On the thread: hands the batch to the io_context and waits for its outcome, sending the
  // broker heartbeats meanwhile (librabbitmq sends none while no call of it runs). nullopt when
  // stop() came first, or the store did not end within 10 s of it. (The store holds this impl:
  // when the thread gives up on it, run() returns, and the bridge may go, while it runs on.)
  std::optional<refusals> store_from_thread(shared_batch batch, amqp_connection_state_t conn) {
    // (Owned by the handler: an io_context gone before it ran breaks the promise, and get() throws.)
    auto promise = std::make_shared<std::promise<std::optional<refusals>>>();
    auto outcome = promise->get_future();
    auto held = [](std::shared_ptr<impl> self, shared_batch b) -> asio::awaitable<std::optional<refusals>> {
      co_return co_await self->store(std::move(b));
    };
    asio::co_spawn(strand, held(shared_from_this(), std::move(batch)),
                   [promise](std::exception_ptr e, std::optional<refusals> refused) {
                     if (e)
                       promise->set_exception(e);
                     else
                       promise->set_value(std::move(refused));
                   });
    promise.reset();
    for (int after_stop = 0; outcome.wait_for(std::chrono::seconds(1)) != std::future_status::ready;) {
      amqp_frame_t heartbeat{};
      heartbeat.frame_type = AMQP_FRAME_HEARTBEAT;
      amqp_send_frame(conn, &heartbeat);
      if (stopping && ++after_stop >= 10) return std::nullopt;
    }
    return outcome.get();
  }

  // Why the broker's certificate was refused in this thread's last handshake ("" none).
  static inline thread_local std::string refused_certificate;
  static int on_verify(int ok, X509_STORE_CTX* store) {
    if (ok == 0) refused_certificate = X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
    return ok;
  }

  // An amqps:// socket's settings: the CAs that sign the broker's certificate, a client
  // certificate, what is checked. Empty, or what is wrong.
  std::string tls_setup(amqp_socket_t* socket) const {
    ERR_clear_error();  // (what tls_why says is this connection's)
    refused_certificate.clear();
    auto* context = static_cast<SSL_CTX*>(amqp_ssl_socket_get_context(socket));
    if (context == nullptr) return "cannot make a TLS context";
    if (!from.tls_ca_file.empty()) {
      if (amqp_ssl_socket_set_cacert(socket, from.tls_ca_file.c_str()) != AMQP_STATUS_OK)
        return fmt::format("reading the CA certificates in {}{}", from.tls_ca_file, tls_why());
    } else if (from.tls_verify && SSL_CTX_set_default_verify_paths(context) != 1) {
      return fmt::format("reading the system's CA certificates{}", tls_why());
    }
    if (!from.tls_cert_file.empty() &&
        amqp_ssl_socket_set_key(socket, from.tls_cert_file.c_str(), from.tls_key_file.c_str()) != AMQP_STATUS_OK)
      return fmt::format("reading the client certificate {} and key {}{}", from.tls_cert_file, from.tls_key_file,
                         tls_why());
    // The certificate and the name are checked by OpenSSL in the handshake, which fails on a
    // bad one before this side sends anything of its own (librabbitmq checks only once the
    // handshake is over, and its name check does not know IP addresses).
    amqp_ssl_socket_set_verify_peer(socket, from.tls_verify ? 1 : 0);
    amqp_ssl_socket_set_verify_hostname(socket, 0);
    if (from.tls_verify) {
      SSL_CTX_set_verify(context, SSL_VERIFY_PEER, on_verify);
      auto* param = SSL_CTX_get0_param(context);
      bool named = X509_VERIFY_PARAM_set1_ip_asc(param, from.host.c_str()) == 1 ||
                   X509_VERIFY_PARAM_set1_host(param, from.host.c_str(), from.host.size()) == 1;
      if (!named) return fmt::format("checking the broker's name {}{}", from.host, tls_why());
    }
    ERR_clear_error();  // (set1_ip_asc refused a name that is not an address)
    return {};
  }

  // Why a TLS step failed on this thread (": why"): the broker's certificate refused, else the
  // first error OpenSSL queued (the nearest to the cause), else nothing. The queue is emptied.
  static std::string tls_why() {
    std::string why = refused_certificate.empty() ? std::string() : "certificate refused: " + refused_certificate;
    for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
      if (!why.empty()) continue;
      char text[256] = {};
      ERR_error_string_n(e, text, sizeof text);
      why = text;
    }
    refused_certificate.clear();
    return why.empty() ? why : ": " + why;
  }

  // Makes sure queue `name` is there: one that is is taken as it is, a missing one (404) is
  // declared, durable. The 404 closed the channel it came on: it is opened again first (and put
  // back in transaction mode when `tx`). Empty, or what went wrong.
  static std::string ensure_queue(amqp_connection_state_t conn, amqp_channel_t ch, const std::string& name,
                                  bool tx = false) {
    amqp_queue_declare(conn, ch, bytes_of(name), 1, 0, 0, 0, amqp_empty_table);
    auto r = amqp_get_rpc_reply(conn);
    if (r.reply_type == AMQP_RESPONSE_NORMAL) return {};
    bool missing = r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
                   static_cast<const amqp_channel_close_t*>(r.reply.decoded)->reply_code == 404;
    if (!missing) return problem_of(r, fmt::format("looking for queue {}", name));
    amqp_channel_close_ok_t closed{};
    amqp_send_method(conn, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &closed);
    amqp_channel_open(conn, ch);
    if (auto p = problem_of(amqp_get_rpc_reply(conn), "opening a channel"); !p.empty()) return p;
    if (tx) {
      amqp_tx_select(conn, ch);
      if (auto p = problem_of(amqp_get_rpc_reply(conn), "starting the dead letters' transactions"); !p.empty())
        return p;
    }
    amqp_queue_declare(conn, ch, bytes_of(name), 0, 1, 0, 0, amqp_empty_table);
    return problem_of(amqp_get_rpc_reply(conn), fmt::format("declaring queue {}", name));
  }

  // One connection's life: consumes until stop() (""), or until something fails (why).
  std::string session(bool& consumed) {
    connection c;
    auto* socket = from.tls ? amqp_ssl_socket_new(c.get()) : amqp_tcp_socket_new(c.get());
    if (socket == nullptr) return "cannot make a socket";
    if (from.tls) {
      if (auto p = tls_setup(socket); !p.empty()) return p;
    }
    timeval connect_limit{2, 0};
    if (int rc = amqp_socket_open_noblock(socket, from.host.c_str(), from.port, &connect_limit); rc != AMQP_STATUS_OK)
      return fmt::format("connecting to {}:{}: {}{}", from.host, from.port, amqp_error_string2(rc),
                         from.tls ? tls_why() : std::string());
    c.opened();
    auto* conn = c.get();
    timeval rpc_limit{10, 0};  // (no call waits for ever for a broker that stopped answering)
    amqp_set_rpc_timeout(conn, &rpc_limit);
    if (auto p = problem_of(amqp_login(conn, from.vhost.c_str(), 0, 131072, 30, AMQP_SASL_METHOD_PLAIN,
                                       from.user.c_str(), from.password.c_str()),
                            fmt::format("logging in as {} to vhost {}", from.user, from.vhost));
        !p.empty())
      return p;
    for (auto ch : {channel, dead_channel}) {
      amqp_channel_open(conn, ch);
      if (auto p = problem_of(amqp_get_rpc_reply(conn), "opening a channel"); !p.empty()) return p;
    }
    for (const auto& name : {from.queue, from.dead})
      if (auto p = ensure_queue(conn, channel, name); !p.empty()) return p;
    amqp_tx_select(conn, dead_channel);  // (a commit returns once the broker has the dead letters)
    if (auto p = problem_of(amqp_get_rpc_reply(conn), "starting the dead letters' transactions"); !p.empty()) return p;
    amqp_basic_qos(conn, channel, 0, from.prefetch, 0);
    if (auto p = problem_of(amqp_get_rpc_reply(conn), "setting the prefetch"); !p.empty()) return p;
    amqp_basic_consume(conn, channel, bytes_of(from.queue), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
    if (auto p = problem_of(amqp_get_rpc_reply(conn), fmt::format("consuming queue {}", from.queue)); !p.empty())
      return p;
    log(log_level::info, "bridge", "consuming {} into queue {}", from.address(), to.queue());
    consumed = true;
    count([](bridge_counters& counters) { counters.active = true; });
    auto lag_asked = std::chrono::steady_clock::time_point();
    while (!stopping) {
      if (std::chrono::steady_clock::now() - lag_asked > std::chrono::seconds(1)) {  // the queue's ready messages
        lag_asked = std::chrono::steady_clock::now();
        auto* ok = amqp_queue_declare(conn, channel, bytes_of(from.queue), 1, 0, 0, 0, amqp_empty_table);
        if (auto p = problem_of(amqp_get_rpc_reply(conn), fmt::format("looking at queue {}", from.queue)); !p.empty())
          return p;  // (deleted: the channel is closed, and the consumer with it)
        count([&](bridge_counters& counters) { counters.lag = ok->message_count; });
      }
      // A batch: the first delivery waited for (a while: stop() is seen between waits), the
      // rest as they come without a pause.
      std::vector<bridge_message> batch;
      std::uint64_t last_tag = 0;
      while (batch.size() < from.batch) {
        amqp_maybe_release_buffers(conn);
        amqp_envelope_t envelope;
        timeval limit = batch.empty() ? timeval{0, 250'000} : timeval{0, 1'000};
        auto r = amqp_consume_message(conn, &envelope, &limit, 0);
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) break;
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_UNEXPECTED_STATE)
          return "receiving: " + unexpected_frame(conn);  // (nothing acked)
        if (r.reply_type != AMQP_RESPONSE_NORMAL) return problem_of(r, "receiving");
        batch.push_back(message_of(envelope));
        last_tag = envelope.delivery_tag;
        amqp_destroy_envelope(&envelope);
      }
      if (batch.empty()) continue;
      auto kept = std::make_shared<const std::vector<bridge_message>>(std::move(batch));
      auto refused = store_from_thread(kept, conn);
      if (!refused) return {};  // stopped before they were stored: the broker delivers them again
      // (A publish to a queue that is not there is dropped: a dead-letter queue deleted since the
      // last batch is declared again first.)
      if (!refused->empty()) {
        if (auto p = ensure_queue(conn, dead_channel, from.dead, true); !p.empty()) return p;
      }
      for (const auto& [i, why] : *refused) {
        const auto& m = (*kept)[i];
        log(log_level::warn, "bridge", "message {} of queue {} cannot become a job: {}", m.default_id, from.queue, why);
        std::vector<amqp_table_entry_t> entries;
        auto add = [&](const std::string& key, const std::string& value) {
          amqp_table_entry_t e{};
          e.key = bytes_of(key);
          e.value.kind = AMQP_FIELD_KIND_UTF8;
          e.value.value.bytes = bytes_of(value);
          entries.push_back(e);
        };
        const std::string reason_key = "x-jobrt-reason", queue_key = "x-jobrt-queue";
        add(reason_key, why);
        add(queue_key, from.queue);
        for (const auto& [k, v] : m.fields) add(k, v);
        amqp_basic_properties_t props{};
        props._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
        props.delivery_mode = 2;  // persistent
        props.headers.num_entries = static_cast<int>(entries.size());
        props.headers.entries = entries.data();
        props.message_id = bytes_of(m.default_id);
        if (int rc = amqp_basic_publish(conn, dead_channel, amqp_empty_bytes, bytes_of(from.dead), 0, 0, &props,
                                        bytes_of(*m.body));
            rc != AMQP_STATUS_OK)
          return fmt::format("writing to dead-letter queue {}: {}", from.dead, amqp_error_string2(rc));
      }
      // Acknowledged only once the broker has the dead letters (the commit; frames of the other
      // channel that come meanwhile wait for amqp_consume_message); then one ack with
      // `multiple` takes the batch (deliveries come in order on one channel).
      if (!refused->empty()) {
        amqp_tx_commit(conn, dead_channel);
        if (auto p = problem_of(amqp_get_rpc_reply(conn), "committing dead letters"); !p.empty()) return p;
      }
      if (int rc = amqp_basic_ack(conn, channel, last_tag, 1); rc != AMQP_STATUS_OK)
        return fmt::format("acknowledging: {}", amqp_error_string2(rc));
    }
    return {};
  }

  // Asks the thread to end (it stores and acknowledges what it read first) and wakes its waits.
  void ask_stop() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    stopped.notify_all();
    asio::post(strand, [self = shared_from_this()] { self->wake.expires_at(asio::steady_timer::time_point::min()); });
  }

  static void consume(const std::shared_ptr<impl>& self) {
    try {
      for (std::chrono::milliseconds wait(100); !self->stopping;) {
        bool consumed = false;
        auto why = self->session(consumed);
        self->count([](bridge_counters& c) { c.active = false; });
        if (self->stopping) break;
        if (consumed) wait = std::chrono::milliseconds(100);  // (a connection that worked: from the start)
        log(log_level::warn, "bridge", "{}: {}; connecting again in {} ms", self->from.address(), why, wait.count());
        std::unique_lock lock(self->mutex);
        self->stopped.wait_for(lock, wait, [&] { return self->stopping.load(); });
        wait = std::min<std::chrono::milliseconds>(wait * 2, std::chrono::seconds(5));
      }
    } catch (...) {  // (a broken promise: the io_context went away)
      self->failure = std::current_exception();
    }
    asio::post(self->strand, [self] { self->ended.expires_at(asio::steady_timer::time_point::min()); });
  }
};

amqp_bridge::amqp_bridge(asio::any_io_executor ex, amqp_source from, producer to, bridge_mapping how)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(from), std::move(to), std::move(how))) {}

amqp_bridge::~amqp_bridge() {
  stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

asio::awaitable<void> amqp_bridge::run() {
  auto self = impl_;
  self->thread = std::thread([self] { impl::consume(self); });
  // On the strand, where the thread sets `ended`. A run() cancelled by its caller stops the
  // bridge as stop() does and still waits for the thread: joined before it ended, it would block
  // this io_context, which the thread's stores wait for. (A cancellation that came before a wait
  // began is looked for before each: the wait would not see it.)
  auto ended = [self]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    for (;;) {
      if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
        self->ask_stop();
        co_await asio::this_coro::reset_cancellation_state();
      }
      co_await self->ended.async_wait(asio::as_tuple(asio::use_awaitable));
      if (self->ended.expiry() == asio::steady_timer::time_point::min()) co_return;
    }
  };
  // The same for a caller cancelled before the wait was handed over.
  bool throws = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) self->ask_stop();
  co_await detail::run_on(self->strand, ended());
  co_await asio::this_coro::throw_if_cancelled(throws);
  self->thread.join();
  self->count([](bridge_counters& c) { c.active = false; });
  if (self->failure) std::rethrow_exception(self->failure);
}

void amqp_bridge::stop() { impl_->ask_stop(); }

bridge_counters amqp_bridge::counters() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->counts;
}

asio::awaitable<bridge_counters> amqp_bridge::sample() { co_return counters(); }

std::string amqp_bridge::source() const { return impl_->from.address(); }

}  // namespace jobrt
