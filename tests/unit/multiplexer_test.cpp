// The pending-request bookkeeping, driven with byte strings and no server.
#include "redis/multiplexer.hpp"

#include <jobrt/error.hpp>

#include <doctest/doctest.h>
#include <boost/asio/error.hpp>

#include <memory>
#include <string>
#include <vector>

using namespace jobrt::redis;
using namespace jobrt::redis::detail;
using boost::system::error_code;

namespace {

struct outcome {
  bool completed = false;
  error_code ec;
  reply value;
};

class test_op final : public pending {
 public:
  test_op(const request& req, std::shared_ptr<outcome> out)
      : pending(req.payload(), req.size(), req.options, req.has_blocking_command()), out_(std::move(out)) {}

 private:
  void on_complete(error_code ec, reply r) override {
    REQUIRE_FALSE(out_->completed);  // exactly once
    *out_ = {true, ec, std::move(r)};
  }
  std::shared_ptr<outcome> out_;
};

struct fixture {
  multiplexer mux;
  std::shared_ptr<outcome> add(const request& req) {
    auto out = std::make_shared<outcome>();
    ops.push_back(std::make_shared<test_op>(req, out));
    mux.add(ops.back());
    return out;
  }
  error_code feed(const std::string& bytes) { return mux.on_data(bytes.data(), bytes.size()); }
  std::vector<std::shared_ptr<test_op>> ops;
};

}  // namespace

TEST_CASE_FIXTURE(fixture, "waiting requests are coalesced into one write and answered in order") {
  auto a = add(request("GET", "a"));
  auto b = add(request("GET", "b"));
  CHECK(mux.has_waiting());
  CHECK(mux.prepare_write() == request("GET", "a").payload() + request("GET", "b").payload());
  mux.commit_write();
  CHECK_FALSE(mux.has_waiting());
  CHECK(mux.in_flight() == 2);
  auto c = add(request("GET", "c"));
  CHECK(mux.prepare_write() == request("GET", "c").payload());
  mux.commit_write();

  CHECK_FALSE(feed("$1\r\nA\r\n$1\r"));  // one reply and a half
  CHECK(a->completed);
  CHECK(a->value.as_string() == "A");
  CHECK_FALSE(b->completed);
  CHECK_FALSE(feed("\nB\r\n-ERR no\r\n"));
  CHECK(b->value.as_string() == "B");
  CHECK(c->ec == jobrt::errc::server_error);
  CHECK(c->value.error_message() == "ERR no");
  CHECK(mux.size() == 0);
}

TEST_CASE_FIXTURE(fixture, "a pipeline completes once with an array of its replies") {
  request req;
  req.push("SET", "k", "v").push("INCR", "k").push("GET", "k");
  auto p = add(req);
  mux.prepare_write();
  CHECK_FALSE(feed("+OK\r\n-ERR not an integer\r\n"));
  CHECK_FALSE(p->completed);
  CHECK_FALSE(feed("$1\r\nv\r\n"));
  REQUIRE(p->completed);
  CHECK_FALSE(p->ec);  // errors inside a pipeline are elements, not a failure
  CHECK(p->value.as_array().size() == 3);
  CHECK(p->value.as_array()[1].is_error());
}

TEST_CASE_FIXTURE(fixture, "cancelling a waiting request removes it - a written one is abandoned") {
  auto a = add(request("GET", "a"));
  mux.prepare_write();
  mux.commit_write();
  auto b = add(request("GET", "b"));
  CHECK(mux.cancel(*ops[1], boost::asio::error::operation_aborted) == false);
  CHECK(b->ec == boost::asio::error::operation_aborted);
  CHECK(mux.size() == 1);
  CHECK_FALSE(mux.has_waiting());

  CHECK(mux.cancel(*ops[0], boost::asio::error::operation_aborted) == true);
  CHECK(a->ec == boost::asio::error::operation_aborted);
  auto c = add(request("GET", "c"));
  mux.prepare_write();
  // The abandoned request's reply is read and dropped; the next reply goes to the next request.
  CHECK_FALSE(feed("$1\r\nA\r\n$1\r\nC\r\n"));
  CHECK(c->value.as_string() == "C");
  CHECK(mux.size() == 0);
}

TEST_CASE_FIXTURE(fixture, "connection lost: written requests fail unless resend-safe - waiting ones stay") {
  auto a = add(request("INCR", "a"));
  request safe("GET", "b");
  safe.options.resend_safe = true;
  auto b = add(safe);
  mux.prepare_write();
  auto c = add(request("GET", "c"));
  mux.on_connection_lost();
  CHECK(a->ec == jobrt::errc::connection_lost);
  CHECK_FALSE(b->completed);
  CHECK_FALSE(c->completed);
  // b goes again, ahead of c.
  CHECK(mux.prepare_write() == safe.payload() + request("GET", "c").payload());
  CHECK_FALSE(feed("$1\r\nB\r\n$1\r\nC\r\n"));
  CHECK(b->value.as_string() == "B");
  CHECK(c->value.as_string() == "C");
}

