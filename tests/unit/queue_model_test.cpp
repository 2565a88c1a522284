// The queue model without I/O: time is a variable the test moves, so leases expire and delayed
// jobs come due exactly when the test says.
#include "backend/queue_model.hpp"
#include "backend/views.hpp"

#include <jobrt/error.hpp>

#include <doctest/doctest.h>
#include <boost/system/system_error.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using jobrt::detail::queue_model;

namespace {

std::int64_t now_ms = 1'000'000;
std::int64_t test_clock() { return now_ms; }

std::vector<jobrt::encoded_job> one(std::string id, std::string group, std::int64_t delay_ms = 0) {
  std::vector<jobrt::encoded_job> jobs(1);
  jobs[0].id = std::move(id);
  jobs[0].group = std::move(group);
  jobs[0].body = R"({"type":"t"})";
  jobs[0].delay_ms = delay_ms;
  return jobs;
}

}  // namespace

TEST_CASE("queue model: a delayed job comes due, and an expired lease is recovered, on the model's clock") {
  now_ms = 1'000'000;
  queue_model m(test_clock);
  m.enqueue(one("later", "g", 500));
  CHECK(m.take_effects().earlier_due);  // the promoters are woken
  CHECK(m.promote(10).moved == 0);
  CHECK(m.promote(10).next_due == 500ms);
  now_ms += 500;
  CHECK(m.promote(10).moved == 1);
  CHECK(m.take_effects().made_ready == 1);  // one waiting claim is woken

  jobrt::claim_options co{"w", 1, 100ms};
  auto claimed = m.claim(co);
  REQUIRE(claimed.size() == 1);
  CHECK(claimed[0].job.id == "later");
  CHECK(claimed[0].job.attempts == 0);
  now_ms += 99;  // a millisecond before its deadline: still held
  CHECK(m.reap({}).leases == 0);
  now_ms += 1;  // at its deadline, as ZRANGEBYSCORE active -inf <now> finds it
  CHECK(m.reap({}).leases == 1);
  CHECK(m.take_effects().made_ready == 1);
  auto again = m.claim(co);
  REQUIRE(again.size() == 1);
  CHECK(again[0].job.attempts == 1);  // the lost run counts
  CHECK(again[0].fence > claimed[0].fence);
}

TEST_CASE("queue model: a refusal changes nothing and names its errc") {
  queue_model m(test_clock);
  auto jobs = one("ok", "");
  auto bad = one("1|2", "");
  jobs.push_back(bad[0]);
  try {
    m.enqueue(jobs);
    FAIL("accepted");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == jobrt::errc::bad_job_id);
  }
  CHECK(m.counts().enqueued == 0);
  CHECK_FALSE(m.has_ready());
  CHECK(m.take_effects().made_ready == 0);
}

TEST_CASE("a body's group weight is read where claim.lua reads it: after the header's fields, at most 100") {
  using jobrt::detail::weight_in_body;
  CHECK(weight_in_body(R"({"type":"t","payload":{}})") == 1);
  CHECK(weight_in_body(R"({"weight":4,"type":"t"})") == 4);
  CHECK(weight_in_body(R"({"keep":60000,"rate":[3,1000],"conc":2,"weight":7,"type":"t"})") == 7);
  CHECK(weight_in_body(R"({"keep":123456789012345678901234,"weight":3,"type":"t"})") == 3);  // (any digits, as '%d+')
  CHECK(weight_in_body(R"({"weight":250,"type":"t"})") == 100);                              // at most 100
  CHECK(weight_in_body(R"({"weight":1000,"type":"t"})") == 1);  // more than 3 digits: not seen
  CHECK(weight_in_body(R"({"weight":04,"type":"t"})") == 1);    // '[1-9]'
  CHECK(weight_in_body(R"({"type":"t","weight":4})") == 1);     // not in the header
  CHECK(weight_in_body(R"({"type":"t","payload":{"weight":4,"x":1}})") == 1);
  CHECK(weight_in_body(R"({"conc":2,"keep":5,"weight":4,"type":"t"})") == 1);  // fields out of order
}

TEST_CASE("a body's priority is read where enqueue.lua's level_of reads it: after the header's fields, -2 to 2") {
  using jobrt::detail::prio_in_body;
  CHECK(prio_in_body(R"({"type":"t","payload":{}})") == 0);
  CHECK(prio_in_body(R"({"prio":2,"type":"t"})") == 2);
  CHECK(prio_in_body(R"({"prio":-1,"type":"t"})") == -1);
  CHECK(prio_in_body(R"({"keep":60000,"rate":[3,1000],"conc":2,"weight":7,"prio":-2,"type":"t"})") == -2);
  CHECK(prio_in_body(R"({"keep":5,"prio":1,"type":"t"})") == 1);
  CHECK(prio_in_body(R"({"prio":3,"type":"t"})") == 0);  // out of range: not seen
  CHECK(prio_in_body(R"({"prio":0,"type":"t"})") == 0);
  CHECK(prio_in_body(R"({"prio":12,"type":"t"})") == 0);  // '%-?[12],'
  CHECK(prio_in_body(R"({"prio":+1,"type":"t"})") == 0);
  CHECK(prio_in_body(R"({"type":"t","prio":2})") == 0);  // not in the header
  CHECK(prio_in_body(R"({"type":"t","payload":{"prio":2,"x":1}})") == 0);
  CHECK(prio_in_body(R"({"prio":2,"weight":4,"type":"t"})") == 2);           // (what follows it is not read)
  CHECK(prio_in_body(R"({"weight":4,"keep":5,"prio":2,"type":"t"})") == 0);  // fields out of order
}
