// Front doors: jobs from the messages another system delivers (docs/BRIDGES.md): a Redis
// Stream's entries (stream_bridge) or a RabbitMQ queue's messages (amqp_bridge).
//
// A bridge takes messages from a source, turns each into a job, stores the jobs, and only then
// acknowledges the messages to the source. A bridge that dies between the two gets them
// delivered again, and each job's id (the message's own id) makes that second delivery a
// duplicate, not a second job: the id stays taken while the job waits or runs and for a keep
// after it ended (job_spec::id, bridge_mapping::keep).
//
//   jobrt::producer to(backend, "imports", opts);                // its grouping rules decide groups
//   jobrt::stream_bridge bridge(ex, jobrt::stream_source::from_url(
//       "redis-stream://127.0.0.1:6379/imports?group=jobrt"), to);
//   co_await bridge.run();                                        // until bridge.stop()
#pragma once

#include <jobrt/job.hpp>
#include <jobrt/producer.hpp>
#include <jobrt/redis/config.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jobrt {

/// How a message becomes a job. Names are looked up among the message's fields (a stream
/// entry's fields; an AMQP message's headers, and its `type` property as `type`).
struct bridge_mapping {
  std::string type_field = "type";  ///< the field that names the job's type
  std::string type;                 ///< the type of a message without that field ("": refused)
  /// The field that holds the payload, JSON. A message without it: its other fields (all but
  /// the type, id and group fields) as a JSON object of strings.
  std::string payload_field = "payload";
  /// The field that gives the job's id. A message without it: the source's own id for it (a
  /// stream entry's "<stream>@<entry id>").
  std::string id_field = "id";
  /// The field that gives the job's group. A message without it: the producer's grouping rules
  /// decide from the type and payload.
  std::string group_field = "group";
  /// How long a message's id stays taken after its job ended (the jobs' job_spec::keep): a
  /// delivery again within it is a duplicate. Make it longer than the source may take to
  /// deliver a message again (the longest a bridge may be down). At least 1 ms.
  std::chrono::milliseconds keep = std::chrono::hours(1);

  /// Parses {"type_field", "type", "payload_field", "id_field", "group_field", "keep_ms"}, each
  /// optional; throws std::invalid_argument naming the field that is wrong or unknown.
  static bridge_mapping from_json(const boost::json::value& v);
};

/// A message as a source hands it to the mapping.
struct bridge_message {
  std::vector<std::pair<std::string, std::string>> fields;
  /// When set, the payload's text (an AMQP message's body): payload_field is not looked up.
  std::optional<std::string> body;
  std::string default_id;  ///< the job's id when no field gives one
};

/// The job a message becomes, or why it cannot become one.
struct mapped_message {
  job_spec job;
  std::string rejected;  ///< not empty: why not, naming the field ("field payload is not JSON: ...")
};

/// Maps one message. The job is not yet checked against a producer (producer::check): its size
/// and grouping rules are the bridge's to check.
mapped_message map_message(const bridge_message& m, const bridge_mapping& how);

/// Where a stream bridge reads: a Redis Stream and its consumer group. The stream's server may
/// be one Redis server, a primary that Sentinel names (server.sentinels), or a Redis Cluster
/// (found out from the server, INFO cluster): there the bridge reads at the primary of the
/// stream's slot and follows it when the slot moves or fails over.
struct stream_source {
  redis::config server;  ///< the server that holds the stream (on a cluster: a node to start from)
  /// Further nodes of a Redis Cluster, tried in turn to learn its slot map. Giving any says the
  /// server is a cluster.
  std::vector<redis::config> other_seeds;
  std::string stream;
  std::string group;     ///< the consumer group; made at the stream's first entry if missing
  std::string consumer;  ///< this bridge's name in the group (default: host name and process id)
  std::string dead;      ///< where refused entries go, with the reason (default: "<stream>:dead")
  /// One bridge of a group consumes at a time, so that entries are stored in stream order; the
  /// others stand by. One that dies is followed after this long (the TTL of its lock, which a
  /// watchdog renews every third of it): the next takes over every entry the group has pending
  /// (XAUTOCLAIM), in stream order, before it reads new ones.
  std::chrono::milliseconds lock_ttl{5000};
  std::size_t batch = 200;  ///< entries per read, and jobs per enqueue call

  /// Parses `redis-stream://[[user]:password@]host[:port][,host[:port]...]/<stream>?group=<g>`
  /// (several hosts: a cluster's nodes) or, behind Sentinel,
  /// `redis-stream+sentinel://[[user]:password@]host[:port][,host[:port]...]/<primary>/<stream>?group=<g>`
  /// (sentinels at port 26379 by default; the parameters sentinel_user and sentinel_password), with
  /// the parameters consumer, dead, db, lock_ttl_ms and batch; `rediss-stream://` and
  /// `rediss-stream+sentinel://` for TLS, with `rediss://`'s parameters. Throws
  /// std::invalid_argument naming what is wrong.
  static stream_source from_url(std::string_view url);
  /// The URL again, without the password (for logs).
  std::string address() const;
};

/// What a bridge did since it started, and how far behind its source is.
struct bridge_counters {
  std::uint64_t received = 0;    ///< messages read from the source
  std::uint64_t enqueued = 0;    ///< jobs stored
  std::uint64_t duplicates = 0;  ///< messages whose id was taken: delivered again, nothing stored
  std::uint64_t rejected = 0;    ///< messages that could not become jobs (sent to the dead letters)
  std::uint64_t taken_over = 0;  ///< pending entries taken over (a bridge before this one left them)
  std::int64_t lag = -1;         ///< entries not yet read by the group (-1: not known)
  std::int64_t pending = -1;     ///< entries read and not yet acknowledged (-1: not known)
  bool active = false;           ///< this bridge holds its group's lock and consumes
};

