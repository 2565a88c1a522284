// The handshake a connection sends, and what it makes of the answers: no server.
#include "redis/handshake.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace jobrt::redis;
using detail::handshake;

namespace {
reply ok() { return reply::make_string("OK", reply_kind::status); }
reply error(std::string text) { return reply::make_string(std::move(text), reply_kind::error); }
reply pong() { return reply::make_string("PONG", reply_kind::status); }
}  // namespace

TEST_CASE("handshake: the commands follow the config: AUTH, SELECT, CLIENT SETNAME only when asked for") {
  auto plain = config::from_url("redis://127.0.0.1:6379");
  plain.client_name.clear();
  handshake h(plain);
  CHECK(h.replies() == 2);
  CHECK(h.commands().payload() == "*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n*1\r\n$4\r\nPING\r\n");

  auto full = config::from_url("redis://alice:s3cret@127.0.0.1:6379/2");
  full.client_name = "w1";
  handshake all(full);
  CHECK(all.replies() == 5);
  auto payload = all.commands().payload();
  CHECK(payload.starts_with("*3\r\n$4\r\nAUTH\r\n$5\r\nalice\r\n$6\r\ns3cret\r\n"));
  CHECK(payload.find("$6\r\nSELECT\r\n$1\r\n2\r\n") != std::string::npos);
  CHECK(payload.find("$7\r\nSETNAME\r\n$2\r\nw1\r\n") != std::string::npos);
  CHECK(payload.ends_with("*1\r\n$4\r\nPING\r\n"));

  auto password_only = config::from_url("redis://:pw@127.0.0.1:6379");
  CHECK(handshake(password_only).replies() == 4);  // AUTH, CLIENT SETNAME (the default name), CLIENT ID, PING
  CHECK(handshake(password_only).commands().payload().starts_with("*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n"));
}

TEST_CASE("handshake: the answers say ready, denied or not ready, naming the command") {
  auto cfg = config::from_url("redis://alice:s3cret@127.0.0.1:6379/2");
  cfg.client_name.clear();
  handshake h(cfg);  // AUTH, SELECT, CLIENT ID, PING
  REQUIRE(h.replies() == 4);

  auto ready = h.check({ok(), ok(), reply::make_integer(42), pong()});
  CHECK(ready.failure == connect_failure::none);
  CHECK(ready.client_id == 42);

  auto wrongpass = h.check({error("WRONGPASS invalid username-password pair"), ok(), reply::make_integer(1), pong()});
  CHECK(wrongpass.failure == connect_failure::denied);
  CHECK(wrongpass.why == "AUTH refused: WRONGPASS invalid username-password pair");

  auto select = h.check({ok(), error("ERR DB index is out of range"), reply::make_integer(1), pong()});
  CHECK(select.failure == connect_failure::denied);
  CHECK(select.why == "SELECT refused: ERR DB index is out of range");

  auto loading = h.check({ok(), ok(), reply::make_integer(1), error("LOADING Redis is loading the dataset in memory")});
  CHECK(loading.failure == connect_failure::not_ready);
  CHECK(loading.why == "the server is still loading its dataset (LOADING)");

  auto noperm = h.check({ok(), ok(), reply::make_integer(1), error("NOPERM this user has no permissions")});
  CHECK(noperm.failure == connect_failure::denied);
  CHECK(noperm.why == "PING refused: NOPERM this user has no permissions");

  auto busy = h.check({ok(), ok(), reply::make_integer(1), error("BUSY Redis is busy running a script")});
  CHECK(busy.failure == connect_failure::not_ready);

  // The first refusal is the one reported.
  auto both = h.check({error("WRONGPASS no"), error("NOAUTH Authentication required."), reply(), pong()});
  CHECK(both.why == "AUTH refused: WRONGPASS no");

  CHECK_THROWS_AS(h.check({ok(), pong()}), std::invalid_argument);
}

TEST_CASE("handshake: under Sentinel it asks ROLE, and a replica is refused as not ready") {
  auto cfg = config::from_url("redis+sentinel://127.0.0.1:26379/orders");
  cfg.client_name.clear();
  handshake h(cfg);  // ROLE, CLIENT ID, PING
  REQUIRE(h.replies() == 3);
  CHECK(h.commands().payload().starts_with("*1\r\n$4\r\nROLE\r\n"));
  auto role = [](std::string name) {
    std::vector<reply> parts;
    parts.push_back(reply::make_string(std::move(name)));
    parts.push_back(reply::make_integer(0));
    return reply::make_array(std::move(parts));
  };

  auto primary = h.check({role("master"), reply::make_integer(7), pong()});
  CHECK(primary.failure == connect_failure::none);
  CHECK(primary.client_id == 7);

  auto replica = h.check({role("slave"), reply::make_integer(7), pong()});
  CHECK(replica.failure == connect_failure::not_ready);
  CHECK(replica.why == "the server is not the primary (ROLE says 'slave'): the sentinels are asked again");

  auto odd = h.check({reply::make_integer(1), reply::make_integer(7), pong()});
  CHECK(odd.failure == connect_failure::not_ready);
  CHECK(odd.why.find("ROLE says 'nothing readable'") != std::string::npos);

  // A user that may not run ROLE is let through (READONLY and +switch-master remain).
  auto no_role =
      h.check({error("NOPERM this user has no permissions to run the 'role' command"), reply::make_integer(7), pong()});
  CHECK(no_role.failure == connect_failure::none);

  // Not under Sentinel: no ROLE.
  CHECK(handshake(config::from_url("redis://127.0.0.1:6379")).commands().payload().find("ROLE") == std::string::npos);
}
