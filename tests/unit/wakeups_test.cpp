#include "backend/wakeups.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>

using jobrt::detail::wakeups;

TEST_CASE("wakeups: a bump's message is found after the version a waiter read, by its key") {
  auto w = std::make_shared<wakeups>();
  w->bump("ended", "early|c1:0:");  // before the waiter read the version: not its news
  auto seen = w->version("ended");
  CHECK_FALSE(w->said_since("ended", seen, "early"));
  w->bump("ended", "a|c5:0:");
  w->bump("ended");  // (a wake-up that said nothing)
  w->bump("ended", "ab|c6:0:");
  CHECK(w->said_since("ended", seen, "a") == std::string("a|c5:0:"));
  CHECK(w->said_since("ended", seen, "ab") == std::string("ab|c6:0:"));
  CHECK_FALSE(w->said_since("ended", seen, "b"));
  CHECK(w->said_since("ended", seen, "a") == std::string("a|c5:0:"));  // (not "ab|...")
  CHECK_FALSE(w->said_since("ended", w->version("ended"), "ab"));      // nothing after now
  CHECK_FALSE(w->said_since("delayed", 0, "a"));                       // another name's
  w->bump("ended", "a|k9:0:");                                         // the newest of two about one key
  CHECK(w->said_since("ended", seen, "a") == std::string("a|k9:0:"));
  w->bump("ended", "a");  // the newest says only the key
  CHECK(w->said_since("ended", seen, "a") == std::string("a"));
}

TEST_CASE("wakeups: only the last 16 messages are kept, and a bump of all says nothing") {
  auto w = std::make_shared<wakeups>();
  auto seen = w->version("ended");
  for (int i = 0; i < 20; ++i) w->bump("ended", std::to_string(i) + "|c");
  CHECK_FALSE(w->said_since("ended", seen, "3"));  // pushed out
  CHECK(w->said_since("ended", seen, "4") == std::string("4|c"));
  CHECK(w->said_since("ended", seen, "19") == std::string("19|c"));
  seen = w->version("ended");
  w->bump_all();  // (missed wake-ups: the version moves, and no message is found for it)
  CHECK(w->version("ended") != seen);
  // Version 21's slot holds version 5's message ("4|c"): not news after version 20.
  CHECK_FALSE(w->said_since("ended", seen, "4"));
  CHECK_FALSE(w->said_since("ended", seen - 16, "4"));  // (nor after 4: pushed out)
}
