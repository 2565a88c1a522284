// The words of a failure before what its error code says: a system_error's what() is
// "<words>: <the code's what()>", which a system_error made from the words adds again.
#pragma once

#include <boost/system/system_error.hpp>

#include <string>

namespace jobrt::detail {

/// "" when the failure says nothing but its code.
inline std::string reason_of(const boost::system::system_error& e) {
  std::string why = e.what();
  auto own = e.code().what();
  if (why == own) return {};
  if (why.ends_with(": " + own)) why.resize(why.size() - own.size() - 2);
  return why;
}

}  // namespace jobrt::detail
