#include "backend/finish_parts.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using jobrt::finish_item;
using jobrt::detail::finish_parts;

namespace {

std::vector<finish_item> items_of(const std::vector<std::string>& tokens) {
  std::vector<finish_item> items;
  for (const auto& t : tokens) {
    finish_item it;
    it.token = t;
    items.push_back(it);
  }
  return items;
}

std::vector<std::string> distinct(int n, const std::string& prefix) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

}  // namespace

TEST_CASE("finish batch parts: at most max items each, in order") {
  auto parts = finish_parts(items_of(distinct(25, "t")), 10);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].size() == 10);
  CHECK(parts[1].size() == 10);
  CHECK(parts[2].size() == 5);
  std::size_t next = 0;
  for (const auto& part : parts)
    for (auto i : part) CHECK(i == next++);
  CHECK(finish_parts(items_of({}), 10).empty());
}

TEST_CASE("finish batch parts: a token's items stay in the part of its first, in their order") {
  // A keep as the part's last item and its lease's end right behind it (a pipelined burst).
  auto tokens = distinct(9, "t");
  tokens.push_back("burst");  // index 9: the keep
  tokens.push_back("burst");  // index 10: the end of the same lease
  for (auto& t : distinct(12, "u")) tokens.push_back(t);
  tokens.push_back("t3");  // a token of the first part again, after it filled up
  auto parts = finish_parts(items_of(tokens), 10);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0] == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 23});
  CHECK(parts[1] == std::vector<std::size_t>{11, 12, 13, 14, 15, 16, 17, 18, 19, 20});
  CHECK(parts[2] == std::vector<std::size_t>{21, 22});
}
