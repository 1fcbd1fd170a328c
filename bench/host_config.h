// The head of every host benchmark's configuration: the [host], [kafka] and
// [database] tables, to which each benchmark adds its own [claim] or routes.
#pragma once

#include <string>

namespace idemsink::bench {

struct HostHead {
  std::string id;
  int admin_port = 0;
  std::string bootstrap;
  std::string group;
  std::string socket;  // the MariaDB server's
  std::string database;
  int max_in_flight = 2000;
  int max_poll_records = 500;
};

/// TOML text ending inside [database] (socket and database set), so the next
/// table or route follows it.
inline std::string host_toml(const HostHead& h) {
  return "[host]\nid = \"" + h.id + "\"\nmax_in_flight = " + std::to_string(h.max_in_flight) +
         "\nadmin_listen = \"127.0.0.1:" + std::to_string(h.admin_port) + "\"\n[kafka]\nbootstrap_servers = \"" +
         h.bootstrap + "\"\ngroup_id = \"" + h.group + "\"\nmax_poll_records = " + std::to_string(h.max_poll_records) +
         "\n[kafka.consumer]\n\"session.timeout.ms\" = \"6000\"\n[kafka.properties]\n\"log_level\" = \"3\"\n"
         "[database]\nsocket = \"" +
         h.socket + "\"\ndatabase = \"" + h.database + "\"\n";
}

}  // namespace idemsink::bench
