#include <jobrt/redis/request.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>

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
// They change the connection itself (see request::disturbs_connection; CLIENT REPLY is told by
// its argument).
constexpr std::array<std::string_view, 5> connection_commands{"HELLO", "AUTH", "SELECT", "RESET", "QUIT"};
// Their replies are pushed, not one per command: only a subscriber can carry them.
constexpr std::array<std::string_view, 7> pubsub_commands{"SUBSCRIBE",    "PSUBSCRIBE",   "SSUBSCRIBE", "UNSUBSCRIBE",
                                                          "PUNSUBSCRIBE", "SUNSUBSCRIBE", "MONITOR"};

template <std::size_t N>
bool is_one_of(std::string_view command, const std::array<std::string_view, N>& names) {
  return std::any_of(names.begin(), names.end(), [&](std::string_view n) { return iequals(command, n); });
}

// Writes "<prefix><n>\r\n" to buf (at least 24 bytes); returns its length.
std::size_t format_header(char* buf, char prefix, std::size_t n) {
  buf[0] = prefix;
  char* p = std::to_chars(buf + 1, buf + 22, n).ptr;
  p[0] = '\r';
  p[1] = '\n';
  return static_cast<std::size_t>(p + 2 - buf);
}

void append_header(std::string& out, char prefix, std::size_t n) {
  char buf[24];
  out.append(buf, format_header(buf, prefix, n));
}

}  // namespace

void request::begin_command(std::string_view command, std::size_t argc) {
  // Room for typical arguments (keys, tokens, numbers: 10-40 bytes and their headers), so a
  // command such as a script call with a dozen arguments is written without growing.
  if (commands_ == 0) payload_.reserve(64 + 32 * argc);
  ++commands_;
  // XREAD/XREADGROUP block only with BLOCK; treat them as blocking to be safe.
  blocking_ =
      blocking_ || is_one_of(command, blocking_commands) || iequals(command, "XREAD") || iequals(command, "XREADGROUP");
  pubsub_ = pubsub_ || is_one_of(command, pubsub_commands);
  if (iequals(command, "MULTI")) {
    open_multi_ = true;
  } else if (iequals(command, "EXEC") || iequals(command, "DISCARD")) {
    closes_multi_ = closes_multi_ || !open_multi_;
    open_multi_ = false;
  }
  changes_connection_ = changes_connection_ || is_one_of(command, connection_commands);
  append_header(payload_, '*', argc);
  append_bulk(command);
  client_command_ = iequals(command, "CLIENT");
}

request& request::append(const request& other) {
  payload_ += other.payload_;
  commands_ += other.commands_;
  blocking_ = blocking_ || other.blocking_;
  pubsub_ = pubsub_ || other.pubsub_;
  // A MULTI left open here is ended by an EXEC of the other's that comes before a MULTI of its own.
  const bool was_open = open_multi_;
  closes_multi_ = closes_multi_ || (!was_open && other.closes_multi_);
  open_multi_ = other.open_multi_ || (was_open && !other.closes_multi_);
  changes_connection_ = changes_connection_ || other.changes_connection_;
  client_command_ = false;
  return *this;
}

// Arguments are mostly short (keys, tokens, numbers): header, bytes and CRLF are put together on
// the stack and appended at once, one append instead of five.
void request::append_bulk(std::string_view arg) {
  if (client_command_) {  // CLIENT's subcommand
    client_command_ = false;
    changes_connection_ = changes_connection_ || iequals(arg, "REPLY");
  }
  char buf[128];
  std::size_t n = format_header(buf, '$', arg.size());
  if (n + arg.size() + 2 <= sizeof buf) {
    if (!arg.empty()) std::memcpy(buf + n, arg.data(), arg.size());  // (data() may be null when empty)
    n += arg.size();
    buf[n++] = '\r';
    buf[n++] = '\n';
    payload_.append(buf, n);
    return;
  }
  payload_.append(buf, n);
  payload_.append(arg);
  payload_.append("\r\n", 2);
}

}  // namespace jobrt::redis
