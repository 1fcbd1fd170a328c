#include "core/kafka/client_health.h"

#include <librdkafka/rdkafka.h>

#include <nlohmann/json.hpp>

#include "core/common/log.h"

namespace idemsink::kafka {

void ClientHealth::on_statistics(std::string_view json) {
  Snapshot next;
  try {
    const auto j = nlohmann::json::parse(json);
    next.stats_seen = true;
    const auto brokers = j.find("brokers");
    if (brokers != j.end() && brokers->is_object())
      for (const auto& [name, b] : brokers->items()) {
        // Bootstrap entries (nodeid -1) are replaced by the real brokers once
        // metadata arrives; the internal one is librdkafka's own.
        if (b.value("nodeid", -1) < 0 || b.value("source", std::string()) == "internal") continue;
        Broker out;
        out.up = b.value("state", std::string()) == "UP";
        if (b.contains("rtt")) out.rtt_seconds = b["rtt"].value("avg", int64_t{0}) / 1e6;
        next.brokers[name] = out;
      }
    int64_t fetchq = 0;
    const auto topics = j.find("topics");
    if (topics != j.end() && topics->is_object())
      for (const auto& [tname, t] : topics->items()) {
        const auto parts = t.find("partitions");
        if (parts == t.end() || !parts->is_object()) continue;
        for (const auto& [pname, p] : parts->items())
          if (p.is_object()) fetchq += p.value("fetchq_cnt", int64_t{0});
      }
    next.fetch_queue_messages = fetchq;
    if (j.contains("cgrp")) {
      const auto& g = j["cgrp"];
      next.group_state = g.value("state", std::string());
      next.join_state = g.value("join_state", std::string());
      next.rebalances = g.value("rebalance_cnt", int64_t{0});
    }
  } catch (const std::exception& e) {
    std::lock_guard lk(mu_);
    if (!parse_error_logged_) spdlog::warn("kafka: unreadable statistics report ignored: {}", e.what());
    parse_error_logged_ = true;
    return;
  }
  std::lock_guard lk(mu_);
  bool any_up = false;
  for (const auto& [name, b] : next.brokers) any_up = any_up || b.up;
  // A broker seen up again clears an earlier outage or refused login.
  next.error = any_up ? std::string() : s_.error;
  if (any_up) auth_error_ = false;
  s_ = std::move(next);
}

void ClientHealth::set_login(LoginSettings login) {
  std::lock_guard lk(mu_);
  login_ = std::move(login);
}

void ClientHealth::on_error(int err, const std::string& reason) {
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  std::lock_guard lk(mu_);
  // The cluster unreachable, or refusing this client's login. (A missing
  // topic or group ACL shows as no partitions assigned, and in the log.)
  const auto refusal = login_refusal(code, reason, login_);
  const bool blocking = code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || refusal.has_value();
  // Without statistics nothing would ever clear it: readiness then leaves
  // Kafka out (the log still has the error).
  if (!blocking || !stats_enabled_) return;
  // "All brokers down" follows a refused login: the login is the cause to show.
  if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && auth_error_) return;
  auth_error_ = refusal.has_value();
  s_.error =
      std::string(rd_kafka_err2name(code)) + ": " + (refusal ? "the cluster refused this client: " + *refusal : reason);
  for (auto& [name, b] : s_.brokers) b.up = false;
}

void ClientHealth::statistics_disabled() {
  std::lock_guard lk(mu_);
  stats_enabled_ = false;
}

ClientHealth::Snapshot ClientHealth::snapshot() const {
  std::lock_guard lk(mu_);
  return s_;
}

std::string ClientHealth::problem() const {
  std::lock_guard lk(mu_);
  if (!s_.error.empty()) return "kafka: " + s_.error;
  if (!stats_enabled_) return "";
  if (!s_.stats_seen) return "kafka: no statistics report yet (the client is starting)";
  for (const auto& [name, b] : s_.brokers)
    if (b.up) return "";
  return "kafka: no broker is up";
}

}  // namespace idemsink::kafka
