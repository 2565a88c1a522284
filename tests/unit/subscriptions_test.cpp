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
  using kind = detail::channel_kind;
  subscriptions s;
  auto first = s.change(names({"a", "b"}), kind::channel, true);
  REQUIRE(first.size() == 1);
  CHECK(std::string(first[0].name) == "SUBSCRIBE");
  CHECK(first[0].names == names({"a", "b"}));
  auto again = s.change(names({"b", "c"}), kind::channel, true);
  REQUIRE(again.size() == 1);
  CHECK(again[0].names == names({"c"}));                         // b was held already
  CHECK(s.change(names({"a"}), kind::channel, true).empty());    // nothing new: nothing to send
  CHECK(s.change(names({"zz"}), kind::channel, false).empty());  // not held: nothing to send
  auto p = s.change(names({"jobs:*"}), kind::pattern, true);
  REQUIRE(p.size() == 1);
  CHECK(std::string(p[0].name) == "PSUBSCRIBE");
  auto gone = s.change(names({"a"}), kind::channel, false);
  REQUIRE(gone.size() == 1);
  CHECK(std::string(gone[0].name) == "UNSUBSCRIBE");
  // Shard channels: one command each (a cluster wants one slot a command), never unsubscribed.
  auto shards = s.change(names({"{q}:x", "{r}:x"}), kind::shard, true);
  REQUIRE(shards.size() == 2);
  CHECK(std::string(shards[0].name) == "SSUBSCRIBE");
  CHECK(shards[1].names == names({"{r}:x"}));
  CHECK(s.change(names({"{q}:x"}), kind::shard, false).empty());

  auto all = s.resubscribe();
  REQUIRE(all.size() == 4);
  CHECK(std::string(all[0].name) == "SUBSCRIBE");
  CHECK(all[0].names == names({"b", "c"}));
  CHECK(std::string(all[1].name) == "PSUBSCRIBE");
  CHECK(all[1].names == names({"jobs:*"}));
  CHECK(std::string(all[2].name) == "SSUBSCRIBE");
  CHECK(all[3].names == names({"{r}:x"}));

  s.forget(names({"b", "c"}), kind::channel);  // refused by the server
  s.forget(names({"{q}:x", "{r}:x"}), kind::shard);
  all = s.resubscribe();
  REQUIRE(all.size() == 1);
  CHECK(all[0].kind == kind::pattern);
  CHECK(subscriptions().resubscribe().empty());
}

TEST_CASE("subscriptions: pushes become messages, other replies do not") {
  subscriptions s;
  auto m = reply::make_array({bulk("message"), bulk("ch"), bulk("hello")});
  auto got = s.from_push(m);
  REQUIRE(got);
  CHECK(got->channel == "ch");
  CHECK(got->payload == "hello");
  CHECK(got->pattern.empty());
  CHECK_FALSE(got->confirmation);
  CHECK_FALSE(got->dropped);

  auto pm = reply::make_array({bulk("pmessage"), bulk("jobs:*"), bulk("jobs:1"), bulk("x")});
  got = s.from_push(pm);
  REQUIRE(got);
  CHECK(got->pattern == "jobs:*");
  CHECK(got->channel == "jobs:1");

  auto sm = reply::make_array({bulk("smessage"), bulk("{q}:x"), bulk("5")});
  got = s.from_push(sm);
  REQUIRE(got);
  CHECK(got->channel == "{q}:x");
  CHECK(got->payload == "5");

  auto confirm = reply::make_array({bulk("subscribe"), bulk("ch"), reply::make_integer(1)});
  CHECK_FALSE(s.from_push(confirm));
  auto short_one = reply::make_array({bulk("message"), bulk("ch")});
  CHECK_FALSE(s.from_push(short_one));
  auto not_array = bulk("message");
  CHECK_FALSE(s.from_push(not_array));
}

TEST_CASE(
    "subscriptions: a shard channel the server drops becomes a notice, no longer held, and kept through an overflow") {
  using kind = detail::channel_kind;
  subscriptions s;
  s.change(names({"{q}:x"}), kind::shard, true);
  // Its reply to our SSUBSCRIBE is not a push; the server's sunsubscribe (the slot moved) is.
  auto confirm = reply::make_array({bulk("ssubscribe"), bulk("{q}:x"), reply::make_integer(1)});
  CHECK_FALSE(s.from_push(confirm));
  auto dropped = reply::make_array({bulk("sunsubscribe"), bulk("{q}:x"), reply::make_integer(0)});
  auto got = s.from_push(dropped);
  REQUIRE(got);
  CHECK(got->dropped);
  CHECK(got->channel == "{q}:x");
  CHECK(s.resubscribe().empty());  // a reconnect does not subscribe again where it is not served
  // A notice of a dropped channel is kept even past the limit, like a confirmation.
  message d{"{q}:x", {}, {}, false};
  d.dropped = true;
  for (int i = 0; i < 3; ++i) s.queue(message{"c", "x", {}, false}, 3);
  CHECK(s.queue(d, 3) == 0);
  // And an overflow after it drops the messages, not the notice: it comes first, then one
  // confirmation for the messages dropped.
  CHECK(s.queue(message{"c", "y", {}, false}, 3) == 4);  // the 3 queued before, and this one
  auto first = s.next();
  REQUIRE(first);
  CHECK(first->dropped);
  CHECK(first->channel == "{q}:x");
  auto second = s.next();
  REQUIRE(second);
  CHECK(second->confirmation);
  CHECK_FALSE(s.next());
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
