#include <jobrt/metrics.hpp>

#include "clock.hpp"
#include "http/listener.hpp"

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

namespace jobrt {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// When this process started (close enough: when the library was loaded), for process_start_time_seconds.
const double started_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

// Label values escape backslash, quote and newline.
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void histogram_lines(std::string& out, std::string_view name, std::string_view labels, const histogram& h) {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < histogram::bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, histogram::bounds[i], cumulative);
  }
  cumulative += h.counts.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cumulative);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, h.sum, name, labels, h.count);
}

histogram merged(const std::vector<worker_metrics>& ws, histogram worker_metrics::*which) {
  histogram h;
  for (auto& w : ws) {
    const histogram& x = w.*which;
    for (std::size_t i = 0; i < h.counts.size(); ++i) h.counts[i] += x.counts[i];
    h.sum += x.sum;
    h.count += x.count;
  }
  return h;
}

// The process_* series Prometheus's client libraries export, from getrusage and /proc/self.
void process_lines(std::string& out) {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  family(out, "process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.");
  out += fmt::format("process_cpu_seconds_total {}\n", seconds(usage.ru_utime) + seconds(usage.ru_stime));
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (statm >> size >> resident) {
    auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    family(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    out += fmt::format("process_resident_memory_bytes {}\n", resident * page);
    family(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    out += fmt::format("process_virtual_memory_bytes {}\n", size * page);
  }
  std::error_code ec;
  std::size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++fds;
  if (!ec) {
    family(out, "process_open_fds", "gauge", "Open file descriptors.");
    out += fmt::format("process_open_fds {}\n", fds);
  }
  family(out, "process_start_time_seconds", "gauge", "When the process started, in seconds since the epoch.");
  out += fmt::format("process_start_time_seconds {}\n", started_at);
}

}  // namespace

std::string_view version() noexcept { return JOBRT_VERSION; }

std::string prometheus_text(const std::vector<queue_metrics>& queues) {
  std::string out;
  struct counter {
    const char* name;
    const char* help;
    std::uint64_t type_counters::*field;
  };
  const counter per_type[] = {
      {"jobrt_jobs_started_total", "Jobs this process started, by queue and type.", &type_counters::started},
      {"jobrt_jobs_completed_total", "Jobs this process completed.", &type_counters::completed},
      {"jobrt_jobs_failed_total", "Jobs this process dead-lettered (or whose group it halted).",
       &type_counters::failed},
      {"jobrt_jobs_retried_total", "Runs that failed and will run again after a backoff.", &type_counters::retried},
      {"jobrt_jobs_deferred_total", "Runs that asked to run again later (retry_after).", &type_counters::deferred},
      {"jobrt_jobs_recovered_total", "Jobs whose lease expired, sent back by this process's reapers.",
       &type_counters::recovered},
      {"jobrt_jobs_unhandled_total",
       "Jobs this process handed back unstarted, having no handler for their type (another worker runs them).",
       &type_counters::unhandled},
      {"jobrt_jobs_cancelled_total",
       "Runs this process ended, or jobs it did not start, because their job was cancelled.",
       &type_counters::cancelled},
  };
  for (const auto& c : per_type) {
    family(out, c.name, "counter", c.help);
    for (const auto& q : queues) {
      std::map<std::string, std::uint64_t> sums;
      for (const auto& w : q.workers)
        for (const auto& [type, t] : w.by_type) sums[type] += t.*c.field;
      for (const auto& [type, n] : sums)
        out += fmt::format("{}{{queue=\"{}\",type=\"{}\"}} {}\n", c.name, label(q.queue), label(type), n);
    }
  }
  struct total {
    const char* name;
    const char* type;
    const char* help;
    std::uint64_t worker_counters::*field;
  };
  const total totals[] = {
      {"jobrt_leases_lost_total", "counter", "Leases found lost (their handlers cancelled, if running).",
       &worker_counters::leases_lost},
      {"jobrt_lease_renewals_total", "counter", "Watchdog calls that renewed this process's leases.",
       &worker_counters::renewals},
      {"jobrt_delayed_promoted_total", "counter", "Delayed entries this process's promoters moved.",
       &worker_counters::promoted},
      {"jobrt_jobs_released_total", "counter",
       "Leased jobs handed back unstarted: at stop, or when a lease's local end came first.",
       &worker_counters::released},
  };
  for (const auto& t : totals) {
    family(out, t.name, t.type, t.help);
    for (const auto& q : queues) {
      std::uint64_t n = 0;
      for (const auto& w : q.workers) n += w.totals.*(t.field);
      out += fmt::format("{}{{queue=\"{}\"}} {}\n", t.name, label(q.queue), n);
    }
  }
  family(out, "jobrt_jobs_in_flight", "gauge", "Jobs this process holds now.");
  for (const auto& q : queues) {
    std::size_t n = 0;
    for (const auto& w : q.workers) n += w.in_flight;
    out += fmt::format("jobrt_jobs_in_flight{{queue=\"{}\"}} {}\n", label(q.queue), n);
  }
  family(out, "jobrt_job_run_seconds", "histogram", "Handler run time.");
  for (const auto& q : queues)
    histogram_lines(out, "jobrt_job_run_seconds", fmt::format("queue=\"{}\"", label(q.queue)),
                    merged(q.workers, &worker_metrics::run_seconds));
  family(out, "jobrt_job_pickup_seconds", "histogram", "From enqueue to the start of a job's first run.");
  for (const auto& q : queues)
    histogram_lines(out, "jobrt_job_pickup_seconds", fmt::format("queue=\"{}\"", label(q.queue)),
                    merged(q.workers, &worker_metrics::pickup_seconds));
  struct gauge {
    const char* name;
    const char* help;
    std::int64_t queue_counts::*field;
  };
  const gauge depth[] = {
      {"jobrt_queue_ready_lanes", "Lanes (ungrouped jobs and groups with work) ready to run.",
       &queue_counts::ready_lanes},
      {"jobrt_queue_running", "Jobs running under a lease, in every process.", &queue_counts::running},
      {"jobrt_queue_delayed", "Delayed jobs and groups waiting for a retry.", &queue_counts::delayed},
      {"jobrt_queue_paused_groups", "Paused or halted groups.", &queue_counts::paused},
      {"jobrt_queue_groups_active", "Groups with jobs, pending or running.", &queue_counts::groups},
      {"jobrt_queue_dead", "Dead letters.", &queue_counts::dead},
  };
  for (const auto& g : depth) {
    family(out, g.name, "gauge", fmt::format("{} Queue-wide.", g.help));
    for (const auto& q : queues)
      if (q.counts) out += fmt::format("{}{{queue=\"{}\"}} {}\n", g.name, label(q.queue), (*q.counts).*g.field);
  }
  family(out, "jobrt_queue_latency_seconds", "gauge",
         "How long the job at the head of the ready list (the next to start) has waited; 0 when nothing is "
         "ready. Queue-wide.");
  auto now_ms = detail::unix_ms();
  for (const auto& q : queues) {
    if (!q.counts) continue;
    auto at = q.counts->next_enqueued_ms;
    double age = at > 0 ? static_cast<double>(std::max<std::int64_t>(0, now_ms - at)) / 1000.0 : 0.0;
    out += fmt::format("jobrt_queue_latency_seconds{{queue=\"{}\"}} {}\n", label(q.queue), age);
  }
  family(out, "jobrt_queue_recovered_total", "counter",
         "Expired leases recovered in this queue, by any process. Queue-wide.");
  for (const auto& q : queues)
    if (q.counts)
      out += fmt::format("jobrt_queue_recovered_total{{queue=\"{}\"}} {}\n", label(q.queue), q.counts->recovered);
  family(out, "jobrt_build_info", "gauge", "Always 1; its labels name the build.");
  out += fmt::format("jobrt_build_info{{version=\"{}\"}} 1\n", label(version()));
  process_lines(out);
  return out;
}

struct metrics_server::state {
  explicit state(asio::any_io_executor ex, const tcp::endpoint& at, render_fn render)
      : listener(std::move(ex), at, answer(std::move(render)), "metrics") {}

  static detail::http_listener::handler answer(render_fn render) {
    return [render = std::move(render)](beast::tcp_stream& stream, detail::http_listener::request& req) {
      return respond(render, stream, req);
    };
  }

  static asio::awaitable<bool> respond(const render_fn& render, beast::tcp_stream& stream,
                                       detail::http_listener::request& req) {
    http::response<http::string_body> res;
    res.version(req.version());
    res.keep_alive(req.keep_alive());
    if (req.target() != "/metrics") {
      res.result(http::status::not_found);
      res.set(http::field::content_type, "text/plain");
      res.body() = "jobrt serves only GET /metrics\n";
    } else if (req.method() != http::verb::get) {
      res.result(http::status::method_not_allowed);
      res.set(http::field::allow, "GET");
      res.set(http::field::content_type, "text/plain");
      res.body() = "jobrt: /metrics takes GET\n";
    } else {
      std::string body;
      try {
        body = co_await render();
        res.result(http::status::ok);
      } catch (const std::exception& e) {
        res.result(http::status::internal_server_error);
        body = fmt::format("jobrt: metrics failed: {}\n", e.what());
      }
      res.set(http::field::content_type, "text/plain; version=0.0.4");
      res.body() = std::move(body);
    }
    res.prepare_payload();
    auto [wec, written] = co_await http::async_write(stream, res, asio::as_tuple(asio::use_awaitable));
    co_return !wec && res.keep_alive();
  }

  detail::http_listener listener;
};

metrics_server::metrics_server(asio::any_io_executor ex, const tcp::endpoint& at, render_fn render)
    : state_(std::make_shared<state>(std::move(ex), at, std::move(render))) {}

metrics_server::~metrics_server() { stop(); }

tcp::endpoint metrics_server::local_endpoint() const { return state_->listener.local_endpoint(); }

void metrics_server::start() { state_->listener.start(); }

void metrics_server::stop() { state_->listener.stop(); }

asio::awaitable<void> metrics_server::async_stop() { co_await state_->listener.async_stop(); }

tcp::endpoint parse_listen_address(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument(fmt::format("listen address '{}' has no :PORT", text));
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "127.0.0.1";
  unsigned short port = 0;
  auto digits = std::string_view(text).substr(colon + 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc{} || end != digits.data() + digits.size())
    throw std::invalid_argument(
        fmt::format("listen address '{}': port '{}' is not a number up to 65535", text, digits));
  boost::system::error_code aec;
  auto address = asio::ip::make_address(host, aec);
  if (aec) throw std::invalid_argument(fmt::format("listen address '{}': '{}' is not an IP address", text, host));
  return {address, port};
}

}  // namespace jobrt
