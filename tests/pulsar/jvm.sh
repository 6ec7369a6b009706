# Sourced by tests/pulsar/broker.sh and cluster.sh: the Java binary and the JVM options every Pulsar process
# (ZooKeeper, bookie, broker) needs on Java 17, and a liveness check by pid.
# Expects `die` and `log` from the sourcing script.

pick_java() {
  if [[ -n ${PULSAR_JAVA:-} ]]; then
    echo "$PULSAR_JAVA"
    return
  fi
  local j
  # Pulsar 3.0.x is built for and tested on Java 17.
  for j in /usr/lib/jvm/java-17-openjdk-amd64/bin/java /usr/lib/jvm/java-17-openjdk*/bin/java \
    /usr/lib/jvm/temurin-17*/bin/java; do
    if [[ -x $j ]]; then
      echo "$j"
      return
    fi
  done
  if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
    echo "$JAVA_HOME/bin/java"
    return
  fi
  command -v java || die "no java found (install openjdk-17-jre-headless or set PULSAR_JAVA)"
}

# From bin/pulsar: BookKeeper, Netty, stats and LinuxInfoUtils need these on Java 17.
JAVA17_OPENS=(
  --add-opens java.base/java.io=ALL-UNNAMED
  --add-opens java.base/java.util.zip=ALL-UNNAMED
  --add-opens java.base/java.nio=ALL-UNNAMED
  --add-opens java.base/jdk.internal.misc=ALL-UNNAMED
  --add-opens java.base/sun.net=ALL-UNNAMED
  --add-opens java.management/sun.management=ALL-UNNAMED
  --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
  --add-opens java.base/jdk.internal.platform=ALL-UNNAMED
)

# System properties every Pulsar JVM here runs with (netty, the allocator, ZooKeeper, BookKeeper's
# metadata drivers, log4j without lookups).
PULSAR_SYSPROPS=(
  -Djava.net.preferIPv4Stack=true
  -Dio.netty.tryReflectionSetAccessible=true
  -Dio.netty.leakDetectionLevel=disabled
  -Dio.netty.recycler.maxCapacityPerThread=4096
  -Dpulsar.allocator.exit_on_oom=true
  -Djute.maxbuffer=10485760
  -Dzookeeper.clientTcpKeepAlive=true
  -Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver
  -Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver
  -Dlog4j2.formatMsgNoLookups=true
)

proc_alive() { # pid -> 0 if the process exists and is not a zombie
  local pid=$1 stat
  [[ -r /proc/$pid/stat ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}
