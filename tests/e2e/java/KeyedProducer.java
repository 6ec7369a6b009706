// The official Apache Pulsar Java client publishing one message per key to a (partitioned) topic,
// routed by its key as the client routes it (MessageRoutingMode.RoundRobinPartition: a message with
// a key goes to signSafeMod(hash(key), partitions)), with the hashing scheme asked for. The test
// reads where each key landed with the official Python client and compares with rigd's messages.
//
// usage: KeyedProducer SERVICE_URL TOPIC murmur3-32|java-string KEY...
import org.apache.pulsar.client.api.HashingScheme;
import org.apache.pulsar.client.api.MessageRoutingMode;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;

public class KeyedProducer {
    public static void main(String[] args) throws Exception {
        String url = args[0], topic = args[1];
        HashingScheme scheme = switch (args[2]) {
            case "murmur3-32" -> HashingScheme.Murmur3_32Hash;
            case "java-string" -> HashingScheme.JavaStringHash;
            default -> throw new IllegalArgumentException("scheme: " + args[2]);
        };
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             Producer<byte[]> producer = client.newProducer()
                     .topic(topic)
                     .producerName("java-" + args[2] + "-" + ProcessHandle.current().pid())
                     .hashingScheme(scheme)
                     .messageRoutingMode(MessageRoutingMode.RoundRobinPartition)
                     .enableBatching(false)
                     .create()) {
            for (int i = 3; i < args.length; i++) {
                producer.newMessage().key(args[i]).property("from", "java").value(new byte[0]).sendAsync();
            }
            producer.flush();
        }
    }
}
