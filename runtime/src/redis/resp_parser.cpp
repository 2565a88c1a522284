#include "redis/resp_parser.hpp"

#include <hiredis/read.h>

#include <memory>
#include <new>

namespace jobrt::redis {

// hiredis calls these while it parses. The root of each reply is the parser's own `reply`
// (reached through the reader's privdata), so a reply costs no allocation of its own; children
// are written in place into their parent's element vector, which createArray sized once, so the
// pointers hiredis keeps stay valid. hiredis frees only roots, through free_object.
class resp_builder {
 public:
  static reply* slot(const redisReadTask* task) noexcept {
    if (task->parent == nullptr) {
      auto* root = static_cast<reply*>(task->privdata);
      *root = reply();
      return root;
    }
    auto* parent = static_cast<reply*>(task->parent->obj);
    return &parent->elements_[static_cast<std::size_t>(task->idx)];
  }

  static void* create_string(const redisReadTask* task, char* str, std::size_t len) noexcept {
    reply* r = slot(task);
    if (r == nullptr) return nullptr;
    r->kind_ = task->type == REDIS_REPLY_ERROR    ? reply_kind::error
               : task->type == REDIS_REPLY_STATUS ? reply_kind::status
                                                  : reply_kind::string;
    try {
      r->string_.assign(str, len);
    } catch (...) {
      return nullptr;  // hiredis reports "out of memory"
    }
    return r;
  }

  static void* create_array(const redisReadTask* task, int elements) noexcept {
    reply* r = slot(task);
    if (r == nullptr) return nullptr;
    r->kind_ = reply_kind::array;
    try {
      r->elements_.resize(static_cast<std::size_t>(elements));
    } catch (...) {
      return nullptr;
    }
    return r;
  }

  static void* create_integer(const redisReadTask* task, long long value) noexcept {
    reply* r = slot(task);
    if (r == nullptr) return nullptr;
    r->kind_ = reply_kind::integer;
    r->integer_ = value;
    return r;
  }

  static void* create_nil(const redisReadTask* task) noexcept {
    reply* r = slot(task);
    if (r != nullptr) r->kind_ = reply_kind::nil;
    return r;
  }

  static void free_object(void* obj) noexcept { *static_cast<reply*>(obj) = reply(); }
};

namespace detail {
namespace {

redisReplyObjectFunctions builder_functions{resp_builder::create_string, resp_builder::create_array,
                                            resp_builder::create_integer, resp_builder::create_nil,
                                            resp_builder::free_object};

redisReader* make_reader(reply* root) {
  redisReader* r = redisReaderCreateWithFunctions(&builder_functions);
  if (r == nullptr) throw std::bad_alloc();
  r->privdata = root;
  // Keep up to 256 KiB of buffer between reads instead of freeing it after every batch.
  r->maxbuf = 256 * 1024;
  return r;
}

}  // namespace

resp_parser::resp_parser() : root_(std::make_unique<reply>()), reader_(make_reader(root_.get())) {}

resp_parser::~resp_parser() { redisReaderFree(reader_); }

void resp_parser::feed(const char* data, std::size_t size) {
  // Only fails when the reader is already in error, which next() reports.
  redisReaderFeed(reader_, data, size);
}

resp_parser::result resp_parser::next(reply& out) {
  void* obj = nullptr;
  if (redisReaderGetReply(reader_, &obj) != REDIS_OK) return result::error;
  if (obj == nullptr) return result::need_more;
  out = std::move(*static_cast<reply*>(obj));
  return result::reply;
}

std::string_view resp_parser::error_message() const noexcept { return reader_->errstr; }

void resp_parser::reset() {
  redisReader* fresh = make_reader(root_.get());
  redisReaderFree(reader_);
  reader_ = fresh;
}

}  // namespace detail
}  // namespace jobrt::redis
