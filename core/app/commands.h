// The CLI's commands, one function each; main.cc only parses arguments.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"

namespace idemsink::app {

int run(const config::Config& cfg);
int check_config(const config::Config& cfg);
int schema(const config::Config& cfg, bool apply);
int dev_kafka(int brokers, const std::vector<std::string>& topics, int control_port);

}  // namespace idemsink::app
