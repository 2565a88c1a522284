#include "backend/wakeups.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>

using jobrt::detail::wakeups;

TEST_CASE("wakeups: a bump's message is found after the version a waiter read, by its key") {
  auto w = std::make_shared<wakeups>();
  w->bump("ended", "early|c1:0:");  // before the waiter read the version: not its news
  auto seen = w->version("ended");
  CHECK_FALSE(w->said_since("ended", seen, "early").said);
  w->bump("ended", "a|c5:0:");
  w->bump("ended");  // (a wake-up that said nothing)
  w->bump("ended", "ab|c6:0:");
  CHECK(w->said_since("ended", seen, "a").said == std::string("a|c5:0:"));
  CHECK(w->said_since("ended", seen, "ab").said == std::string("ab|c6:0:"));
  CHECK_FALSE(w->said_since("ended", seen, "b").said);
  CHECK(w->said_since("ended", seen, "a").said == std::string("a|c5:0:"));  // (not "ab|...")
  CHECK_FALSE(w->said_since("ended", w->version("ended"), "ab").said);      // nothing after now
  CHECK_FALSE(w->said_since("delayed", 0, "a").said);                       // another name's
  w->bump("ended", "a|k9:0:");                                              // the newest of two about one key
  CHECK(w->said_since("ended", seen, "a").said == std::string("a|k9:0:"));
  w->bump("ended", "a");  // the newest says only the key
  CHECK(w->said_since("ended", seen, "a").said == std::string("a"));
}

TEST_CASE("wakeups: only the last said_kept messages are kept, and a bump of all says nothing") {
  auto w = std::make_shared<wakeups>();
  auto seen = w->version("ended");
  for (int i = 0; i < 68; ++i) w->bump("ended", std::to_string(i) + "|c");
  CHECK_FALSE(w->said_since("ended", seen, "3").said);  // pushed out
  CHECK(w->said_since("ended", seen, "4").said == std::string("4|c"));
  CHECK(w->said_since("ended", seen, "19").said == std::string("19|c"));
  seen = w->version("ended");
  w->bump_all();  // (missed wake-ups: the version moves, and no message is found for it)
  CHECK(w->version("ended") != seen);
  // Version 69's slot holds version 5's message ("4|c"): not news after version 68.
  CHECK_FALSE(w->said_since("ended", seen, "4").said);
  CHECK_FALSE(w->said_since("ended", seen - 64, "4").said);  // (nor after 4: pushed out)
}

TEST_CASE("wakeups: a waiter can tell that every message since it looked is kept and none is its own") {
  auto w = std::make_shared<wakeups>();
  auto seen = w->version("ended");
  w->bump("ended", "1|c");
  w->bump("ended", "2|c");
  auto heard = w->said_since("ended", seen, "3");
  CHECK_FALSE(heard.said);
  CHECK(heard.all_kept);
  CHECK(heard.version == seen + 2);
  w->bump("ended");  // (one that said nothing: a subscription's notice, say)
  heard = w->said_since("ended", seen, "3");
  CHECK_FALSE(heard.all_kept);
  CHECK(w->said_since("ended", seen + 3, "3").all_kept);  // (nothing after it)
  seen = w->version("ended");
  for (std::size_t i = 0; i < wakeups::said_kept + 1; ++i) w->bump("ended", "x|c");
  CHECK_FALSE(w->said_since("ended", seen, "3").all_kept);  // one was pushed out
  CHECK(w->said_since("ended", seen + 1, "3").all_kept);
  CHECK_FALSE(w->said_since("delayed", 0, "3").all_kept);  // (a name never bumped: none kept)
}
