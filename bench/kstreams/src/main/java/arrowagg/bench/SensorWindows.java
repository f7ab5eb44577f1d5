package arrowagg.bench;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.Suppressed.BufferConfig;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;

/**
 * The Kafka Streams peer: the tumbling-window aggregation as a Kafka Streams user writes it.
 *
 * <p>JSON rows in (one a message), re-keyed by (site, sensor) with {@code groupBy}, 10-second
 * tumbling windows on the rows' {@code ts} with the daemon's lateness as grace, the seed's
 * aggregates folded by {@code aggregate} into the default (RocksDB) window store, each window
 * held back by {@code suppress(untilWindowCloses)} until it closes, one JSON row per group
 * to the output topic; {@code exactly_once_v2} with a commit a second, one stream thread per
 * core. Prints
 * {@code {"first_input": seconds}} when the first row arrives; runs until SIGTERM.
 *
 * <pre>java arrowagg.bench.SensorWindows BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC APP_ID WINDOW_MS</pre>
 */
public final class SensorWindows {
    private static final ObjectMapper JSON = new ObjectMapper();

    /** One input row, as the JSON workers write it. */
    public record Reading(String site, String sensor, long ts, double reading_sum,
                          long reading_count, double reading_min, double reading_max,
                          double power, long error_count) {}

    /** A group's running aggregates in one window. */
    public static final class Totals {
        public double reading_sum;
        public long reading_count;
        public double reading_min = Double.POSITIVE_INFINITY;
        public double reading_max = Double.NEGATIVE_INFINITY;
        public double power;
        public long error_count;
        public long row_count;

        Totals add(Reading row) {
            reading_sum += row.reading_sum();
            reading_count += row.reading_count();
            reading_min = Math.min(reading_min, row.reading_min());
            reading_max = Math.max(reading_max, row.reading_max());
            power += row.power();
            error_count += row.error_count();
            row_count += 1;
            return this;
        }
    }

    /** One result row: a closed window's group. */
    public record Result(long window_start, long window_end, String site, String sensor,
                         double reading_sum, long reading_count, double reading_min,
                         double reading_max, double power, long error_count, long row_count) {
        static Result of(Windowed<String> window, Totals totals) {
            String[] keys = window.key().split("\\|", 2);
            return new Result(window.window().start(), window.window().end(), keys[0], keys[1],
                    totals.reading_sum, totals.reading_count, totals.reading_min,
                    totals.reading_max, totals.power, totals.error_count, totals.row_count);
        }
    }

    private SensorWindows() {}

    static <T> Serde<T> json(Class<T> type) {
        return Serdes.serdeFrom((topic, value) -> {
            try {
                return value == null ? null : JSON.writeValueAsBytes(value);
            } catch (IOException err) {
                throw new UncheckedIOException(err);
            }
        }, (topic, bytes) -> {
            try {
                return bytes == null ? null : JSON.readValue(bytes, type);
            } catch (IOException err) {
                throw new UncheckedIOException(err);
            }
        });
    }

    static Topology topology(String input, String output, long windowMs) {
        Serde<Reading> readings = json(Reading.class);
        AtomicBoolean first = new AtomicBoolean();
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), readings)
                        .withTimestampExtractor((record, partitionTime) ->
                                ((Reading) record.value()).ts()))
                .peek((key, row) -> {
                    if (first.compareAndSet(false, true)) {
                        System.out.printf("{\"first_input\": %.3f}%n",
                                System.currentTimeMillis() / 1000.0);
                        System.out.flush();
                    }
                })
                .groupBy((key, row) -> row.site() + "|" + row.sensor(),
                        Grouped.with("by-group", Serdes.String(), readings))
                // grace 0: the daemon's allowed_lateness_ms default
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(windowMs), Duration.ZERO))
                .aggregate(Totals::new, (key, row, totals) -> totals.add(row),
                        Materialized.with(Serdes.String(), json(Totals.class)))
                .suppress(Suppressed.untilWindowCloses(BufferConfig.unbounded()))
                .toStream()
                .map((window, totals) -> KeyValue.pair(window.key(), Result.of(window, totals)))
                .to(output, Produced.with(Serdes.String(), json(Result.class)));
        return builder.build();
    }

    static Properties settings(String bootstrap, String appId) throws IOException {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        // A transaction a second, as Flink's peer checkpoints: with exactly-once's default
        // (100 ms) each thread spends most of its time committing (one 200,000-row run
        // took 4x as long).
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        // A window of a million groups leaves suppress in one transaction: with the
        // exactly-once default (10 s) it outlived its timeout on a loaded machine, the
        // producer was fenced and the task restarted, over and over (no result in 900 s).
        // Flink's peer gives its transactions the same minute.
        props.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 60_000);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG,
                Runtime.getRuntime().availableProcessors());
        props.put(StreamsConfig.STATE_DIR_CONFIG,
                Files.createTempDirectory("kstreams-peer").toString());
        // one broker: the internal (repartition, changelog) topics cannot have three replicas
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        return props;
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        KafkaStreams streams = new KafkaStreams(
                topology(args[1], args[2], Long.parseLong(args[4])), settings(args[0], args[3]));
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean();
        streams.setUncaughtExceptionHandler(err -> {
            failed.set(true);
            err.printStackTrace();
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(20));
            streams.cleanUp();
        }));
        streams.start();
        stopped.await();
        System.exit(failed.get() ? 1 : 0);
    }
}
