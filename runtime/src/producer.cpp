#include <jobrt/producer.hpp>

#include "backend/job_codec.hpp"
#include "clock.hpp"

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <set>

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>

namespace jobrt {

job_spec job_spec_from_json(const boost::json::value& v) {
  if (!v.is_object()) throw std::invalid_argument("not a JSON object");
  auto& o = v.as_object();
  job_spec s;
  auto text = [&](std::string_view name) -> std::optional<std::string> {
    auto* f = o.if_contains(name);
    if (!f) return std::nullopt;
    if (!f->is_string()) throw std::invalid_argument(fmt::format("\"{}\" is not a string", name));
    return std::string(f->as_string());
  };
  auto number_of = [&](std::string_view name) -> std::optional<std::int64_t> {
    auto* f = o.if_contains(name);
    if (!f) return std::nullopt;
    if (!f->is_int64() || f->as_int64() < 0)
      throw std::invalid_argument(fmt::format("\"{}\" is not a non-negative integer", name));
    return f->as_int64();
  };
  for (auto& [key, value] : o) {
    static const std::set<std::string_view> known{
        "type",       "payload", "group",          "id",         "delay_ms",          "max_attempts", "timeout_ms",
        "on_failure", "keep_ms", "max_group_size", "group_rate", "group_concurrency", "group_weight", "priority"};
    if (!known.contains(key)) throw std::invalid_argument(fmt::format("unknown field \"{}\"", key));
  }
  s.type = text("type").value_or("");
  if (auto* p = o.if_contains("payload")) s.payload = *p;
  s.group = text("group");
  s.id = text("id").value_or("");
  s.delay = std::chrono::milliseconds(number_of("delay_ms").value_or(0));
  s.max_attempts = static_cast<int>(number_of("max_attempts").value_or(3));
  s.timeout = std::chrono::milliseconds(number_of("timeout_ms").value_or(0));
  if (auto keep = number_of("keep_ms")) s.keep = std::chrono::milliseconds(*keep);
  if (auto max = number_of("max_group_size")) s.max_group_size = static_cast<std::size_t>(*max);
  if (auto* rate = o.if_contains("group_rate")) s.group_rate = rate_limit_from_json(*rate, "\"group_rate\"");
  if (auto n = number_of("group_concurrency")) s.group_concurrency = static_cast<std::size_t>(*n);
  if (auto w = number_of("group_weight")) s.group_weight = static_cast<std::size_t>(*w);
  if (auto p = text("on_failure")) s.on_failure = parse_failure_policy(*p);
  if (auto* p = o.if_contains("priority")) {
    if (!p->is_int64() || p->as_int64() < -max_priority || p->as_int64() > max_priority)
      throw std::invalid_argument(fmt::format("\"priority\" is {}; it must be a whole number from {} to {}",
                                              boost::json::serialize(*p), -max_priority, max_priority));
    s.priority = static_cast<int>(p->as_int64());
  }
  return s;
}

boost::json::object to_json(const job_spec& s) {
  boost::json::object o;
  o["type"] = s.type;
  if (!s.payload.is_null()) o["payload"] = s.payload;
  if (s.group) o["group"] = *s.group;
  if (!s.id.empty()) o["id"] = s.id;
  if (s.delay.count() > 0) o["delay_ms"] = s.delay.count();
  o["max_attempts"] = s.max_attempts;
  if (s.timeout.count() > 0) o["timeout_ms"] = s.timeout.count();
  if (s.on_failure) o["on_failure"] = to_string(*s.on_failure);
  if (s.keep) o["keep_ms"] = s.keep->count();
  if (s.max_group_size) o["max_group_size"] = *s.max_group_size;
  if (s.group_rate) o["group_rate"] = {{"max", s.group_rate->max}, {"window_ms", s.group_rate->window.count()}};
  if (s.group_concurrency) o["group_concurrency"] = *s.group_concurrency;
  if (s.group_weight) o["group_weight"] = *s.group_weight;
  if (s.priority != 0) o["priority"] = s.priority;
  return o;
}

void check_queue_name(std::string_view queue) {
  if (queue.empty()) throw std::invalid_argument("queue name is empty");
  if (queue.find_first_of("{}") != std::string_view::npos)
    throw std::invalid_argument(
        fmt::format("queue name '{}' holds '{{' or '}}', which would break its keys' hash tag", queue));
  auto hash = queue.rfind('#');
  if (hash != std::string_view::npos && hash + 1 < queue.size() &&
      queue.find_first_not_of("0123456789", hash + 1) == std::string_view::npos)
    throw std::invalid_argument(fmt::format("queue name '{}' ends in '#' and digits, which name a shard of queue '{}'",
                                            queue, queue.substr(0, hash)));
}

producer::producer(backend& b, std::string queue, producer_options opts)
    : backend_(&b), queue_(std::move(queue)), opts_(std::move(opts)) {
  check_queue_name(queue_);
  if (opts_.batch == 0) throw std::invalid_argument("producer batch size is 0");
}

boost::json::value producer::parse_payload(std::string_view text) {
  boost::system::error_code ec;
  auto value = boost::json::parse(text, ec);
  if (ec) throw std::invalid_argument(fmt::format("payload is not JSON: {} (in '{:.60}')", ec.message(), text));
  return value;
}

void producer::check(const job_spec& spec) {
  if (spec.type.empty()) throw std::invalid_argument("job type is empty");
  if (auto problem = detail::id_refusal(spec.id); !problem.empty()) throw std::invalid_argument(problem);
  if (spec.max_attempts < 1)
    throw std::invalid_argument(fmt::format("job max_attempts is {}; it must be at least 1", spec.max_attempts));
  if (spec.timeout.count() < 0 || spec.timeout > max_job_timeout)
    throw std::invalid_argument(
        fmt::format("job timeout is {} ms; it must be from 0 (none) to a year", spec.timeout.count()));
  if (spec.delay.count() < 0) throw std::invalid_argument("job delay is negative");
  if (spec.keep && (spec.keep->count() < 0 || *spec.keep > max_job_keep))
    throw std::invalid_argument(
        fmt::format("job keep is {} ms; it must be from 0 (none) to a year", spec.keep->count()));
  if (spec.run_at && spec.delay.count() > 0) throw std::invalid_argument("job has both a delay and a run_at time");
  if (spec.retry_backoff) {
    const auto& b = *spec.retry_backoff;
    if (b.initial.count() < 0 || b.max.count() < 0 || b.factor < 1.0 || b.jitter < 0.0 || b.jitter > 1.0)
      throw std::invalid_argument("job backoff needs initial >= 0, max >= 0, factor >= 1 and jitter in [0, 1]");
  }
  // The backend keeps due times in 15 digits (Redis scores are doubles, exact to 2^53).
  constexpr std::int64_t latest = 999'999'999'999'999;  // ms: some 31,000 years
  if (spec.delay.count() > latest)
    throw std::invalid_argument(fmt::format("job delay is {} ms; the longest is {}", spec.delay.count(), latest));
  if (spec.run_at) {
    auto at = std::chrono::duration_cast<std::chrono::milliseconds>(spec.run_at->time_since_epoch()).count();
    if (at > latest)
      throw std::invalid_argument(fmt::format("job run_at is {} ms since the epoch; the latest is {}", at, latest));
  }
  if (spec.group && spec.group->empty())
    throw std::invalid_argument("job group is empty (leave it unset for no group)");
  if (spec.max_group_size && (*spec.max_group_size < 1 || *spec.max_group_size > max_group_size_limit))
    throw std::invalid_argument(
        fmt::format("job max_group_size is {}; it must be from 1 to {} (leave it unset for none)", *spec.max_group_size,
                    max_group_size_limit));
  if (spec.group_rate) check_rate_limit(*spec.group_rate, "job group_rate");
  if (spec.group_concurrency) check_group_concurrency(*spec.group_concurrency, "job group_concurrency");
  if (spec.group_weight) check_group_weight(*spec.group_weight, "job group_weight");
  if (spec.priority < -max_priority || spec.priority > max_priority)
    throw std::invalid_argument(
        fmt::format("job priority is {}; it must be from {} to {}", spec.priority, -max_priority, max_priority));
}

void producer::check(const job_spec& spec, const producer_options& opts) {
  auto now_ms = detail::unix_ms();
  encode(spec, now_ms, opts);
}

encoded_job producer::encode(const job_spec& spec, std::int64_t now_ms, const producer_options& opts) {
  check(spec);
  encoded_job out;
  out.id = spec.id;
  out.delay_ms = spec.delay.count();
  if (spec.run_at)
    out.run_at_ms = std::max<std::int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(spec.run_at->time_since_epoch()).count());
  std::optional<group_choice> choice;
  if (!spec.group) choice = opts.rules.choose(spec.type, spec.payload);
  // The rule's policy travels with the job, unless the job names its own.
  auto policy = spec.on_failure ? spec.on_failure : choice ? choice->on_failure : std::nullopt;
  auto keep = spec.keep.value_or(opts.keep);
  if (keep.count() < 0 || keep > max_job_keep)
    throw std::invalid_argument(
        fmt::format("producer keep is {} ms; it must be from 0 (none) to a year", keep.count()));
  if (spec.group) {
    out.group = *spec.group;
  } else if (choice) {
    out.group = std::move(choice->group);
  }
  // A group's rate limit and concurrency travel with its jobs: a job applies them while it is
  // its group's next.
  std::optional<rate_limit> rate;
  std::size_t concurrency = 1, weight = 1;
  if (!out.group.empty()) {
    rate = spec.group_rate ? spec.group_rate : choice && choice->rate ? choice->rate : opts.group_rate;
    if (rate && !spec.group_rate) check_rate_limit(*rate, "producer group_rate");
    concurrency = spec.group_concurrency          ? *spec.group_concurrency
                  : choice && choice->concurrency ? *choice->concurrency
                                                  : opts.group_concurrency;
    if (!spec.group_concurrency) check_group_concurrency(concurrency, "producer group_concurrency");
    weight = spec.group_weight ? *spec.group_weight : choice && choice->weight ? *choice->weight : opts.group_weight;
    if (!spec.group_weight) check_group_weight(weight, "producer group_weight");
  }
  out.body = detail::encode_body(spec, now_ms, policy, keep, rate, concurrency, weight);
  if (out.body.size() > opts.max_body_bytes)
    throw std::invalid_argument(fmt::format("job of type '{}' is {} bytes encoded; the limit is {}", spec.type,
                                            out.body.size(), opts.max_body_bytes));
  if (!out.group.empty()) {
    auto max = spec.max_group_size                ? *spec.max_group_size
               : choice && choice->max_group_size ? *choice->max_group_size
                                                  : opts.max_group_size;
    out.max_group_size = static_cast<std::int64_t>(std::min(max, max_group_size_limit));
  }
  return out;
}

