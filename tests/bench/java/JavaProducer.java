// The anchor for rigd's uplink benchmark: the official Apache Pulsar Java client
// (pulsar-client-original, from the broker's own Maven Central dependency set), driven the way
// pulsar-perf's PerformanceProducer drives it: async sends, a bounded number outstanding,
// latency from sendAsync to its completion. (pulsar-perf itself, org.apache.pulsar:pulsar-testclient,
// is not served by the Maven Central this project can reach.)
//
// Each message is what rigd sends for a frame (SPEC.md "Pulsar wire format"): key = the 33 ms
// bucket of its capture time, event time, the nine properties of a binary serial record, and with
// batching the key-based batcher (a batch never mixes keys, as rigd's: Key_Shared consumers stay
// correct). Before 2026-12-04 the anchor sent bare payloads into key-mixing batches, which is not
// the same work (docs/PERFORMANCE.md "The uplink bench as medians").
//
// usage: JavaProducer SERVICE_URL TOPIC_PREFIX MAX_PENDING SIZE:COUNT:BATCHING(true|false)...
// One row per SIZE:COUNT:BATCHING, each a producer of its own on TOPIC_PREFIX-SIZE-BATCHING, all in
// one JVM and client (its start is seconds, more than a smoke row's sends); one JSON line per row:
// {"client":"java","size":..,"count":..,"secs":..,"msg_per_s":..,"mb_per_s":..,"p50_ms":..,"p99_ms":..}
import java.util.Arrays;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.pulsar.client.api.BatcherBuilder;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;

public class JavaProducer {
    public static void main(String[] args) throws Exception {
        String url = args[0], prefix = args[1];
        int maxPending = Integer.parseInt(args[2]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            for (String row : Arrays.copyOfRange(args, 3, args.length)) {
                String[] f = row.split(":");
                int size = Integer.parseInt(f[0]);
                boolean batching = Boolean.parseBoolean(f[2]);
                run(client, prefix + "-" + size + "-" + batching, size, Integer.parseInt(f[1]), batching, maxPending);
            }
        }
    }

    static void run(PulsarClient client, String topic, int size, int count, boolean batching, int maxPending)
            throws Exception {
        Producer<byte[]> producer = client.newProducer()
                .topic(topic)
                .enableBatching(batching)
                .batcherBuilder(BatcherBuilder.KEY_BASED)
                .batchingMaxPublishDelay(1, TimeUnit.MILLISECONDS)
                .enableChunking(!batching)
                .compressionType(CompressionType.NONE)
                .maxPendingMessages(maxPending)
                .blockIfQueueFull(true)
                .sendTimeout(0, TimeUnit.SECONDS)
                .create();
        byte[] payload = new byte[size];
        Arrays.fill(payload, (byte) 0x5a);
        long[] latNs = new long[count];
        Semaphore window = new Semaphore(maxPending);
        AtomicLong failed = new AtomicLong();
        long start = System.nanoTime();
        for (int i = 0; i < count; i++) {
            window.acquire();
            final int idx = i;
            final long t0 = System.nanoTime();
            long captureNs = System.currentTimeMillis() * 1_000_000L;
            long bucket = captureNs / 1_000_000L / 33;
            producer.newMessage()
                    .key(Long.toString(bucket))
                    .eventTime(captureNs / 1_000_000L)
                    .property("rig", "bench")
                    .property("source", "bench")
                    .property("modality", "serial")
                    .property("seq", Integer.toString(i))
                    .property("capture-ns", Long.toString(captureNs))
                    .property("bucket", Long.toString(bucket))
                    .property("bucket-ms", "33")
                    .property("clock", "unsynced")
                    .property("content-type", "application/octet-stream")
                    .value(payload)
                    .sendAsync().whenComplete((id, err) -> {
                latNs[idx] = System.nanoTime() - t0;
                if (err != null) failed.incrementAndGet();
                window.release();
            });
        }
        producer.flush();
        window.acquire(maxPending);
        double secs = (System.nanoTime() - start) / 1e9;
        Arrays.sort(latNs);
        double p50 = latNs[count / 2] / 1e6, p99 = latNs[(int) Math.min(count - 1, (long) count * 99 / 100)] / 1e6;
        System.out.printf("{\"client\":\"java\",\"size\":%d,\"count\":%d,\"failed\":%d,\"secs\":%.3f,\"msg_per_s\":%.1f,\"mb_per_s\":%.2f,\"p50_ms\":%.3f,\"p99_ms\":%.3f}%n",
                size, count, failed.get(), secs, count / secs, (double) count * size / secs / 1e6, p50, p99);
        producer.close();
    }
}
