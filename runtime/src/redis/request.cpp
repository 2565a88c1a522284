#include <jobrt/redis/request.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

namespace jobrt::redis {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::toupper(static_cast<unsigned char>(x)) == y;
         });
}

// Commands that hold the connection until something happens on the server.
constexpr std::array<std::string_view, 13> blocking_commands{
    "BLPOP",  "BRPOP", "BRPOPLPUSH", "BLMOVE",    "BLMPOP",     "BZPOPMIN",  "BZPOPMAX",
    "BZMPOP", "WAIT",  "MONITOR",    "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE"};
// Their replies are pushed, not one per command: only a subscriber can carry them.
constexpr std::array<std::string_view, 7> pubsub_commands{"SUBSCRIBE",    "PSUBSCRIBE",   "SSUBSCRIBE", "UNSUBSCRIBE",
                                                          "PUNSUBSCRIBE", "SUNSUBSCRIBE", "MONITOR"};

template <std::size_t N>
bool is_one_of(std::string_view command, const std::array<std::string_view, N>& names) {
  return std::any_of(names.begin(), names.end(), [&](std::string_view n) { return iequals(command, n); });
}

void append_header(std::string& out, char prefix, std::size_t n) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, n);
  out += prefix;
  out.append(buf, res.ptr);
  out += "\r\n";
}

}  // namespace

void request::begin_command(std::string_view command, std::size_t argc) {
  if (commands_ == 0) payload_.reserve(64 + 16 * argc);
  ++commands_;
  // XREAD/XREADGROUP block only with BLOCK; treat them as blocking to be safe.
  blocking_ =
      blocking_ || is_one_of(command, blocking_commands) || iequals(command, "XREAD") || iequals(command, "XREADGROUP");
  pubsub_ = pubsub_ || is_one_of(command, pubsub_commands);
  append_header(payload_, '*', argc);
  append_bulk(command);
}

request& request::append(const request& other) {
  payload_ += other.payload_;
  commands_ += other.commands_;
  blocking_ = blocking_ || other.blocking_;
  pubsub_ = pubsub_ || other.pubsub_;
  return *this;
}

void request::append_bulk(std::string_view arg) {
  append_header(payload_, '$', arg.size());
  payload_.append(arg);
  payload_ += "\r\n";
}

}  // namespace jobrt::redis
