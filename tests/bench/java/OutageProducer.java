// The official Apache Pulsar Java client (pulsar-client-original, from the broker's own Maven
// Central dependency set) as a contestant of tests/bench/outage_return.py: a producer as a user
// would set it up for a link that goes away, sending a small message every 10 ms (the bench's rigd
// runs a 100 Hz source) and printing when each send completes, so that the bench can take the time
// from the broker (or the link) being back to the first receipt after an outage, as it does for rigd.
//
// The producer: sendAsync, sendTimeout 0 (never fails a send: everything waits out the outage in
// the client's queue), blockIfQueueFull, everything else the client's defaults (batching on with a
// 1 ms delay; operationTimeout 30 s; reconnect backoff from 100 ms doubling to 60 s) unless
// MAX_BACKOFF_MS is given (then the client's maxBackoffInterval, the rest of the backoff as default).
//
// usage: OutageProducer SERVICE_URL TOPIC [MAX_BACKOFF_MS]
// stdout, one line each, flushed: `ready <epoch_ms>` once the producer is created, then
// `ack <epoch_ms>` per send completed, `err <epoch_ms> <error>` per send failed. Runs until killed.
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.ClientBuilder;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;

public class OutageProducer {
    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String url = args[0], topic = args[1];
        ClientBuilder builder = PulsarClient.builder().serviceUrl(url);
        if (args.length > 2) {
            builder.maxBackoffInterval(Long.parseLong(args[2]), TimeUnit.MILLISECONDS);
        }
        PulsarClient client = builder.build();
        Producer<byte[]> producer = client.newProducer()
                .topic(topic)
                .sendTimeout(0, TimeUnit.SECONDS)
                .blockIfQueueFull(true)
                .create();
        emit("ready " + System.currentTimeMillis());
        ScheduledExecutorService tick = Executors.newSingleThreadScheduledExecutor();
        long[] seq = {0};
        tick.scheduleAtFixedRate(() -> {
            byte[] payload = ("java outage bench " + seq[0]++).getBytes();
            try {
                producer.sendAsync(payload).whenComplete((id, err) -> {
                    if (err == null) {
                        emit("ack " + System.currentTimeMillis());
                    } else {
                        emit("err " + System.currentTimeMillis() + " " + err.toString().replace('\n', ' '));
                    }
                });
            } catch (RuntimeException e) { // a throw would end the schedule: report it, keep ticking
                emit("err " + System.currentTimeMillis() + " " + e.toString().replace('\n', ' '));
            }
        }, 0, 10, TimeUnit.MILLISECONDS);
        Thread.currentThread().join(); // until the bench kills the JVM
    }
}
