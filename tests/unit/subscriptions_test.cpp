// A subscriber's pub/sub state: what it sends, what it makes of pushes, what it keeps. No server.
#include "redis/subscriptions.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace jobrt::redis;
using detail::subscriptions;

namespace {
reply bulk(std::string s) { return reply::make_string(std::move(s)); }
std::vector<std::string> names(std::initializer_list<const char*> l) { return {l.begin(), l.end()}; }
}  // namespace

TEST_CASE("subscriptions: only names that change are sent, and a reconnect sends all that are held") {
  subscriptions s;
  auto first = s.change(names({"a", "b"}), false, true);
  REQUIRE(first);
  CHECK(std::string(first->name) == "SUBSCRIBE");
  CHECK(first->names == names({"a", "b"}));
  auto again = s.change(names({"b", "c"}), false, true);
  REQUIRE(again);
  CHECK(again->names == names({"c"}));                 // b was held already
  CHECK_FALSE(s.change(names({"a"}), false, true));    // nothing new: nothing to send
  CHECK_FALSE(s.change(names({"zz"}), false, false));  // not held: nothing to send
  auto p = s.change(names({"jobs:*"}), true, true);
  REQUIRE(p);
  CHECK(std::string(p->name) == "PSUBSCRIBE");
  auto gone = s.change(names({"a"}), false, false);
  REQUIRE(gone);
  CHECK(std::string(gone->name) == "UNSUBSCRIBE");

  auto all = s.resubscribe();
  REQUIRE(all.size() == 2);
  CHECK(std::string(all[0].name) == "SUBSCRIBE");
  CHECK(all[0].names == names({"b", "c"}));
  CHECK(std::string(all[1].name) == "PSUBSCRIBE");
  CHECK(all[1].names == names({"jobs:*"}));

  s.forget(names({"b", "c"}), false);  // refused by the server
  all = s.resubscribe();
  REQUIRE(all.size() == 1);
  CHECK(all[0].pattern);
  CHECK(subscriptions().resubscribe().empty());
}

TEST_CASE("subscriptions: pushes become messages, other replies do not") {
  auto m = reply::make_array({bulk("message"), bulk("ch"), bulk("hello")});
  auto got = subscriptions::from_push(m);
  REQUIRE(got);
  CHECK(got->channel == "ch");
  CHECK(got->payload == "hello");
  CHECK(got->pattern.empty());
  CHECK_FALSE(got->confirmation);

  auto pm = reply::make_array({bulk("pmessage"), bulk("jobs:*"), bulk("jobs:1"), bulk("x")});
  got = subscriptions::from_push(pm);
  REQUIRE(got);
  CHECK(got->pattern == "jobs:*");
  CHECK(got->channel == "jobs:1");

  auto confirm = reply::make_array({bulk("subscribe"), bulk("ch"), reply::make_integer(1)});
  CHECK_FALSE(subscriptions::from_push(confirm));
  auto short_one = reply::make_array({bulk("message"), bulk("ch")});
  CHECK_FALSE(subscriptions::from_push(short_one));
  auto not_array = bulk("message");
  CHECK_FALSE(subscriptions::from_push(not_array));
}

TEST_CASE("subscriptions: messages nobody received wait in order, and past the limit one notice stands for them") {
  subscriptions s;
  CHECK_FALSE(s.next());
  CHECK(s.queue(message{"c", "1", {}, false}, 3) == 0);
  CHECK(s.queue(message{"c", "2", {}, false}, 3) == 0);
  CHECK(s.next()->payload == "1");
  CHECK(s.queue(message{"c", "3", {}, false}, 3) == 0);
  CHECK(s.queue(message{"c", "4", {}, false}, 3) == 0);
  CHECK(s.queue(message{"c", "5", {}, false}, 3) == 4);  // 3 queued and this one: dropped
  auto notice = s.next();
  REQUIRE(notice);
  CHECK(notice->confirmation);
  CHECK_FALSE(s.next());
  for (int i = 0; i < 3; ++i) s.queue(message{"c", "x", {}, false}, 3);
  CHECK(s.queue(message{{}, {}, {}, true}, 3) == 0);  // a confirmation is always kept
}
