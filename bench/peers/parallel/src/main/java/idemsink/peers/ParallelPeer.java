package idemsink.peers;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLIntegrityConstraintViolationException;
import java.sql.Statement;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * The peer built for slow calls: Confluent's Parallel Consumer with
 * ProcessingOrder.KEY (records of one key in order, different keys at once),
 * its concurrency sized by Little's law (rate x P99 latency; the bench passes
 * it), the claim table of seed 003 (INSERT on the unique key, a duplicate key
 * is an idempotent hit; the RPC; mark done) and the RPC made from its worker
 * pool with a 2-second timeout. A failed record is retried by the library
 * after its retry delay (it has no DLQ of its own).
 *
 * <p>Arguments: bootstrap group topic jdbc-url inventory-url concurrency
 */
public final class ParallelPeer {
  private static final Pattern ORDER = Pattern.compile("\"order_id\"\\s*:\\s*\"([^\"]*)\"");

  public static void main(String[] args) throws Exception {
    final String bootstrap = args[0], group = args[1], topic = args[2], jdbcUrl = args[3], inventory = args[4];
    final int concurrency = Integer.parseInt(args[5]);

    HikariConfig pool = new HikariConfig();
    pool.setJdbcUrl(jdbcUrl);
    pool.setUsername("root");
    pool.setMaximumPoolSize(Math.min(concurrency, 64));
    HikariDataSource db = new HikariDataSource(pool);
    try (Connection c = db.getConnection(); Statement s = c.createStatement()) {
      s.execute("CREATE TABLE IF NOT EXISTS peer_claim (biz_key VARCHAR(255) PRIMARY KEY, status VARCHAR(16) NOT NULL, "
          + "created_at TIMESTAMP(3) DEFAULT NOW(3))");
    }
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();

    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "200");
    p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
    KafkaConsumer<String, String> consumer =
        new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer());
    var options = ParallelConsumerOptions.<String, String>builder()
        .ordering(ParallelConsumerOptions.ProcessingOrder.KEY)
        .maxConcurrency(concurrency)
        .consumer(consumer)
        .commitMode(ParallelConsumerOptions.CommitMode.PERIODIC_CONSUMER_SYNC)
        // Its reflective look at the client's auto-commit setting fails on
        // kafka-clients 3.9; auto-commit is off above, as the check wants.
        .ignoreReflectiveAccessExceptionsForAutoCommitDisabledCheck(true)
        .build();
    ParallelStreamProcessor<String, String> processor = ParallelStreamProcessor.createEosStreamProcessor(options);
    processor.subscribe(List.of(topic));
    processor.poll(context -> {
      ConsumerRecord<String, String> record = context.getSingleConsumerRecord();
      String order = orderId(record.value());
      try (Connection c = db.getConnection()) {
        try (PreparedStatement claim = c.prepareStatement("INSERT INTO peer_claim (biz_key, status) VALUES (?, 'pending')")) {
          claim.setString(1, order);
          claim.executeUpdate();
        } catch (SQLIntegrityConstraintViolationException hit) {
          return; // claimed before: an idempotent hit
        }
        reserve(http, inventory, order, record.value());
        try (PreparedStatement done = c.prepareStatement("UPDATE peer_claim SET status = 'done' WHERE biz_key = ?")) {
          done.setString(1, order);
          done.executeUpdate();
        }
      } catch (RuntimeException e) {
        throw e;
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    Runtime.getRuntime().addShutdownHook(new Thread(processor::closeDrainFirst));
    Thread.currentThread().join();
  }

  static void reserve(HttpClient http, String inventory, String order, String value) throws Exception {
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
