// What the benchmarks read from the server's own counters: INFO all, parsed once for every
// driver (jobrt's client and the hand-made design's hiredis one send the command themselves).
#pragma once

#include <map>
#include <sstream>
#include <string>

namespace jobrt::bench {

struct server_stats {
  double cpu_seconds = 0;  // used_cpu_user + used_cpu_sys
  long commands = 0;       // every command but INFO and CONFIG (commands inside scripts count)
  double usec = 0;         // their server time
  long used_memory = 0;
  std::map<std::string, std::string> commandstats;  // cmdstat_<name> → its line
};

// "field:value" lines of an INFO reply.
inline std::map<std::string, std::string> info_fields(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto colon = line.find(':');
    if (colon != std::string::npos && line[0] != '#') out[line.substr(0, colon)] = line.substr(colon + 1);
  }
  return out;
}

// The reply to INFO all.
inline server_stats parse_server_stats(const std::string& info_all) {
  auto f = info_fields(info_all);
  server_stats s;
  s.cpu_seconds = std::stod(f["used_cpu_user"]) + std::stod(f["used_cpu_sys"]);
  s.used_memory = std::stol(f["used_memory"]);
  for (auto& [k, v] : f) {
    if (!k.starts_with("cmdstat_")) continue;
    s.commandstats[k] = v;
    if (k == "cmdstat_info" || k.starts_with("cmdstat_config")) continue;
    s.commands += std::stol(v.substr(v.find("calls=") + 6));
    s.usec += std::stod(v.substr(v.find("usec=") + 5));
  }
  return s;
}

}  // namespace jobrt::bench
