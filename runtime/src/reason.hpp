// The words of a failure without what its error code says: a system_error's what() ends with its
// code's message, which a system_error made from them adds again.
#pragma once

#include <boost/system/system_error.hpp>

#include <string>

namespace jobrt::detail {

inline std::string reason_of(const boost::system::system_error& e) {
  std::string why = e.what();
  auto own = ": " + e.code().message();
  if (why.ends_with(own)) why.resize(why.size() - own.size());
  return why;
}

}  // namespace jobrt::detail
