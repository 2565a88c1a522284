// Grouping rules: which jobs are grouped, and what their group key is, decided per job from its
// type and payload fields. A team that does not enable grouping keeps the ungrouped fast path.
//
// JSON form:
//   {"rules": [{"match": {"app": "crm"}, "key": "{entity}:{tenant}", "on_failure": "hold",
//               "max_group_size": 10000, "rate": {"max": 10, "window_ms": 1000},
//               "concurrency": 2, "weight": 4}]}
// A rule matches a job when every "match" entry equals the job's field ("type" is the job's
// type; other names are top-level payload fields; "*" means the field is present) and every
// field the key names is present. The first matching rule gives the group; none: ungrouped.
#pragma once

#include <jobrt/job.hpp>

#include <boost/json/value.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt {

struct grouping_rule {
  std::map<std::string, std::string> match;  ///< field → value, or "*" for any value
  std::string key;                           ///< template with {field} placeholders
  std::optional<failure_policy> on_failure;  ///< for the jobs this rule groups
  /// For the jobs this rule groups: the most jobs each of its groups may hold (job_spec::
  /// max_group_size). At least 1.
  std::optional<std::size_t> max_group_size;
  /// For the jobs this rule groups: each of its groups' rate limit (job_spec::group_rate).
  std::optional<rate_limit> rate;
  /// For the jobs this rule groups: how many of a group's jobs may run at once
  /// (job_spec::group_concurrency).
  std::optional<std::size_t> concurrency;
  /// For the jobs this rule groups: each of its groups' weight (job_spec::group_weight).
  std::optional<std::size_t> weight;
};

/// What the rules decide for a job.
struct group_choice {
  std::string group;
  std::optional<failure_policy> on_failure;
  std::optional<std::size_t> max_group_size;
  std::optional<rate_limit> rate;
  std::optional<std::size_t> concurrency;
  std::optional<std::size_t> weight;
};

/// A rate limit in JSON, {"max": 10, "window_ms": 1000}; throws std::invalid_argument naming
/// `where` and what is wrong (check_rate_limit's bounds).
rate_limit rate_limit_from_json(const boost::json::value& v, std::string_view where);

class grouping_rules {
 public:
  grouping_rules() = default;
  /// Adds a rule; throws std::invalid_argument when its key template or its rate is malformed.
  grouping_rules& add(grouping_rule rule);
  /// Parses the JSON form; throws std::invalid_argument naming the field that is wrong or unknown.
  static grouping_rules from_json(const boost::json::value& config);

  /// The group of a job, or nullopt when no rule matches. Throws std::invalid_argument when the
  /// matching rule makes an empty key (the job would silently lose its grouping).
  std::optional<std::string> group_for(std::string_view type, const boost::json::value& payload) const;
  /// As group_for, with the matching rule's failure policy.
  std::optional<group_choice> choose(std::string_view type, const boost::json::value& payload) const;
  bool empty() const noexcept { return rules_.empty(); }

 private:
  std::vector<grouping_rule> rules_;
};

}  // namespace jobrt
