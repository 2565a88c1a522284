// The AMQP bridge (jobrt/bridge.hpp) against a real rabbitmq-server that scripts/rabbitmq.sh
// starts on loopback: messages become jobs once, bad ones go to the dead-letter queue with the
// reason, and a bridge process killed again and again (and its connection closed by the broker)
// loses and doubles nothing, in publish order, while a worker runs the jobs.
#include "integration/job_runs.hpp"
#include "support/redis_server.hpp"
#include "support/run.hpp"
#include "support/shell.hpp"

#include <jobrt/bridge.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis_backend.hpp>
#include <jobrt/worker.hpp>

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <fmt/format.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#ifndef JOBRT_BIN
#error "JOBRT_BIN must name the jobrt executable (see tests/CMakeLists.txt)"
#endif
#ifndef JOBRT_SCRIPTS
#error "JOBRT_SCRIPTS must name the scripts directory (see tests/CMakeLists.txt)"
#endif

extern char** environ;

namespace asio = boost::asio;
using namespace jobrt;
using namespace jobrt::test;
using asio::awaitable;

namespace {

// A rabbitmq-server of this test's own (scripts/rabbitmq.sh), stopped at the end.
class rabbitmq {
 public:
  /// tls: it also listens with TLS (tls_port()), with a certificate for 127.0.0.1 that ca() signed.
  explicit rabbitmq(bool tls = false) {
    std::istringstream out(output_of(fmt::format("{}{}/rabbitmq.sh", tls ? "TLS=1 " : "", JOBRT_SCRIPTS)));
    out >> port_ >> dir_ >> tls_port_;
    REQUIRE(port_ > 0);
    REQUIRE((tls_port_ > 0) == tls);
  }
  ~rabbitmq() {
    try {
      output_of(fmt::format("{}/rabbitmq.sh stop {}", JOBRT_SCRIPTS, quoted(dir_)));
    } catch (...) {
    }
  }
  rabbitmq(const rabbitmq&) = delete;
  rabbitmq& operator=(const rabbitmq&) = delete;
  int port() const { return port_; }
  int tls_port() const { return tls_port_; }
  std::string url(const std::string& queue) const {
    return fmt::format("amqp://guest:guest@127.0.0.1:{}/%2F?queue={}", port_, queue);
  }
  std::string tls_url(const std::string& queue, const std::string& parameters) const {
    return fmt::format("amqps://guest:guest@127.0.0.1:{}/%2F?queue={}{}", tls_port_, queue, parameters);
  }
  std::string ca() const { return dir_ + "/tls/ca.crt"; }
  void close_all_connections() const {
    output_of(fmt::format("{}/rabbitmq.sh ctl {} close_all_connections test", JOBRT_SCRIPTS, quoted(dir_)));
  }

 private:
  int port_ = 0, tls_port_ = 0;
  std::string dir_;
};

amqp_bytes_t bytes(const std::string& s) { return amqp_bytes_t{s.size(), const_cast<char*>(s.data())}; }

// A publisher (and reader of a queue) with librabbitmq, blocking.
class client {
 public:
  explicit client(int port) : c_(amqp_new_connection()) {
    auto* socket = amqp_tcp_socket_new(c_);
    REQUIRE(amqp_socket_open(socket, "127.0.0.1", port) == AMQP_STATUS_OK);
    REQUIRE(amqp_login(c_, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest").reply_type ==
            AMQP_RESPONSE_NORMAL);
    amqp_channel_open(c_, 1);
    REQUIRE(amqp_get_rpc_reply(c_).reply_type == AMQP_RESPONSE_NORMAL);
  }
  ~client() {
    amqp_connection_close(c_, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c_);
  }
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  void declare(const std::string& queue) {
    amqp_queue_declare(c_, 1, bytes(queue), 0, 1, 0, 0, amqp_empty_table);
    REQUIRE(amqp_get_rpc_reply(c_).reply_type == AMQP_RESPONSE_NORMAL);
  }
  // Publishes a body with a type, a message id (when not empty) and string headers.
  void publish(const std::string& queue, const std::string& body, const std::string& type,
               const std::string& message_id = {},
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    std::vector<amqp_table_entry_t> entries;
    for (const auto& [k, v] : headers) {
      amqp_table_entry_t e{};
      e.key = bytes(k);
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = bytes(v);
      entries.push_back(e);
    }
    amqp_basic_properties_t p{};
    p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG;
    p.delivery_mode = 2;
    p.headers.num_entries = static_cast<int>(entries.size());
    p.headers.entries = entries.data();
    if (!type.empty()) {
      p._flags |= AMQP_BASIC_TYPE_FLAG;
      p.type = bytes(type);
    }
    if (!message_id.empty()) {
      p._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
      p.message_id = bytes(message_id);
    }
    REQUIRE(amqp_basic_publish(c_, 1, amqp_empty_bytes, bytes(queue), 0, 0, &p, bytes(body)) == AMQP_STATUS_OK);
  }
  void remove(const std::string& queue) {
    amqp_queue_delete(c_, 1, bytes(queue), 0, 0);
    REQUIRE(amqp_get_rpc_reply(c_).reply_type == AMQP_RESPONSE_NORMAL);
  }
  // The messages a queue holds (ready), by a passive declare.
  std::uint32_t ready(const std::string& queue) {
    auto* ok = amqp_queue_declare(c_, 1, bytes(queue), 1, 0, 0, 0, amqp_empty_table);
    REQUIRE(ok != nullptr);
    return ok->message_count;
  }
  // The x-jobrt-reason header of the next message of `queue` (basic.get, acknowledged).
  std::string next_reason(const std::string& queue) {
    amqp_maybe_release_buffers(c_);
    auto r = amqp_basic_get(c_, 1, bytes(queue), 1);
    REQUIRE(r.reply_type == AMQP_RESPONSE_NORMAL);
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD) return "(empty)";
    amqp_message_t m;
    REQUIRE(amqp_read_message(c_, 1, &m, 0).reply_type == AMQP_RESPONSE_NORMAL);
    std::string reason;
    for (int i = 0; i < m.properties.headers.num_entries; ++i) {
      const auto& e = m.properties.headers.entries[i];
      if (std::string(static_cast<const char*>(e.key.bytes), e.key.len) == "x-jobrt-reason")
        reason.assign(static_cast<const char*>(e.value.value.bytes.bytes), e.value.value.bytes.len);
    }
    amqp_destroy_message(&m);
    return reason;
  }

