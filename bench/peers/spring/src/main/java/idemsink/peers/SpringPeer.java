package idemsink.peers;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.dao.DuplicateKeyException;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.support.Acknowledgment;
import org.springframework.util.backoff.FixedBackOff;

/**
 * A {@code @KafkaListener} service as the Spring Kafka reference guide builds
 * one: container concurrency = partitions (16), max.poll.records 200, manual
 * acknowledgement, a DefaultErrorHandler that retries a failed record three
 * times and then publishes it to "<topic>.DLT" (one partition) with the
 * DeadLetterPublishingRecoverer. Two dedup variants (peer.mode):
 *
 * <ul>
 *   <li>select-insert (seed 002): SELECT the message id from a dedup table
 *       with a unique key; found: skip; else INSERT it, call the RPC, ack.
 *   <li>claim (seed 003): INSERT a claim row on the unique key (a duplicate
 *       key is an idempotent hit), call the RPC, mark the claim done, ack.
 * </ul>
 *
 * The RPC is the fake inventory service (POST /inventory/reserve) with a
 * 2-second timeout, as seed 002's; its request_id is new on every call: the
 * service has no token of ours to recognise.
 */
@SpringBootApplication
public class SpringPeer {
  private static final Pattern ORDER = Pattern.compile("\"order_id\"\\s*:\\s*\"([^\"]*)\"");

  private final JdbcTemplate jdbc;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();
  private final String inventory;
  private final String mode;

  public SpringPeer(JdbcTemplate jdbc, @Value("${peer.inventory}") String inventory, @Value("${peer.mode}") String mode) {
    this.jdbc = jdbc;
    this.inventory = inventory;
    this.mode = mode;
    jdbc.execute("CREATE TABLE IF NOT EXISTS peer_dedup (msg_id VARCHAR(255) PRIMARY KEY, created_at TIMESTAMP(3) DEFAULT NOW(3))");
    jdbc.execute("CREATE TABLE IF NOT EXISTS peer_claim (biz_key VARCHAR(255) PRIMARY KEY, status VARCHAR(16) NOT NULL, "
        + "created_at TIMESTAMP(3) DEFAULT NOW(3))");
  }

  public static void main(String[] args) {
    SpringApplication.run(SpringPeer.class, args);
  }

  @Bean
  ConcurrentKafkaListenerContainerFactory<String, String> kafkaListenerContainerFactory(
      ConsumerFactory<String, String> consumers, KafkaTemplate<String, String> template) {
    var factory = new ConcurrentKafkaListenerContainerFactory<String, String>();
    factory.setConsumerFactory(consumers);
    factory.setConcurrency(16);
    factory.getContainerProperties().setAckMode(ContainerProperties.AckMode.MANUAL);
    factory.setCommonErrorHandler(
        new DefaultErrorHandler(
            // One dead-letter partition, named as the bench reads it: "<topic>.DLT".
            new DeadLetterPublishingRecoverer(template, (rec, ex) -> new TopicPartition(rec.topic() + ".DLT", 0)),
            new FixedBackOff(500L, 3L)));
    return factory;
  }

  @KafkaListener(topics = "${peer.topic}")
  public void onRecord(ConsumerRecord<String, String> record, Acknowledgment ack) throws Exception {
    final String order = orderId(record.value());
    if ("select-insert".equals(mode)) {
      if (jdbc.queryForList("SELECT 1 FROM peer_dedup WHERE msg_id = ?", order).isEmpty()) {
        try {
          jdbc.update("INSERT INTO peer_dedup (msg_id) VALUES (?)", order);
        } catch (DuplicateKeyException raced) {
          ack.acknowledge(); // another consumer inserted it between our SELECT and INSERT
          return;
        }
        reserve(order, record.value());
      }
    } else {
      try {
        jdbc.update("INSERT INTO peer_claim (biz_key, status) VALUES (?, 'pending')", order);
      } catch (DuplicateKeyException hit) {
        ack.acknowledge(); // claimed before: an idempotent hit
        return;
      }
      reserve(order, record.value());
      jdbc.update("UPDATE peer_claim SET status = 'done' WHERE biz_key = ?", order);
    }
    ack.acknowledge();
  }

  private void reserve(String order, String value) throws Exception {
    String body = "{\"request_id\":\"" + UUID.randomUUID() + "\",\"order_id\":\"" + order + "\",\"order\":" + value + "}";
    HttpRequest req = HttpRequest.newBuilder(URI.create(inventory + "/inventory/reserve"))
        .timeout(Duration.ofSeconds(2))
        .header("Content-Type", "application/json")
        .POST(HttpRequest.BodyPublishers.ofString(body))
        .build();
    HttpResponse<String> res = http.send(req, HttpResponse.BodyHandlers.ofString());
    if (res.statusCode() / 100 != 2) throw new IllegalStateException("inventory answered " + res.statusCode());
  }

  static String orderId(String value) {
    Matcher m = ORDER.matcher(value == null ? "" : value);
    if (!m.find()) throw new IllegalArgumentException("no order_id in " + value);
    return m.group(1);
  }
}
