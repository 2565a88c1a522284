#include "redis/cluster_map.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <array>
#include <charconv>

namespace jobrt::redis::detail {

namespace {

constexpr std::array<std::uint16_t, 256> crc16_table = [] {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    auto crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    t[i] = crc;
  }
  return t;
}();

template <class Int>
std::optional<Int> to_int(std::string_view text) {
  Int v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::string_view word(std::string_view& text) {  // the next space-separated word, taken off `text`
  auto end = text.find(' ');
  auto w = text.substr(0, end);
  text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
  return w;
}

std::uint16_t slot_number(const reply& r, std::string_view what) {
  if (r.kind() != reply_kind::integer || r.as_integer() < 0 || r.as_integer() >= cluster_slots)
    throw topology_error(fmt::format("{}: a slot number from 0 to 16383 expected, got {}", what, fmt::streamed(r)));
  return static_cast<std::uint16_t>(r.as_integer());
}

const std::vector<reply>& array_of(const reply& r, std::string_view what) {
  if (r.kind() != reply_kind::array)
    throw topology_error(fmt::format("{}: an array expected, got {}", what, to_string(r.kind())));
  return r.as_array();
}

// A flat array of name and value pairs (RESP2's form of CLUSTER SHARDS' maps): the value of `name`.
const reply* field(const std::vector<reply>& pairs, std::string_view name) {
  for (std::size_t i = 0; i + 1 < pairs.size(); i += 2)
    if (pairs[i].kind() == reply_kind::string && pairs[i].as_string() == name) return &pairs[i + 1];
  return nullptr;
}

std::string text_field(const std::vector<reply>& pairs, std::string_view name) {
  auto* v = field(pairs, name);
  return v != nullptr && (v->kind() == reply_kind::string || v->kind() == reply_kind::status) ? v->as_string()
                                                                                              : std::string();
}

bool unknown(std::string_view host) { return host.empty() || host == "?"; }

// Where a node takes connections: its preferred endpoint, else its IP, else, when the reply left
// both empty (a node alone, which knows no IP of its own), the host asked. ('?' is a node whose
// address is unknown, not necessarily the one asked: left out.)
std::optional<node_address> shard_node(const std::vector<reply>& node, std::string_view asked) {
  auto* port = field(node, "port");
  if (port == nullptr || port->kind() != reply_kind::integer || port->as_integer() <= 0 || port->as_integer() > 65535)
    throw topology_error("CLUSTER SHARDS: a node without a port");
  auto endpoint = text_field(node, "endpoint");
  auto host = unknown(endpoint) ? text_field(node, "ip") : endpoint;
  if (host.empty() && endpoint.empty()) host = asked;
  if (unknown(host)) return std::nullopt;
  return node_address{host, static_cast<std::uint16_t>(port->as_integer())};
}

}  // namespace

std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (char c : data)
    crc = static_cast<std::uint16_t>((crc << 8) ^ crc16_table[((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xff]);
  return crc;
}

std::string_view hash_tag(std::string_view key) noexcept {
  auto open = key.find('{');
  if (open == std::string_view::npos) return key;
  auto close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

std::uint16_t key_slot(std::string_view key) noexcept { return crc16(hash_tag(key)) & (cluster_slots - 1); }

std::string slot_tag(std::uint16_t slot) {
  // Found for every slot at the first call: the numbers up to about 110,000 cover them all.
  static const std::vector<std::uint32_t> numbers = [] {
    std::vector<std::uint32_t> first(cluster_slots, 0);
    std::vector<bool> found(cluster_slots, false);
    std::size_t left = cluster_slots;
    for (std::uint32_t n = 0; left > 0; ++n) {
      std::size_t at = crc16(std::to_string(n)) & (cluster_slots - 1u);
      if (found[at]) continue;
      found[at] = true;
      first[at] = n;
      --left;
    }
    return first;
  }();
  return std::to_string(numbers[slot & (cluster_slots - 1)]);
}

std::optional<std::uint16_t> common_slot(std::span<const std::string> keys) {
  if (keys.empty()) return std::nullopt;
  auto slot = key_slot(keys.front());
  for (const auto& key : keys.subspan(1)) {
    auto other = key_slot(key);
    if (other != slot)
      throw cross_slot_error(fmt::format(
          "the keys of one request must hash to one slot: '{}' is in slot {}, '{}' in slot {} (give them one hash "
          "tag, as in {{name}})",
          keys.front(), slot, key, other));
  }
  return slot;
}

std::string node_address::text() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

std::optional<node_address> parse_address(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto port = to_int<std::uint16_t>(text.substr(colon + 1));
  if (!port || *port == 0) return std::nullopt;
  auto host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return node_address{std::string(host), *port};
}

std::vector<shard_info> parse_cluster_shards(const reply& r, std::string_view asked) {
  std::vector<shard_info> shards;
  for (const auto& entry : array_of(r, "CLUSTER SHARDS")) {
    const auto& pairs = array_of(entry, "CLUSTER SHARDS: a shard");
    shard_info s;
    if (auto* slots = field(pairs, "slots")) {
      const auto& bounds = array_of(*slots, "CLUSTER SHARDS: slots");
      if (bounds.size() % 2 != 0) throw topology_error("CLUSTER SHARDS: slots: an odd count of range bounds");
      for (std::size_t i = 0; i < bounds.size(); i += 2) {
        auto first = slot_number(bounds[i], "CLUSTER SHARDS: slots");
        auto last = slot_number(bounds[i + 1], "CLUSTER SHARDS: slots");
        if (first > last) throw topology_error(fmt::format("CLUSTER SHARDS: slots {} to {}: not a range", first, last));
        s.ranges.emplace_back(first, last);
      }
    }
    if (s.ranges.empty()) continue;  // (a shard of replicas only, or being emptied)
    bool has_primary = false;
    if (auto* nodes = field(pairs, "nodes")) {
      for (const auto& node : array_of(*nodes, "CLUSTER SHARDS: nodes")) {
        const auto& fields = array_of(node, "CLUSTER SHARDS: a node");
        auto address = shard_node(fields, asked);
        if (!address) continue;
        auto health = text_field(fields, "health");
        if (text_field(fields, "role") == "master") {
          if (health != "online") continue;
          s.primary = std::move(*address);
          has_primary = true;
        } else if (health != "failed") {  // (Redis 7.0 calls a replica "loading" until it has an offset)
          s.replicas.push_back(std::move(*address));
        }
      }
    }
    if (has_primary) shards.push_back(std::move(s));
  }
  return shards;
}

std::vector<shard_info> parse_cluster_slots(const reply& r, std::string_view asked) {
  std::vector<shard_info> shards;
  for (const auto& entry : array_of(r, "CLUSTER SLOTS")) {
    const auto& parts = array_of(entry, "CLUSTER SLOTS: a range");
    if (parts.size() < 3) throw topology_error("CLUSTER SLOTS: a range without a node");
    shard_info s;
    auto first = slot_number(parts[0], "CLUSTER SLOTS");
    auto last = slot_number(parts[1], "CLUSTER SLOTS");
    if (first > last) throw topology_error(fmt::format("CLUSTER SLOTS: slots {} to {}: not a range", first, last));
    s.ranges.emplace_back(first, last);
    bool has_primary = false;
    for (std::size_t i = 2; i < parts.size(); ++i) {
      const auto& node = array_of(parts[i], "CLUSTER SLOTS: a node");
      if (node.size() < 2 || (node[0].kind() != reply_kind::string && node[0].kind() != reply_kind::nil) ||
          node[1].kind() != reply_kind::integer || node[1].as_integer() <= 0 || node[1].as_integer() > 65535)
        throw topology_error("CLUSTER SLOTS: a node without a host and a port");
      // Empty or null: the node asked (a node alone); '?': unknown, left out.
      std::string host = node[0].kind() == reply_kind::string ? node[0].as_string() : std::string();
      if (host.empty()) host = asked;
      if (unknown(host)) continue;
      node_address address{host, static_cast<std::uint16_t>(node[1].as_integer())};
      if (i == 2) {
        s.primary = std::move(address);
        has_primary = true;
      } else {
        s.replicas.push_back(std::move(address));
      }
    }
    if (has_primary) shards.push_back(std::move(s));
  }
  return shards;
}

slot_map::slot_map(const std::vector<shard_info>& shards) : owner_(cluster_slots, none) {
  for (const auto& s : shards) {
    auto index = index_of(s.primary);
    for (auto [first, last] : s.ranges) std::fill(owner_.begin() + first, owner_.begin() + last + 1, index);
  }
}

std::uint16_t slot_map::index_of(const node_address& node) {
  auto it = std::find(nodes_.begin(), nodes_.end(), node);
  if (it != nodes_.end()) return static_cast<std::uint16_t>(it - nodes_.begin());
  nodes_.push_back(node);
  return static_cast<std::uint16_t>(nodes_.size() - 1);
}

const node_address* slot_map::owner(std::uint16_t slot) const noexcept {
  if (slot >= cluster_slots || owner_[slot] == none) return nullptr;
  return &nodes_[owner_[slot]];
}

void slot_map::assign(std::uint16_t slot, const node_address& node) {
  if (slot < cluster_slots) owner_[slot] = index_of(node);
}

std::vector<node_address> slot_map::primaries() const {
  std::vector<bool> seen(nodes_.size());
  std::vector<node_address> out;
  for (auto index : owner_)
    if (index != none && !seen[index]) {
      seen[index] = true;
      out.push_back(nodes_[index]);
    }
  return out;
}

bool slot_map::complete() const noexcept { return unserved() == 0; }

std::size_t slot_map::unserved() const noexcept {
  return static_cast<std::size_t>(std::count(owner_.begin(), owner_.end(), none));
}

cluster_error classify(std::string_view message) {
  cluster_error e;
  auto rest = message;
  auto code = word(rest);
  if (code == "MOVED" || code == "ASK") {
    auto slot = to_int<std::uint16_t>(word(rest));
    auto to = parse_address(word(rest));
    if (!slot || *slot >= cluster_slots || !to) return e;  // not a redirect Redis writes: the answer as it is
    e.kind = code == "MOVED" ? cluster_error::moved : cluster_error::ask;
    e.slot = *slot;
    e.to = std::move(*to);
  } else if (code == "TRYAGAIN") {
    e.kind = cluster_error::try_again;
  } else if (code == "CLUSTERDOWN") {
    e.kind = cluster_error::cluster_down;
  } else if (code == "LOADING") {
    e.kind = cluster_error::loading;
  }
  return e;
}

cluster_route::cluster_route(slot_map& map, std::optional<std::uint16_t> slot, node_address any,
                             std::chrono::steady_clock::time_point deadline, bool follow_ask)
    : map_(map), slot_(slot), any_(std::move(any)), deadline_(deadline), follow_ask_(follow_ask) {}

cluster_route::action cluster_route::next(std::chrono::steady_clock::time_point now) {
  action a;
  if (ask_to_) {
    a.kind = action::send;
    a.node = *ask_to_;
    a.asking = true;
    sent_to_ = a.node;
    return a;
  }
  if (!slot_) {
    a.kind = action::send;
    a.node = any_;
    return a;
  }
  auto* owner = map_.owner(*slot_);
  if (owner == nullptr) {
    a = retry_later(fmt::format("no node serves slot {}", *slot_), now);
    a.refresh = true;
    return a;
  }
  a.kind = action::send;
  a.node = *owner;
  sent_to_ = a.node;
  return a;
}

cluster_route::action cluster_route::on_reply(const reply& r, std::chrono::steady_clock::time_point now) {
  ask_to_.reset();  // an ASK redirects one send
  action a;
  if (!r.is_error()) {
    a.kind = action::done;
    return a;
  }
  auto e = classify(r.error_message());
  // A redirect without a host ("MOVED 3999 :6381", a cluster that announces no endpoints) names
  // a node at the host the request was sent to.
  if (e.to.host.empty()) e.to.host = sent_to_.host;
  if (e.kind != cluster_error::moved) moved_ = 0;
  switch (e.kind) {
    case cluster_error::other: a.kind = action::done; return a;
    case cluster_error::ask:
      if (!follow_ask_) return retry_later(r.error_message(), now);
      [[fallthrough]];
    case cluster_error::moved:
      if (++redirects_ > max_redirects) {
        a.kind = action::fail;
        a.error = fmt::format("redirected more than {} times (last: {})", max_redirects, r.error_message());
        a.refresh = true;
        return a;
      }
      if (e.kind == cluster_error::moved) {
        map_.assign(e.slot, e.to);
        if (++moved_ > 1 && now + backoff_ <= deadline_) {
          // Sent on again at once: the nodes disagree for now (a slot's move told to one and not
          // yet to the other, or gossip on its way). Wait, as after TRYAGAIN, rather than bounce;
          // so close to the deadline that a wait would pass it, go at once.
          a = retry_later(r.error_message(), now);
          a.refresh = true;
          return a;
        }
        a = next(now);
        a.refresh = true;
      } else {
        ask_to_ = std::move(e.to);
        a = next(now);
      }
      return a;
    case cluster_error::try_again:
    case cluster_error::cluster_down:
    case cluster_error::loading: return retry_later(r.error_message(), now);
  }
  a.kind = action::done;
  return a;
}

cluster_route::action cluster_route::on_unreachable(std::string_view why, std::chrono::steady_clock::time_point now) {
  ask_to_.reset();
  moved_ = 0;
  auto a = retry_later(why, now);
  a.refresh = true;
  return a;
}

cluster_route::action cluster_route::retry_later(std::string_view why, std::chrono::steady_clock::time_point now) {
  action a;
  if (now + backoff_ > deadline_) {
    a.kind = action::fail;
    a.error = fmt::format("{} (still so at the request's deadline)", why);
    return a;
  }
  a.kind = action::wait;
  a.delay = backoff_;
  backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
  return a;
}

}  // namespace jobrt::redis::detail
