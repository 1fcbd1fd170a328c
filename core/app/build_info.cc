#include "core/app/build_info.h"

#include <idemsink/plugin_abi.h>
#include <librdkafka/rdkafka.h>
#include <mysql.h>

namespace idemsink::app {

std::map<std::string, std::string> build_info() {
  return {{"version", IDEMSINK_VERSION},
          {"commit", IDEMSINK_GIT_COMMIT},
          {"librdkafka", rd_kafka_version_str()},
          {"connector_c", mysql_get_client_info()},
          {"plugin_abi", std::to_string(IDEMSINK_ABI_MAJOR) + "." + std::to_string(IDEMSINK_ABI_MINOR)}};
}

std::string version_text() {
  const auto info = build_info();
  return "idemsink " + info.at("version") + " (commit " + info.at("commit") + ")\n" + "librdkafka " +
         info.at("librdkafka") + "\n" + "MariaDB Connector/C " + info.at("connector_c") + "\n" + "plugin ABI " +
         info.at("plugin_abi") + "\n";
}

}  // namespace idemsink::app
