// The bookkeeping of a multiplexed connection, with no I/O: requests in wire order, the bytes to
// write next, and the matching of replies to requests (FIFO). The connection drives it from one
// strand; unit tests drive it with byte strings.
#pragma once

#include "redis/resp_parser.hpp"

#include <jobrt/redis/reply.hpp>
#include <jobrt/redis/request.hpp>

#include <boost/system/error_code.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace jobrt::redis::detail {

using clock = std::chrono::steady_clock;

/// One request in flight. Completed exactly once, through on_complete.
class pending {
 public:
  pending(std::string payload, std::size_t replies, const request_options& opts, bool blocking);
  pending(const pending&) = delete;
  pending& operator=(const pending&) = delete;
  virtual ~pending() = default;

  bool done() const noexcept { return done_; }
  bool written() const noexcept { return written_; }
  bool keep_once_written() const noexcept { return keep_once_written_; }
  bool wait_for_reconnect() const noexcept { return wait_for_reconnect_; }
  bool blocking() const noexcept { return blocking_; }
  clock::time_point deadline() const noexcept { return deadline_; }
  std::chrono::milliseconds written_cancel_wait() const noexcept { return written_cancel_wait_; }
  /// Brings the deadline forward to `t` (never back).
  void cut_deadline(clock::time_point t) noexcept {
    if (t < deadline_) deadline_ = t;
  }
  std::size_t expected_replies() const noexcept { return expected_; }

 protected:
  /// Called once, with the reply (an array of replies for a pipeline), or with an error.
  virtual void on_complete(boost::system::error_code ec, reply r) = 0;

  /// One command with a reply per argument (SUBSCRIBE a b): refused, it gets one error reply in
  /// all, which ends it (waiting for the rest would take the next requests' replies).
  bool one_command_ = false;

 private:
  friend class multiplexer;
  void complete(boost::system::error_code ec, reply r);

  std::string payload_;
  std::size_t expected_;
  std::vector<reply> collected_;  // replies so far of a pipeline
  std::size_t received_ = 0;      // replies read so far (also counted once abandoned)
  clock::time_point deadline_;
  bool resend_safe_;
  bool keep_once_written_;
  bool wait_for_reconnect_;
  std::chrono::milliseconds written_cancel_wait_;
  bool blocking_;
  bool written_ = false;
  bool done_ = false;  // completed; if still queued, its reply is read and dropped
};

class multiplexer {
 public:
  /// Queues a request behind every other.
  void add(std::shared_ptr<pending> p);

  bool has_waiting() const noexcept { return sent_ < queue_.size(); }
  /// Requests written whose replies have not all arrived (including abandoned ones).
  std::size_t in_flight() const noexcept { return sent_; }
  std::size_t size() const noexcept { return queue_.size(); }
  /// True when a blocking command is written and unanswered.
  bool blocked() const noexcept;

  /// Every waiting request's bytes in one buffer; they count as written from now on. The buffer
  /// stays valid until commit_write().
  const std::string& prepare_write();
  /// The write of prepare_write()'s buffer finished.
  void commit_write() noexcept { write_buffer_.clear(); }

  /// Feeds bytes read from the server and completes every request whose replies are complete.
  /// Returns errc::protocol_error when the bytes are not RESP or answer no request.
  boost::system::error_code on_data(const char* data, std::size_t size);

  /// The same in two steps: feed() the bytes, then drain() up to max_replies at a time, so the
  /// caller can write new requests between two drains. `more` tells whether drain stopped at
  /// max_replies (there may be more replies buffered).
  void feed(const char* data, std::size_t size) { parser_.feed(data, size); }
  boost::system::error_code drain(std::size_t max_replies, bool& more);
  /// Why on_data failed.
  const std::string& last_protocol_error() const noexcept { return protocol_error_; }

  /// The connection dropped: written requests fail with errc::connection_lost, except the
  /// resend-safe ones, which wait again (in their order, ahead of the others).
  void on_connection_lost();

  /// Completes with ec every request not written that does not wait for a reconnect
  /// (request_options::wait_for_reconnect): the connection is down.
  void fail_unwritten(boost::system::error_code ec);

  /// Completes p with ec now. A waiting request is removed; a written one is abandoned: its
  /// reply, when it comes, is dropped. Returns true when p was written (and so abandoned).
  bool cancel(pending& p, boost::system::error_code ec);

  struct expiry {
    clock::time_point next = clock::time_point::max();  ///< the next deadline
    bool abandoned_written = false;                     ///< a written request was abandoned
  };
  /// Completes every request whose deadline is <= now with ec.
  expiry expire(clock::time_point now, boost::system::error_code ec);

  /// Completes every request with ec and forgets them (the connection is closed for good).
  void fail_all(boost::system::error_code ec);

  /// Forgets every request without completing it, and hands them over: their handlers can never
  /// run (the io_context is being destroyed), and destroying them may destroy this multiplexer's
  /// owner, so the caller destroys them once it no longer uses the multiplexer.
  std::deque<std::shared_ptr<pending>> release_all();

  /// For pub/sub: sees each reply first; returning true means it was a pushed message.
  std::function<bool(reply&)> push_filter;

 private:
  void deliver(reply r);

  std::deque<std::shared_ptr<pending>> queue_;  // [written..., waiting...]
  std::size_t sent_ = 0;                        // how many at the front are written
  std::string write_buffer_;
  resp_parser parser_;
  std::string protocol_error_;
};

}  // namespace jobrt::redis::detail
