// How a job is stored, known to the backends only: the record '<attempts before>|<id>|<body>',
// split into a job_record when a backend hands a job out. The body is a JSON object: first
// "keep" (ms), "rate" ([max, window ms]), "conc" and "weight" (above 1) when set, then "type", "payload", and when not
// default "max" (3), "timeout", "u" (the producer gave the id), "backoff" ([initial ms, factor,
// max ms, jitter]), "policy" ("hold", "skip", "halt"); last "at" (enqueue time, ms since the
// epoch). docs/PROTOCOL.md describes it for other languages.
#pragma once

#include <jobrt/backend.hpp>
#include <jobrt/job.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace jobrt::detail {

/// A record that cannot be decoded; what() says which part is wrong.
class bad_record : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The body of a job (without the record's header); `policy` is the failure policy it carries,
/// `keep` how long its status is kept after it completes (0: not kept, no "keep" field), `rate`
/// its group's rate limit (a "rate" field, after the keep), `concurrency` how many of its
/// group's jobs may run at once (a "conc" field after those, only when above 1), `weight` its
/// group's weight (a "weight" field after the concurrency, only when above 1).
std::string encode_body(const job_spec& spec, std::int64_t now_ms, std::optional<failure_policy> policy,
                        std::chrono::milliseconds keep = {}, std::optional<rate_limit> rate = {},
                        std::size_t concurrency = 1, std::size_t weight = 1);

/// A record split into its parts; a record without a readable header says why in `malformed`.
job_record split_record(std::string_view record);

/// Decodes a well-formed job of the given group ("" for none). Throws bad_record.
job decode(const job_record& r, std::string_view group);

/// The attempts before that a record's header counts, or -1 when it has no readable header.
std::int64_t attempts_before(std::string_view record) noexcept;

/// A record's enqueue time (the first "at": followed by digits, as the scripts read it); 0 when
/// it has none.
std::int64_t enqueued_at(std::string_view record) noexcept;

/// The id as the scripts read it (string.match(record, '^%d+|([^|]*)|')): "" unless the record
/// starts with its attempts and has its id's closing '|'.
std::string_view script_id(std::string_view record) noexcept;

/// The id in a record when the producer gave it, else "": what a failure releases from the
/// queue's set of ids, read as far as a record that does not decode allows. See assigned_id.
std::string producer_id(const job_record& r);

/// Whether `id` is one the queue assigns: all digits (enqueue refuses such ids from producers).
/// Any other id is the producer's, and so is one whose body says "u" (records written before
/// enqueue checked ids).
bool assigned_id(std::string_view id) noexcept;

/// What enqueue.lua refuses of a producer's id, in its words: a '|', all digits (see
/// assigned_id), white space at either end. "" when the id passes ("" itself does: assigned).
std::string id_refusal(std::string_view id);

/// What enqueue refuses of the i-th job's due time (counted from 0): a negative delay_ms or
/// run_at_ms, or one of over 15 digits (the most Lua holds exactly). "" when it passes.
std::string due_refusal(const encoded_job& job, std::size_t i);

/// What enqueue.lua refuses of a body, in its words: a "max" (attempts) below 1 or not whole.
/// "" when the body passes.
std::string body_refusal(std::string_view body);

/// enqueue.lua's refusal of a batch whose job i (counted from 0) of n would make `group` hold
/// `count` jobs, over its `max`, in its words.
std::string group_full_message(std::string_view group, std::int64_t count, std::int64_t max, std::size_t i,
                               std::size_t n);

}  // namespace jobrt::detail