/// The Prometheus series of a bridge (jobrt_bridge_*), labelled with its source.
std::string bridge_metrics_text(const bridge_counters& c, std::string_view source);

/// The most messages a bridge stores at once (the sources' `batch`). Give its producer a
/// producer_options::batch at least this large, so that a batch is one enqueue call: refused or
/// stored whole.
inline constexpr std::size_t max_bridge_batch = 1000;

/// What every bridge does.
class bridge {
 public:
  virtual ~bridge();
  /// Consumes until stop(). A failure to store jobs (the queue's server away, a full group) is
  /// logged and tried again with backoff; the messages stay unacknowledged meanwhile.
  virtual boost::asio::awaitable<void> run() = 0;
  /// Stops run(): it stops reading, stores and acknowledges what it read (or leaves it to be
  /// delivered again when the store cannot complete) and returns. Thread-safe.
  virtual void stop() = 0;
  /// The counters now (lag and pending as last sampled).
  virtual bridge_counters counters() const = 0;
  /// The counters with the source's lag asked again.
  virtual boost::asio::awaitable<bridge_counters> sample() = 0;
  /// Where it reads, for logs and metrics (no password).
  virtual std::string source() const = 0;
};

/// The bridge a URL names: redis-stream://, rediss-stream:// and their +sentinel forms
/// (stream_bridge), amqp:// and amqps://
/// (amqp_bridge). Throws std::invalid_argument naming what is wrong with the URL.
std::unique_ptr<bridge> make_bridge(boost::asio::any_io_executor ex, std::string_view url, producer to,
                                    bridge_mapping how = {});

/// Takes jobs from a Redis Stream through a consumer group (XREADGROUP on a blocking
/// connection, no polling), stores them with a producer, then XACKs them. Entries that cannot
/// become jobs go to the dead-letter stream with the reason, then are acknowledged. One bridge
/// of a stream's group consumes at a time (a lock on the stream's server); when it dies, one of
/// the others takes its pending entries over, in stream order, and goes on.
class stream_bridge final : public bridge {
 public:
  stream_bridge(boost::asio::any_io_executor ex, stream_source from, producer to, bridge_mapping how = {});
  ~stream_bridge() override;
  stream_bridge(const stream_bridge&) = delete;
  stream_bridge& operator=(const stream_bridge&) = delete;

  /// Also throws for what waiting cannot mend (the stream's key holds another type).
  boost::asio::awaitable<void> run() override;
  /// Also releases the lock.
  void stop() override;
  bridge_counters counters() const override;
  /// Asks the server for the group's lag and pending entries (XINFO GROUPS).
  boost::asio::awaitable<bridge_counters> sample() override;
  std::string source() const override;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// Where an AMQP bridge reads: a RabbitMQ queue (AMQP 0-9-1). Its messages' fields are their
/// headers, and the `type` property as `type` when no header is named so.
struct amqp_source {
  std::string host = "127.0.0.1";
  std::uint16_t port = 5672;
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";
  std::string queue;
  std::string dead;               ///< where refused messages go, with the reason (default "<queue>.dead")
  std::uint16_t prefetch = 1000;  ///< messages delivered and not yet acknowledged, at most
  std::size_t batch = 200;        ///< messages an enqueue call stores, at most
  /// TLS (amqps://). The broker's certificate is checked against `tls_ca_file`, or the system's
  /// CAs when it is empty, and must name `host`; a client certificate is sent when cert and key
  /// are given.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  bool tls_verify = true;  ///< false: any certificate is taken (a test broker's, say)

  /// Parses `amqp://[user[:password]@]host[:port][/vhost]?queue=<queue>` (the vhost
  /// percent-encoded: %2F for "/", the default), with the parameters dead, prefetch and batch;
  /// `amqps://` for TLS (port 5671 by default) with the parameters ca, cert, key and
  /// verify=peer|none, as rediss:// takes them. Throws std::invalid_argument naming what is wrong.
  static amqp_source from_url(std::string_view url);
  std::string address() const;  ///< the URL again, without the password
};

/// Takes jobs from a RabbitMQ queue with librabbitmq (rabbitmq-c), which blocks: it runs on a
/// thread of its own and hands each batch of messages to the io_context, where they are stored;
/// then the thread acknowledges them. Refused messages are published to the dead-letter queue
/// with the reason (header x-jobrt-reason), then acknowledged. A lost connection is made again
/// with backoff; its unacknowledged messages the broker delivers again, and their ids (the
/// message_id property, else a hash of the body) make them duplicates.
class amqp_bridge final : public bridge {
 public:
  amqp_bridge(boost::asio::any_io_executor ex, amqp_source from, producer to, bridge_mapping how = {});
  ~amqp_bridge() override;
  amqp_bridge(const amqp_bridge&) = delete;
  amqp_bridge& operator=(const amqp_bridge&) = delete;

  boost::asio::awaitable<void> run() override;
  void stop() override;
  bridge_counters counters() const override;
  /// counters(): its lag is the queue's ready messages as the thread last asked (once a second).
  boost::asio::awaitable<bridge_counters> sample() override;
  std::string source() const override;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace jobrt
