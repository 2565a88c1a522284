// A RESP2 reply as a value: nil, integer, bulk string, status, error or array.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jobrt::redis {

enum class reply_kind { nil, integer, string, status, error, array };

std::string_view to_string(reply_kind k) noexcept;

/// Thrown by the typed accessors of reply when the reply is of another kind.
class reply_type_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class reply {
 public:
  reply() = default;  // nil

  static reply make_integer(std::int64_t v);
  static reply make_string(std::string v, reply_kind k = reply_kind::string);
  static reply make_array(std::vector<reply> elements);

  reply_kind kind() const noexcept { return kind_; }
  bool is_nil() const noexcept { return kind_ == reply_kind::nil; }
  bool is_error() const noexcept { return kind_ == reply_kind::error; }

  /// The value of an integer reply; throws reply_type_error for any other kind.
  std::int64_t as_integer() const;
  /// The text of a bulk string or status reply; throws reply_type_error for any other kind.
  const std::string& as_string() const;
  /// The elements of an array reply; throws reply_type_error for any other kind.
  const std::vector<reply>& as_array() const;
  std::vector<reply>& as_array();
  /// The message of an error reply ("ERR ...", "NOSCRIPT ..."); empty for other kinds.
  std::string_view error_message() const noexcept;

  friend bool operator==(const reply&, const reply&) = default;
  friend std::ostream& operator<<(std::ostream& os, const reply& r);

 private:
  friend class resp_builder;
  reply_kind kind_ = reply_kind::nil;
  std::int64_t integer_ = 0;
  std::string string_;
  std::vector<reply> elements_;
};

}  // namespace jobrt::redis
