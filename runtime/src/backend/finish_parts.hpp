// How a finish batch too big for one script call is cut into calls.
#pragma once

#include <jobrt/backend.hpp>

#include <cstddef>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace jobrt::detail {

/// The items' indices in parts of at most `max` each, but a token's items all in the part of its
/// first one, in their order (that part may grow past `max` by them). A resent call tells a keep
/// whose lease went on from one that was lost by the end of the lease in the same call
/// (finish.lua): a keep and its lease's end in two calls would read as a lost lease.
inline std::vector<std::vector<std::size_t>> finish_parts(const std::vector<finish_item>& items, std::size_t max) {
  std::vector<std::vector<std::size_t>> parts;
  std::unordered_map<std::string_view, std::size_t> part_of;  // by token
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto [at, first] = part_of.try_emplace(items[i].token, parts.size());
    if (first) {
      if (!parts.empty() && parts.back().size() < max)
        at->second = parts.size() - 1;
      else
        parts.emplace_back();
    }
    parts[at->second].push_back(i);
  }
  return parts;
}

}  // namespace jobrt::detail
