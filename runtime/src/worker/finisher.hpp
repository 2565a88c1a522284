// The worker's finisher: the results of its jobs (acks, retries, keeps, hand-backs) go to the
// backend in batches. One finish call carries every result that came in since the last one
// left, and up to `calls_max` calls are on their way at once, so the backend runs one while the
// worker handles the answer of another. A token is in one call on its way at most: a result whose
// token is in one waits for that call's answer, so a token's results (a pipelined burst's keeps,
// then its end) reach the backend in the order they came, even when a call fails and is sent
// again after another went through. One loop on the worker's strand, with a timer and a stop
// signal per call; what each result came to goes back through finisher_hooks, on that strand.
#pragma once

#include <jobrt/backend.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace jobrt::detail {

struct finisher_options {
  std::string queue;
  std::string worker;  // the id the leases are held under
  std::chrono::milliseconds lease_ttl{5000};
  // Finish calls on their way at once (the worker's: 2, see worker.cpp); 1 on a sharded queue.
  std::size_t calls_max = 2;
};

// What the worker keeps of each result beside it, handed back with the answer.
struct finish_note {
  std::string type;  // its job's, for the counters by type
  std::string id;    // its job's, for the log
  // A keep's: its follower started when the job ended (follow_policy::pipelined), or waits for it.
  bool follower_running = false;
};

// Called on the strand, from the loop; an empty one is not called.
struct finisher_hooks {
  // The backend's answer to one result, in the order the results came for each token.
  std::function<void(const finish_item&, const finish_note&, finish_result&)> finished;
};

class finisher : public std::enable_shared_from_this<finisher> {
 public:
  // `strand` is where the loop runs, and where every member below is called. `source` names the
  // worker in the log. The backend must outlive the loop (stop() completed).
  finisher(boost::asio::any_io_executor strand, backend& b, finisher_options opts, std::string source,
           finisher_hooks hooks);
  finisher(const finisher&) = delete;
  finisher& operator=(const finisher&) = delete;

  // Starts the loop (once; not after a stop).
  void start();
  // A result to send. After request_stop() it is dropped, and said: the backend may be gone, and
  // the lease expires (its job runs again).
  void add(finish_item item, finish_note note);
  // Whether results under `token` wait to be sent or are on their way.
  bool has(const std::string& token) const;
  // The tokens of every result waiting or on their way (a token may come more than once).
  std::vector<std::string> tokens() const;
  // Ends the loop: the calls on their way are cut short (their results are not sent again), those
  // that wait are dropped (and said), and no call starts. Returns at once; stop() waits for it.
  void request_stop();
  // request_stop(), then waits until the loop and every call have ended: after it the finisher
  // neither touches the backend nor calls a hook. Returns even while the backend does not answer.
  boost::asio::awaitable<void> stop();

 private:
  struct call_state {
    boost::asio::cancellation_signal stop;  // request_stop() ends the call
    std::vector<std::string> tokens;        // its items' (in in_calls_ while it is on its way)
  };

  static boost::asio::awaitable<void> flush_loop(std::shared_ptr<finisher> self);
  boost::asio::awaitable<void> learn_shards();
  static boost::asio::awaitable<void> finish_call(std::shared_ptr<finisher> self, std::vector<finish_item> items,
                                                  std::vector<finish_note> notes);
  void take_sendable(std::vector<finish_item>& items, std::vector<finish_note>& notes);

  boost::asio::any_io_executor strand_;
  backend& backend_;
  finisher_options opts_;
  std::string source_;  // how its log lines name the worker
  finisher_hooks hooks_;
  std::vector<finish_item> pending_;              // results that wait to be sent, in the order they came
  std::vector<finish_note> notes_;                // (beside pending_)
  std::unordered_set<std::string> in_calls_;      // tokens of the items in calls on their way
  std::list<call_state> calls_;                   // one per call on its way
  boost::asio::steady_timer wake_;                // the loop waits here for a result, a call's end or stop
  boost::asio::steady_timer ended_;               // never expires: stop() waits on it for the loop to end
  boost::asio::cancellation_signal asking_stop_;  // request_stop() ends learn_shards()
  bool shards_known_ = false;
  std::chrono::steady_clock::time_point ask_shards_after_{};
  bool started_ = false;
  bool stopped_ = false;
  bool idle_ = false;  // the loop waits on wake_
  bool flushing_ = true;
};

}  // namespace jobrt::detail
