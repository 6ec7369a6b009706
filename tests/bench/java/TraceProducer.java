// The official Apache Pulsar Java client as a contestant of tests/bench/links_trace.py: the trace
// rig's sources (two cameras, audio, serial) as a user would publish them with this client, which
// has no budget, no priorities and one connection per broker for all its producers. Each source is
// a producer on a thread of its own, sending a payload of its size at its rate, with the
// properties the bench's listener reads: `seq` (0, 1, ...) and `capture-ns` (when the tick ran,
// epoch ns). Large payloads (above 64 KiB) go chunked with batching off (the bench's broker takes
// messages of 256 KB at most), the small ones with the client's defaults (batching, 1 ms).
// sendTimeout 0 and blockIfQueueFull: nothing is dropped by the client; a source whose queue is
// full waits (its later ticks run late, so its capture times are when it could send).
//
// usage: TraceProducer SERVICE_URL TOPIC_PREFIX NAME:HZ:BYTES...
// stdout: `ready` once every producer is created, `err <source> <error>` per send failed. Runs
// until killed.
import java.util.Random;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.ProducerBuilder;
import org.apache.pulsar.client.api.PulsarClient;

public class TraceProducer {
    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        PulsarClient client = PulsarClient.builder().serviceUrl(args[0]).build();
        String prefix = args[1];
        for (int i = 2; i < args.length; i++) {
            String[] f = args[i].split(":");
            String name = f[0];
            double hz = Double.parseDouble(f[1]);
            int bytes = Integer.parseInt(f[2]);
            ProducerBuilder<byte[]> builder = client.newProducer()
                    .topic(prefix + name)
                    .sendTimeout(0, TimeUnit.SECONDS)
                    .blockIfQueueFull(true);
            if (bytes > 64 * 1024) {
                builder = builder.enableBatching(false).enableChunking(true);
            }
            Producer<byte[]> producer = builder.create();
            byte[] payload = new byte[bytes];
            new Random(i).nextBytes(payload);
            long[] seq = {0};
            ScheduledExecutorService tick = Executors.newSingleThreadScheduledExecutor();
            tick.scheduleAtFixedRate(() -> {
                long captured = System.currentTimeMillis() * 1_000_000L;
                try {
                    producer.newMessage()
                            .value(payload)
                            .property("seq", Long.toString(seq[0]++))
                            .property("capture-ns", Long.toString(captured))
                            .sendAsync()
                            .exceptionally(err -> {
                                emit("err " + name + " " + err.toString().replace('\n', ' '));
                                return null;
                            });
                } catch (RuntimeException e) { // a throw would end the schedule: report it, keep ticking
                    emit("err " + name + " " + e.toString().replace('\n', ' '));
                }
            }, 0, (long) (1e9 / hz), TimeUnit.NANOSECONDS);
        }
        emit("ready");
        Thread.currentThread().join(); // until the bench kills the JVM
    }
}
