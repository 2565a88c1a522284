// The strands jobrt makes for its own objects (connections, workers, groups, lock services).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

namespace jobrt::detail {

/// A strand on `ex`. On an io_context's executor (the usual case) the strand wraps that
/// executor's own type rather than the type-erased one: an any_io_executor then holds the
/// strand in place, where a strand over an any_io_executor is too big for that and is copied to
/// the heap every time an operation asks it to track work, and the strand asks its executor
/// about blocking directly, where through the type erasure the answer is allocated. Any other
/// executor gets a strand over the type-erased one.
inline boost::asio::any_io_executor make_strand(const boost::asio::any_io_executor& ex) {
  if (const auto* io = ex.target<boost::asio::io_context::executor_type>()) return boost::asio::make_strand(*io);
  return boost::asio::make_strand(ex);
}

}  // namespace jobrt::detail
