// What this binary is: `idemsink --version`, the start-up log line and the
// idemsink_build_info gauge say the same.
#pragma once

#include <map>
#include <string>

namespace idemsink::app {

/// version, commit, librdkafka, connector_c (MariaDB Connector/C), plugin_abi.
std::map<std::string, std::string> build_info();

/// One line per item, for --version.
std::string version_text();

}  // namespace idemsink::app
