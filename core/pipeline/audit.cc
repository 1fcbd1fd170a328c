#include "core/pipeline/audit.h"

#include <librdkafka/rdkafka.h>

#include <map>
#include <set>

#include "core/db/connection.h"
#include "core/kafka/client.h"
#include "core/kafka/consumer.h"
#include "core/pipeline/key_extractor.h"

namespace idemsink::pipeline {
namespace {

using db::Connection;

kafka::HandlePtr consumer_handle(const config::Config& cfg, const std::string& group) {
  std::map<std::string, std::string> props{{"enable.auto.commit", "false"}};
  for (const auto& [k, v] : cfg.kafka.properties) props[k] = v;
  for (const auto& [k, v] : cfg.kafka.consumer_properties) props[k] = v;
  props["bootstrap.servers"] = cfg.kafka.bootstrap_servers;
  props["group.id"] = group;
  props["enable.auto.commit"] = "false";
  rd_kafka_conf_t* conf = kafka::make_conf(props);
  kafka::route_librdkafka_logs(conf);
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    throw kafka::KafkaError(std::string("audit consumer: ") + err);
  }
  return kafka::HandlePtr(rk);
}

int partition_count(rd_kafka_t* rk, const std::string& topic) {
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  auto err = rd_kafka_metadata(rk, 0, t, &md, 10000);
  rd_kafka_topic_destroy(t);
  if (err) throw kafka::KafkaError("metadata of " + topic + ": " + rd_kafka_err2str(err));
  int n = md->topic_cnt == 1 && !md->topics[0].err ? md->topics[0].partition_cnt : 0;
  rd_kafka_metadata_destroy(md);
  return n;
}

struct Seen {
  int64_t offset;
  std::optional<std::string> biz_key;  // nullopt: no key could be extracted
};

// Accounts for one batch of records of one partition.
void account(Connection& c, const std::string& route, PartitionAudit& pa, const std::vector<Seen>& seen) {
  std::set<int64_t> in_outbox;
  std::string offsets;
  for (const auto& s : seen) offsets += (offsets.empty() ? "" : ",") + std::to_string(s.offset);
  for (auto& r : c.query("SELECT src_offset FROM idemsink_dlq_outbox WHERE src_topic = " + c.quote(pa.topic) +
                         " AND src_partition = " + std::to_string(pa.partition) + " AND src_offset IN (" + offsets + ")"))
    in_outbox.insert(std::stoll(*r[0]));
  std::set<std::string> keys, terminal;
  for (const auto& s : seen)
    if (s.biz_key) keys.insert(*s.biz_key);
  if (!keys.empty()) {
    std::string list;
    for (const auto& k : keys) list += (list.empty() ? "" : ",") + Connection::hex(k);
    for (auto& r : c.query("SELECT biz_key FROM idemsink_claim WHERE namespace = " + Connection::hex(route) +
                           " AND biz_key IN (" + list + ") AND status IN (2, 3, 4)"))
      terminal.insert(*r[0]);
  }
  for (const auto& s : seen) {
    ++pa.consumed;
    if (in_outbox.count(s.offset)) {
      ++pa.by_outbox;
    } else if (s.biz_key && terminal.count(*s.biz_key)) {
      ++pa.by_claim;
    } else {
      pa.missing.push_back(s.offset);
    }
  }
}

}  // namespace

bool AuditReport::ok() const {
  for (const auto& p : partitions)
    if (!p.missing.empty()) return false;
  return true;
}

void AuditReport::print(std::ostream& os) const {
  int64_t consumed = 0, missing = 0;
  for (const auto& p : partitions) {
    os << p.topic << "[" << p.partition << "] offsets " << p.low << ".." << p.committed << ": " << p.consumed
       << " records, " << p.by_claim << " by claim, " << p.by_outbox << " by DLQ outbox";
    if (!p.missing.empty()) {
      os << ", " << p.missing.size() << " UNACCOUNTED (first: ";
      for (size_t i = 0; i < p.missing.size() && i < 10; ++i) os << (i ? ", " : "") << p.missing[i];
      os << ")";
    }
    os << "\n";
    consumed += p.consumed;
    missing += static_cast<int64_t>(p.missing.size());
  }
  os << (missing == 0 ? "audit ok: " : "audit FAILED: ") << consumed << " committed records, " << missing
     << " unaccounted\n";
}

AuditReport audit(const config::Config& cfg) {
  AuditReport report;
  auto group = consumer_handle(cfg, cfg.kafka.group_id);          // reads the group's commits, never joins
  auto reader = consumer_handle(cfg, cfg.kafka.group_id + ".audit");  // assigns partitions, never commits
  Connection db(cfg.database);
  for (const auto& route : cfg.routes) {
    KeyExtractor extractor(route);
    std::vector<std::string> topics{route.topic};
    for (size_t tier = 1; tier <= route.retry.topics.size(); ++tier)
      topics.push_back(route.retry.topic_name(route.topic, tier));
    for (const auto& topic : topics) {
      const int parts = partition_count(group.get(), topic);
      for (int p = 0; p < parts; ++p) {
        PartitionAudit pa;
        pa.topic = topic;
        pa.partition = p;
        kafka::PartitionListPtr l(rd_kafka_topic_partition_list_new(1));
        rd_kafka_topic_partition_list_add(l.get(), topic.c_str(), p);
        if (auto err = rd_kafka_committed(group.get(), l.get(), 10000))
          throw kafka::KafkaError("committed offsets of " + topic + ": " + rd_kafka_err2str(err));
        pa.committed = std::max<int64_t>(0, l->elems[0].offset);
        int64_t hi = 0;
        if (auto err = rd_kafka_query_watermark_offsets(group.get(), topic.c_str(), p, &pa.low, &hi, 10000))
          throw kafka::KafkaError("watermarks of " + topic + ": " + rd_kafka_err2str(err));
        if (pa.committed > pa.low) {
          l->elems[0].offset = pa.low;
          rd_kafka_assign(reader.get(), l.get());
          std::vector<Seen> batch;
          int64_t next = pa.low;
          while (next < pa.committed) {
            rd_kafka_message_t* m = rd_kafka_consumer_poll(reader.get(), 5000);
            if (m == nullptr) throw kafka::KafkaError("audit: no records from " + topic + " while reading");
            kafka::MessagePtr msg(m);
            if (msg->err) {
              if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) break;
              throw kafka::KafkaError(std::string("audit: ") + rd_kafka_message_errstr(msg.get()));
            }
            next = msg->offset + 1;
            if (msg->offset >= pa.committed) break;
            auto key = extractor.extract(msg.get());
            batch.push_back({msg->offset, std::holds_alternative<std::string>(key)
                                              ? std::optional(std::get<std::string>(key))
                                              : std::nullopt});
            if (batch.size() == 500) {
              account(db, route.name, pa, batch);
              batch.clear();
            }
          }
          if (!batch.empty()) account(db, route.name, pa, batch);
          rd_kafka_assign(reader.get(), nullptr);
        }
        report.partitions.push_back(std::move(pa));
      }
    }
  }
  return report;
}

}  // namespace idemsink::pipeline
