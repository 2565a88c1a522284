// How a finish batch too big for one script call is cut into calls.
#pragma once

#include <jobrt/backend.hpp>

#include <cstddef>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace jobrt::detail {

/// The items' indices in parts of at most `max` each, a token's items all in one part, in their
/// order: a resent call tells a keep whose lease went on from one that was lost by the end of
/// the lease in the same call (finish.lua), so a keep and its lease's end in two calls would read
/// as a lost lease. Tokens go whole, in the order of their first items; one with more than `max`
/// items (a burst longer than `max`, which the worker does not allow) gets a part of its own.
inline std::vector<std::vector<std::size_t>> finish_parts(const std::vector<finish_item>& items, std::size_t max) {
  std::vector<std::vector<std::size_t>> by_token;  // in the order of their first items
  std::unordered_map<std::string_view, std::size_t> slot;
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto [at, first] = slot.try_emplace(items[i].token, by_token.size());
    if (first) by_token.emplace_back();
    by_token[at->second].push_back(i);
  }
  std::vector<std::vector<std::size_t>> parts;
  for (auto& indices : by_token) {
    if (parts.empty() || (!parts.back().empty() && parts.back().size() + indices.size() > max)) parts.emplace_back();
    parts.back().insert(parts.back().end(), indices.begin(), indices.end());
  }
  return parts;
}

}  // namespace jobrt::detail