 private:
  amqp_connection_state_t c_;
};

}  // namespace

TEST_CASE("amqp bridge: messages become jobs once, bad ones go to the dead-letter queue with the reason") {
  rabbitmq broker;
  redis_server server;
  client publisher(broker.port());
  publisher.declare("in");
  for (int n = 0; n < 3; ++n) publisher.publish("in", fmt::format("{{\"n\":{}}}", n), "t", {}, {{"group", "g"}});
  publisher.publish("in", R"({"tenant":3})", "t", "order-7");
  publisher.publish("in", R"({"tenant":3})", "t", "order-7");  // sent twice: one job
  publisher.publish("in", R"({"tenant":4})", "t", "1001");     // a numbered message: job msg-1001
  publisher.publish("in", "{not json", "t");
  publisher.publish("in", "{}", "");                   // no type
  publisher.publish("in", R"({"same":"body"})", "t");  // no message_id: the body's hash
  publisher.publish("in", R"({"same":"body"})", "t");  // the same body: the same job
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), server.config());
        auto bridge = make_bridge(ctx.get_executor(), broker.url("in"), producer(store, "q"));
        bool ended = false;
        asio::co_spawn(ctx, bridge->run(), [&](std::exception_ptr e) {
          ended = true;
          if (e) std::rethrow_exception(e);
        });
        REQUIRE(co_await eventually([&] { return bridge->counters().received == 10; }));
        REQUIRE(co_await eventually([&] { return publisher.ready("in") == 0 && publisher.ready("in.dead") == 2; }));
        auto counts = bridge->counters();
        CHECK(counts.enqueued == 6);
        CHECK(counts.duplicates == 2);
        CHECK(counts.rejected == 2);
        CHECK(counts.active);
        CHECK(co_await store.group_size("q", "g") == 3);
        claim_options o;
        o.worker = "w";
        o.max = 10;
        auto claimed = co_await store.claim("q", o);
        REQUIRE(claimed.size() == 4);  // g's head, order-7, msg-1001, the hashed one
        CHECK(claimed[1].job.id == "order-7");
        CHECK(claimed[2].job.id == "msg-1001");
        CHECK(claimed[3].job.id.starts_with("sha256-"));
        CHECK(claimed[3].job.id.size() == 7 + 32);
        CHECK(publisher.next_reason("in.dead").starts_with("the message body is not JSON"));
        CHECK(publisher.next_reason("in.dead") == "no field type to give the job's type, and no default type");
        // The dead-letter queue deleted while the bridge runs: declared again before the next
        // dead letter, which is not dropped.
        publisher.remove("in.dead");
        publisher.publish("in", "[1,2", "t");
        REQUIRE(co_await eventually([&] { return bridge->counters().received == 11; }));
        bridge->stop();  // (it ends once what it read is stored, dead-lettered and acknowledged)
        CHECK(co_await eventually([&] { return ended; }, 5s));
        // All acknowledged: none came back to the queue when the bridge's connection closed.
        CHECK(publisher.ready("in") == 0);
        CHECK(publisher.ready("in.dead") == 1);
        CHECK(publisher.next_reason("in.dead").starts_with("the message body is not JSON"));
      },
      60s);
}

