#include "core/operate/operator_log.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>

#include "core/common/util.h"

namespace idemsink::operate {

Actor cli_actor() {
  const char* user = std::getenv("USER");
  std::string name = user != nullptr && *user != '\0' ? user : "";
  if (name.empty())
    if (const passwd* pw = ::getpwuid(::getuid())) name = pw->pw_name;
  return Actor{"cli:" + (name.empty() ? "uid " + std::to_string(::getuid()) : name), "admin"};
}

const char* OperatorLog::schema() {
  return R"(CREATE TABLE IF NOT EXISTS idemsink_operator_log (
  id        BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  at        DATETIME(3)     NOT NULL,
  who       VARCHAR(128)    NOT NULL COMMENT 'admin token name, or cli:<user>',
  role      VARCHAR(16)     NOT NULL,
  action    VARCHAR(64)     NOT NULL,
  route     VARCHAR(64)     NULL,
  records   MEDIUMTEXT      NOT NULL COMMENT 'JSON: the keys, tokens or outbox ids the action touched',
  note      VARCHAR(1024)   NOT NULL,
  result    VARCHAR(1024)   NOT NULL,
  PRIMARY KEY (id),
  KEY idx_route (route, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4)";
}

void OperatorLog::append(db::Connection& c, const Actor& who, const LogEntry& e) {
  const std::string records = e.records.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  c.execute("INSERT INTO idemsink_operator_log (at, who, role, action, route, records, note, result) VALUES (NOW(3), " +
            c.quote(sanitize_utf8(who.name, 128)) + ", " + c.quote(who.role) + ", " + c.quote(e.action) + ", " +
            (e.route.empty() ? std::string("NULL") : c.quote(e.route)) + ", " + c.quote(records) + ", " +
            c.quote(sanitize_utf8(e.note, 1024)) + ", " + c.quote(sanitize_utf8(e.result, 1024)) + ")");
}

std::vector<LoggedAction> OperatorLog::list(db::Connection& c, const std::string& route, size_t limit,
                                            uint64_t before_id) {
  std::string where = "1";
  if (!route.empty()) where += " AND route = " + c.quote(route);
  if (before_id > 0) where += " AND id < " + std::to_string(before_id);
  std::vector<LoggedAction> out;
  for (auto& r : c.query("SELECT id, DATE_FORMAT(at, '%Y-%m-%dT%H:%i:%s.%fZ'), who, role, action, IFNULL(route, ''), "
                         "records, note, result FROM idemsink_operator_log WHERE " +
                         where + " ORDER BY id DESC LIMIT " + std::to_string(limit))) {
    LoggedAction a;
    a.id = std::stoull(*r[0]);
    a.at = *r[1];
    a.who = *r[2];
    a.role = *r[3];
    a.entry.action = *r[4];
    a.entry.route = *r[5];
    a.entry.records = nlohmann::json::parse(*r[6], nullptr, false);
    a.entry.note = *r[7];
    a.entry.result = *r[8];
    out.push_back(std::move(a));
  }
  return out;
}

nlohmann::json to_json(const LoggedAction& a) {
  return {{"id", a.id},
          {"at", a.at},
          {"who", a.who},
          {"role", a.role},
          {"action", a.entry.action},
          {"route", a.entry.route},
          {"records", a.entry.records},
          {"note", a.entry.note},
          {"result", a.entry.result}};
}

}  // namespace idemsink::operate