boost::asio::awaitable<enqueue_result> producer::enqueue(job_spec spec) {
  std::vector<job_spec> one;
  one.push_back(std::move(spec));
  auto results = co_await enqueue_bulk(std::move(one));
  co_return results.at(0);
}

boost::asio::awaitable<std::vector<enqueue_result>> producer::enqueue_bulk(std::vector<job_spec> specs) {
  auto now_ms = detail::unix_ms();
  std::vector<encoded_job> encoded;
  encoded.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    try {
      encoded.push_back(encode(specs[i], now_ms, opts_));
    } catch (const std::invalid_argument& e) {
      if (specs.size() == 1) throw;
      throw std::invalid_argument(fmt::format("job {} of {}: {}", i + 1, specs.size(), e.what()));
    }
  }
  co_return co_await enqueue_encoded(std::move(encoded));
}

boost::asio::awaitable<std::vector<enqueue_result>> producer::enqueue_encoded(std::vector<encoded_job> encoded) {
  // A backend that splits a batch (over a queue's shards) gets as many batches in one call.
  auto per_call = opts_.batch;
  if (encoded.size() > per_call) per_call *= std::max<std::size_t>(1, co_await backend_->shard_count(queue_));
  std::vector<enqueue_result> results;
  results.reserve(encoded.size());
  for (std::size_t first = 0; first < encoded.size(); first += per_call) {
    auto last = std::min(encoded.size(), first + per_call);
    std::vector<encoded_job> batch(std::make_move_iterator(encoded.begin() + static_cast<std::ptrdiff_t>(first)),
                                   std::make_move_iterator(encoded.begin() + static_cast<std::ptrdiff_t>(last)));
    std::vector<enqueue_result> part;
    try {
      part = co_await backend_->enqueue_parts(queue_, std::move(batch), opts_.batch);
    } catch (const std::exception& e) {
      if (first == 0) throw;  // the first batch: the backend's error tells it all, as for enqueue
      std::throw_with_nested(partial_enqueue(
          fmt::format("enqueue_bulk on queue '{}': jobs 1 to {} of {} are stored; the batch after them failed ({}) "
                      "and the rest were not sent",
                      queue_, first, encoded.size(), e.what()),
          std::move(results)));
    }
    results.insert(results.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  co_return results;
}

boost::asio::awaitable<std::optional<job_status>> producer::wait(std::string id, std::chrono::milliseconds timeout) {
  co_return co_await wait_job(*backend_, queue_, std::move(id), timeout);
}

boost::asio::awaitable<waited_job> producer::enqueue_and_wait(job_spec spec, std::chrono::milliseconds timeout) {
  bool fresh = spec.id.empty() && spec.keep.value_or(opts_.keep).count() > 0;
  auto since = backend_->ended_version(queue_);  // (read before the job is stored: its end moves it)
  waited_job out;
  out.enqueued = co_await enqueue(std::move(spec));
  std::optional<std::uint64_t> after;
  if (fresh && !out.enqueued.duplicate) after = since;
  out.end = co_await wait_job(*backend_, queue_, out.enqueued.id, timeout, after);
  co_return out;
}

boost::asio::awaitable<cancel_outcome> producer::cancel(std::string id) {
  co_return co_await backend_->cancel(queue_, std::move(id));
}

}  // namespace jobrt
