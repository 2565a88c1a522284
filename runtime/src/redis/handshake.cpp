#include "redis/handshake.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace jobrt::redis::detail {

handshake::handshake(const config& cfg) {
  if (!cfg.password.empty()) {
    if (cfg.username.empty())
      commands_.push("AUTH", cfg.password);
    else
      commands_.push("AUTH", cfg.username, cfg.password);
    names_.push_back("AUTH");
  }
  if (cfg.database != 0) {
    commands_.push("SELECT", cfg.database);
    names_.push_back("SELECT");
  }
  if (!cfg.client_name.empty()) {
    commands_.push("CLIENT", "SETNAME", cfg.client_name);
    names_.push_back("CLIENT SETNAME");
  }
  if (!cfg.sentinels.empty()) {  // the primary the sentinels named may be a replica by now
    commands_.push("ROLE");
    names_.push_back("ROLE");
  }
  commands_.push("CLIENT", "ID");
  names_.push_back("CLIENT ID");
  commands_.push("PING");
  names_.push_back("PING");
}

handshake::outcome handshake::check(const std::vector<reply>& replies) const {
  if (replies.size() != names_.size())
    throw std::invalid_argument(fmt::format("handshake: {} replies to {} commands", replies.size(), names_.size()));
  outcome out;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == "ROLE") {
      // ["master", offset, replicas] at a primary; "slave" or "sentinel" first elsewhere. A user
      // that may not run ROLE (it is @dangerous) is not refused: READONLY and the sentinels'
      // +switch-master still move the connection off a replica.
      const auto& r = replies[i];
      if (r.is_error()) continue;
      std::string role = "nothing readable";
      if (r.kind() == reply_kind::array && !r.as_array().empty() && r.as_array().front().kind() == reply_kind::string)
        role = r.as_array().front().as_string();
      if (role == "master") continue;
      out.failure = connect_failure::not_ready;
      out.why = fmt::format("the server is not the primary (ROLE says '{}'): the sentinels are asked again", role);
      return out;
    }
    if (!replies[i].is_error()) continue;
    auto message = replies[i].error_message();
    if (names_[i] == "PING" && message.starts_with("LOADING")) {
      out.failure = connect_failure::not_ready;
      out.why = "the server is still loading its dataset (LOADING)";
      return out;
    }
    bool denied = names_[i] != "PING" || message.starts_with("NOPERM");
    out.failure = denied ? connect_failure::denied : connect_failure::not_ready;
    out.why = fmt::format("{} refused: {}", names_[i], message);
    return out;
  }
  out.client_id = replies[replies.size() - 2].as_integer();  // CLIENT ID, before PING
  return out;
}

}  // namespace jobrt::redis::detail