TEST_CASE_FIXTURE(fixture, "connection down: requests that do not wait for a reconnect fail - the rest wait in order") {
  request safe("GET", "a");
  safe.options.resend_safe = true;
  safe.options.wait_for_reconnect = false;
  request unsafe("SET", "b", "1");
  unsafe.options.wait_for_reconnect = false;
  auto a = add(safe);    // written, taken back by the drop: then fails
  auto b = add(unsafe);  // written: lost
  mux.prepare_write();
  request elsewhere("GET", "c");
  elsewhere.options.wait_for_reconnect = false;
  auto c = add(request("GET", "w"));  // waits (the default)
  auto d = add(elsewhere);            // fails
  auto e = add(request("GET", "x"));  // waits
  mux.on_connection_lost();
  CHECK(b->ec == jobrt::errc::connection_lost);
  CHECK_FALSE(a->completed);
  mux.fail_unwritten(jobrt::errc::not_connected);
  CHECK(a->ec == jobrt::errc::not_connected);
  CHECK(d->ec == jobrt::errc::not_connected);
  CHECK_FALSE(c->completed);
  CHECK_FALSE(e->completed);
  CHECK(mux.size() == 2);
  CHECK(mux.prepare_write() == request("GET", "w").payload() + request("GET", "x").payload());
  CHECK_FALSE(feed("$1\r\nW\r\n$1\r\nX\r\n"));
  CHECK(c->value.as_string() == "W");
  CHECK(e->value.as_string() == "X");
}

TEST_CASE_FIXTURE(fixture, "expired requests time out - the next deadline is reported") {
  request quick("GET", "a");
  quick.options.timeout = std::chrono::milliseconds(10);
  request slow("GET", "b");
  slow.options.timeout = std::chrono::milliseconds(100000);
  auto a = add(quick);
  auto b = add(slow);
  auto none = add(request("GET", "c"));
  mux.prepare_write();
  auto result = mux.expire(clock::now() + std::chrono::milliseconds(20), jobrt::errc::timeout);
  CHECK(a->ec == jobrt::errc::timeout);
  CHECK(result.abandoned_written);
  CHECK_FALSE(b->completed);
  CHECK(result.next == ops[1]->deadline());
  CHECK_FALSE(feed("$1\r\nA\r\n$1\r\nB\r\n$1\r\nC\r\n"));
  CHECK(b->value.as_string() == "B");
  CHECK(none->value.as_string() == "C");
}

TEST_CASE_FIXTURE(fixture, "garbage and unsolicited replies are protocol errors") {
  CHECK(feed(":1\r\n") == jobrt::errc::protocol_error);  // nobody asked
  fixture other;
  other.add(request("PING"));
  other.mux.prepare_write();
  CHECK(other.feed("?what\r\n") == jobrt::errc::protocol_error);
  CHECK_FALSE(other.mux.last_protocol_error().empty());
  other.mux.fail_all(jobrt::errc::closed);
  CHECK(other.mux.size() == 0);
}

TEST_CASE_FIXTURE(fixture, "a push filter takes pub/sub messages out of the reply stream") {
  mux.push_filter = [](reply& r) {
    return r.kind() == reply_kind::array && r.as_array().size() == 3 && r.as_array()[0].as_string() == "message";
  };
  auto a = add(request("PING"));
  mux.prepare_write();
  CHECK_FALSE(feed("*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n+PONG\r\n"));
  CHECK(a->value.as_string() == "PONG");
}

TEST_CASE_FIXTURE(fixture, "drain completes at most the replies asked for - then the rest") {
  auto a = add(request("GET", "a"));
  auto b = add(request("GET", "b"));
  auto c = add(request("GET", "c"));
  mux.prepare_write();
  std::string bytes = ":1\r\n:2\r\n:3\r\n";
  mux.feed(bytes.data(), bytes.size());
  bool more = false;
  CHECK_FALSE(mux.drain(2, more));
  CHECK(more);
  CHECK(a->completed);
  CHECK(b->completed);
  CHECK_FALSE(c->completed);
  CHECK_FALSE(mux.drain(2, more));
  CHECK_FALSE(more);
  CHECK(c->value.as_integer() == 3);
}

TEST_CASE_FIXTURE(fixture, "an abandoned pipeline still owns the rest of its replies") {
  request three;
  three.push("GET", "a").push("GET", "b").push("GET", "c");
  auto p = add(three);
  auto next = add(request("GET", "d"));
  mux.prepare_write();
  CHECK_FALSE(feed(":1\r\n:2\r\n"));
  CHECK(mux.cancel(*ops[0], jobrt::errc::timeout));
  CHECK(p->ec == jobrt::errc::timeout);
  CHECK_FALSE(feed(":3\r\n:4\r\n"));
  CHECK(next->value.as_integer() == 4);
  CHECK(mux.size() == 0);
}
