#include "redis/multiplexer.hpp"

#include <jobrt/error.hpp>

#include <algorithm>
#include <iterator>

namespace jobrt::redis::detail {

pending::pending(std::string payload, std::size_t replies, const request_options& opts, bool blocking)
    : payload_(std::move(payload)),
      expected_(replies),
      deadline_(opts.timeout.count() > 0 ? clock::now() + opts.timeout : clock::time_point::max()),
      resend_safe_(opts.resend_safe),
      keep_once_written_(opts.keep_once_written),
      wait_for_reconnect_(opts.wait_for_reconnect),
      written_cancel_wait_(opts.written_cancel_wait),
      blocking_(blocking) {}

void pending::complete(boost::system::error_code ec, reply r) {
  if (done_) return;
  done_ = true;
  collected_.clear();
  on_complete(ec, std::move(r));
}

void multiplexer::add(std::shared_ptr<pending> p) { queue_.push_back(std::move(p)); }

bool multiplexer::blocked() const noexcept {
  return std::any_of(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(sent_),
                     [](const auto& p) { return p->blocking_; });
}

const std::string& multiplexer::prepare_write() {
  for (; sent_ < queue_.size(); ++sent_) {
    pending& p = *queue_[sent_];
    write_buffer_ += p.payload_;
    p.written_ = true;
  }
  return write_buffer_;
}

boost::system::error_code multiplexer::on_data(const char* data, std::size_t size) {
  parser_.feed(data, size);
  bool more = false;
  return drain(static_cast<std::size_t>(-1), more);
}

boost::system::error_code multiplexer::drain(std::size_t max_replies, bool& more) {
  more = false;
  for (std::size_t n = 0;; ++n) {
    if (n == max_replies) {
      more = true;
      return {};
    }
    reply r;
    switch (parser_.next(r)) {
      case resp_parser::result::need_more: return {};
      case resp_parser::result::error:
        protocol_error_ = parser_.error_message();
        // The reply that cannot be read is the oldest request's: it fails, rather than go to the
        // next connection to meet the same reply again (a read is sent again after a reconnect).
        if (sent_ > 0) {
          std::shared_ptr<pending> p = std::move(queue_.front());
          queue_.pop_front();
          --sent_;
          p->complete(errc::protocol_error, {});
        }
        return errc::protocol_error;
      case resp_parser::result::reply:
        if (push_filter && push_filter(r)) break;
        if (sent_ == 0) {
          protocol_error_ = "a reply arrived that no request waits for";
          return errc::protocol_error;
        }
        deliver(std::move(r));
        break;
    }
  }
}

void multiplexer::deliver(reply r) {
  pending& front = *queue_.front();
  if (front.expected_ > 1 && !(front.one_command_ && r.is_error())) {
    // Counted apart from collected_: an abandoned pipeline still owns its remaining replies.
    ++front.received_;
    if (!front.done_) front.collected_.push_back(std::move(r));
    if (front.received_ < front.expected_) return;
    r = reply::make_array(std::move(front.collected_));
  }
  // Pop before completing: the completion may add or cancel requests.
  std::shared_ptr<pending> p = std::move(queue_.front());
  queue_.pop_front();
  --sent_;
  boost::system::error_code ec;
  if ((p->expected_ == 1 || p->one_command_) && r.is_error()) ec = errc::server_error;
  p->complete(ec, std::move(r));
}

void multiplexer::on_connection_lost() {
  // Written requests that may be sent again keep their place at the front, as waiting.
  std::deque<std::shared_ptr<pending>> failed;
  std::deque<std::shared_ptr<pending>> resend;
  for (std::size_t i = 0; i < sent_; ++i) {
    auto& p = queue_[i];
    if (p->done_) continue;
    if (p->resend_safe_) {
      p->written_ = false;
      p->collected_.clear();
      p->received_ = 0;
      resend.push_back(std::move(p));
    } else {
      failed.push_back(std::move(p));
    }
  }
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(sent_));
  queue_.insert(queue_.begin(), std::make_move_iterator(resend.begin()), std::make_move_iterator(resend.end()));
  sent_ = 0;
  write_buffer_.clear();
  parser_.reset();
  for (auto& p : failed) p->complete(errc::connection_lost, {});
}

void multiplexer::fail_unwritten(boost::system::error_code ec) {
  std::vector<std::shared_ptr<pending>> failed;
  auto waiting = queue_.begin() + static_cast<std::ptrdiff_t>(sent_);
  auto kept = std::stable_partition(waiting, queue_.end(), [](const auto& p) { return p->wait_for_reconnect_; });
  std::move(kept, queue_.end(), std::back_inserter(failed));
  queue_.erase(kept, queue_.end());
  for (auto& p : failed) p->complete(ec, {});
}

bool multiplexer::cancel(pending& p, boost::system::error_code ec) {
  if (p.done_) return false;
  bool was_written = p.written_;
  if (!was_written) {
    auto it = std::find_if(queue_.begin() + static_cast<std::ptrdiff_t>(sent_), queue_.end(),
                           [&](const auto& q) { return q.get() == &p; });
    if (it != queue_.end()) {
      std::shared_ptr<pending> keep = std::move(*it);  // p may be owned only by the queue
      queue_.erase(it);
      keep->complete(ec, {});
      return false;
    }
  }
  p.complete(ec, {});
  return was_written;
}

multiplexer::expiry multiplexer::expire(clock::time_point now, boost::system::error_code ec) {
  std::vector<std::shared_ptr<pending>> due;
  expiry result;
  for (auto& p : queue_) {
    if (p->done_) continue;
    if (p->deadline_ <= now)
      due.push_back(p);
    else
      result.next = std::min(result.next, p->deadline_);
  }
  for (auto& p : due) result.abandoned_written = cancel(*p, ec) || result.abandoned_written;
  return result;
}

void multiplexer::fail_all(boost::system::error_code ec) {
  auto all = std::move(queue_);
  queue_.clear();
  sent_ = 0;
  write_buffer_.clear();
  parser_.reset();
  for (auto& p : all) p->complete(ec, {});
}

std::deque<std::shared_ptr<pending>> multiplexer::release_all() {
  auto all = std::move(queue_);
  queue_.clear();
  sent_ = 0;
  write_buffer_.clear();
  parser_.reset();
  return all;
}

}  // namespace jobrt::redis::detail