TEST_CASE("amqp bridge: over amqps:// the broker's certificate is checked against the CA given, and refused without") {
  rabbitmq broker(true);
  redis_server server;
  client publisher(broker.port());
  publisher.declare("in");
  for (int n = 0; n < 3; ++n) publisher.publish("in", fmt::format("{{\"n\":{}}}", n), "t", fmt::format("m{}", n));
  publisher.publish("in", "{not json", "t");
  // Without the test CA (the system's CAs then): refused in the handshake, said, and tried again;
  // nothing taken.
  auto said = output_of(fmt::format("timeout 3 {} bridge --from '{}' -q q -u redis://127.0.0.1:{} 2>&1; true",
                                    JOBRT_BIN, broker.tls_url("in", ""), server.port()));
  CHECK_MESSAGE(said.find(fmt::format("connecting to 127.0.0.1:{}", broker.tls_port())) != std::string::npos, said);
  // (Why depends on the chain the broker sends: its CA too here, "self-signed certificate in
  // certificate chain".)
  CHECK_MESSAGE(said.find("SSL handshake failed: certificate refused: ") != std::string::npos, said);
  // With the CA, at a name the certificate does not give (it names 127.0.0.1): refused too.
  said = output_of(
      fmt::format("timeout 3 {} bridge --from '{}' -q q -u redis://127.0.0.1:{} 2>&1; true", JOBRT_BIN,
                  fmt::format("amqps://guest:guest@localhost:{}/%2F?queue=in&ca={}", broker.tls_port(), broker.ca()),
                  server.port()));
  CHECK_MESSAGE(said.find("certificate refused: hostname mismatch") != std::string::npos, said);
  CHECK(publisher.ready("in") == 4);
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), server.config());
        auto bridge = make_bridge(ctx.get_executor(), broker.tls_url("in", "&ca=" + broker.ca()), producer(store, "q"));
        bool ended = false;
        asio::cancellation_signal cut;
        asio::co_spawn(ctx, bridge->run(), asio::bind_cancellation_slot(cut.slot(), [&](std::exception_ptr e) {
                         ended = true;
                         if (e) std::rethrow_exception(e);
                       }));
        REQUIRE(co_await eventually([&] { return publisher.ready("in") == 0 && publisher.ready("in.dead") == 1; }));
        CHECK(bridge->counters().enqueued == 3);
        CHECK(bridge->counters().rejected == 1);
        CHECK(bridge->source().starts_with("amqps://guest@127.0.0.1:"));
        CHECK((co_await store.counts("q")).enqueued == 3);
        // run() cancelled by its caller stops the bridge as stop() would (it joined a consumer
        // thread that went on, and blocked this io_context for good).
        cut.emit(asio::cancellation_type::terminal);
        CHECK(co_await eventually([&] { return ended; }, 5s));
      },
      60s);
}

TEST_CASE("amqp bridge: 50,000 messages over 1,000 groups, the bridge killed again and again: each one job, in order") {
  rabbitmq broker;
  redis_server server;
  auto url = fmt::format("redis://127.0.0.1:{}", server.port());
  constexpr int total = 50'000, groups = 1'000;
  job_runs ran(total);
  pid_t pid = -1;
  auto start = [&] {
    std::vector<std::string> args{JOBRT_BIN,     "bridge",  "--from", broker.url("in") + "&prefetch=2000",
                                  "-q",          "bridged", "-u",     url,
                                  "--log-level", "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(::posix_spawn(&pid, JOBRT_BIN, nullptr, nullptr, argv.data(), environ) == 0);
  };
  auto reap = [&](int signal) {
    ::kill(pid, signal);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  };
  client publisher(broker.port());
  publisher.declare("in");
  run(
      [&](asio::io_context& ctx) -> awaitable<void> {
        redis_backend store(ctx.get_executor(), server.config());
        worker_options o;
        o.queue = "bridged";
        o.concurrency = 32;
        worker w(ctx.get_executor(), store, o);
        w.add_handler("t", ran.handler());
        w.start();
        start();
        // 10 rounds of 5,000 messages, one publisher: once the bridge is partway through a
        // round's, it is killed and started again (the last round: the broker closes its
        // connection instead, and it connects again).
        for (int round = 0; round < 10; ++round) {
          for (int n = round * 5'000; n < (round + 1) * 5'000; ++n)
            publisher.publish("in", fmt::format("{{\"n\":{}}}", n), "t", fmt::format("m-{}", n),
                              {{"group", fmt::format("g{}", n % groups)}});
          CHECK(co_await eventually([&] { return ran.distinct > round * 5'000 + 1'000; }, 10s));
          if (round == 9) {  // (the publisher's too: it has published the last)
            broker.close_all_connections();
          } else {
            reap(SIGKILL);
            start();
          }
        }
        REQUIRE_MESSAGE(co_await eventually([&] { return ran.distinct == total; }, 60s),
                        ran.distinct << " of " << total);
        REQUIRE(co_await eventually([&] {
          std::ifstream status(fmt::format("/proc/{}/status", pid));  // (SIGTERM caught by now)
          std::string line;
          while (std::getline(status, line))
            if (line.starts_with("SigCgt:"))
              return ((std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1) == 1;
          return false;
        }));
        CHECK(reap(SIGTERM) == 0);
        // All acknowledged: none came back to the queue when the bridge's connection closed.
        client checker(broker.port());
        CHECK(checker.ready("in") == 0);
        co_await w.stop(std::chrono::seconds(5));
      },
      120s);
  CHECK(ran.doubled() == 0);
  CHECK(ran.inversions == 0);
  CHECK(ran.distinct == total);
}
