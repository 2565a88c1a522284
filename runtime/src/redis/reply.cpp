#include <jobrt/redis/reply.hpp>

#include <fmt/format.h>

#include <ostream>

namespace jobrt::redis {

std::string_view to_string(reply_kind k) noexcept {
  switch (k) {
    case reply_kind::nil: return "nil";
    case reply_kind::integer: return "integer";
    case reply_kind::string: return "string";
    case reply_kind::status: return "status";
    case reply_kind::error: return "error";
    case reply_kind::array: return "array";
  }
  return "?";
}

namespace {
[[noreturn]] void mismatch(std::string_view wanted, const reply& r) {
  if (r.is_error()) throw reply_type_error(fmt::format("expected {} reply, got error '{}'", wanted, r.error_message()));
  throw reply_type_error(fmt::format("expected {} reply, got {}", wanted, to_string(r.kind())));
}
}  // namespace

reply reply::make_integer(std::int64_t v) {
  reply r;
  r.kind_ = reply_kind::integer;
  r.integer_ = v;
  return r;
}

reply reply::make_string(std::string v, reply_kind k) {
  reply r;
  r.kind_ = k;
  r.string_ = std::move(v);
  return r;
}

reply reply::make_array(std::vector<reply> elements) {
  reply r;
  r.kind_ = reply_kind::array;
  r.elements_ = std::move(elements);
  return r;
}

std::int64_t reply::as_integer() const {
  if (kind_ != reply_kind::integer) mismatch("integer", *this);
  return integer_;
}

const std::string& reply::as_string() const {
  if (kind_ != reply_kind::string && kind_ != reply_kind::status) mismatch("string", *this);
  return string_;
}

const std::vector<reply>& reply::as_array() const {
  if (kind_ != reply_kind::array) mismatch("array", *this);
  return elements_;
}

std::vector<reply>& reply::as_array() {
  if (kind_ != reply_kind::array) mismatch("array", *this);
  return elements_;
}

std::string_view reply::error_message() const noexcept {
  return kind_ == reply_kind::error ? std::string_view(string_) : std::string_view();
}

std::ostream& operator<<(std::ostream& os, const reply& r) {
  switch (r.kind_) {
    case reply_kind::nil: return os << "(nil)";
    case reply_kind::integer: return os << "(integer) " << r.integer_;
    case reply_kind::string: return os << '"' << r.string_ << '"';
    case reply_kind::status: return os << r.string_;
    case reply_kind::error: return os << "(error) " << r.string_;
    case reply_kind::array:
      os << '[';
      for (std::size_t i = 0; i < r.elements_.size(); ++i) os << (i ? ", " : "") << r.elements_[i];
      return os << ']';
  }
  return os;
}

}  // namespace jobrt::redis
