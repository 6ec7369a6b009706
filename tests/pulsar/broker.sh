#!/usr/bin/env bash
# A real Apache Pulsar standalone broker on 127.0.0.1 for rigd's tests, benchmarks and operators.
# The jars come from Maven Central (tests/pulsar/pom.xml); no Docker, no tarball.
#
#   tests/pulsar/broker.sh start    start (or reuse) the broker; prints pulsar://127.0.0.1:6650 on stdout
#   tests/pulsar/broker.sh stop     stop it (SIGTERM to its recorded pid/process group, SIGKILL after a timeout)
#   tests/pulsar/broker.sh status   exit 0 if running and healthy
#   tests/pulsar/broker.sh wipe     delete the data dir (refuses while running)
#   tests/pulsar/broker.sh fetch    resolve and cache the jars only
#   tests/pulsar/broker.sh env      print PULSAR_SERVICE_URL=... etc. (shell-sourceable)
#   tests/pulsar/broker.sh gen-tls DIR        make ca.pem, broker.pem, broker.key.pem (+ client.*) for PULSAR_TLS_DIR
#   tests/pulsar/broker.sh gen-token-key FILE make a 32-byte HS256 secret key for PULSAR_TOKEN_SECRET_KEY
#   tests/pulsar/broker.sh token SUBJECT      print a JWT for SUBJECT signed with PULSAR_TOKEN_SECRET_KEY
#                                             (PULSAR_TOKEN_EXPIRES_IN_S=N: one that expires in N s)
#   PULSAR_AUTH_REFRESH_S=N (start): how often the broker checks a connection's token for expiry
#                                    and sends AUTH_CHALLENGE (authenticationRefreshCheckSeconds, 60)
#
# Only the URL (start), the lib dir (fetch), env lines (env) and tokens (token) go to stdout;
# everything else goes to stderr. See tests/pulsar/README.md for the knobs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

VERSION=${PULSAR_VERSION:-3.0.7}
CACHE_ROOT=${PULSAR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rigd-pulsar}
CACHE=$CACHE_ROOT/$VERSION
LIB=$CACHE/lib
DATA=$(realpath -m "${PULSAR_DATA:-/tmp/rigd-pulsar-data}")
PIDFILE=$DATA/broker.pid
CONF=$DATA/conf/standalone.conf
MARKER=$DATA/.rigd-pulsar-data
LOCKFILE=$DATA.lock

HOST=${PULSAR_HOST:-127.0.0.1}
PORT=${PULSAR_PORT:-6650}
HTTP_PORT=${PULSAR_HTTP_PORT:-8080}
BOOKIE_PORT=${PULSAR_BOOKIE_PORT:-3181}
TLS_PORT=${PULSAR_TLS_PORT:-6651}
HTTPS_PORT=${PULSAR_HTTPS_PORT:-8443}
HEAP=${PULSAR_HEAP:-1g}
DIRECT=${PULSAR_DIRECT_MEMORY:-1g}
LOG_LEVEL=${PULSAR_LOG_LEVEL:-info}
START_TIMEOUT=${PULSAR_START_TIMEOUT:-240}
STOP_TIMEOUT=${PULSAR_STOP_TIMEOUT:-30}
MAX_MESSAGE_SIZE=${PULSAR_MAX_MESSAGE_SIZE:-5242880}
TLS_DIR=${PULSAR_TLS_DIR:-}
# 1: the TLS ports require a client certificate signed by the CA, and the TLS authentication
# provider maps it to a role (its CN); needs PULSAR_TLS_DIR and PULSAR_TOKEN_SECRET_KEY (the
# broker's own client and the health checks keep using the token).
TLS_CLIENT_AUTH=${PULSAR_TLS_CLIENT_AUTH:-0}
TOKEN_KEY=${PULSAR_TOKEN_SECRET_KEY:-}
TOKEN_SUPERUSER=${PULSAR_TOKEN_SUPERUSER:-admin}
AUTHZ=${PULSAR_AUTHORIZATION:-0}

SERVICE_URL=pulsar://$HOST:$PORT
ADMIN_URL=http://$HOST:$HTTP_PORT

log() { printf '[broker.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit "${RC:-1}"; }

is_true() {
  case "${1,,}" in
    1 | true | yes | on) return 0 ;;
    0 | false | no | off | "") return 1 ;;
    *) die "expected a boolean (1/0/true/false), got '$1'" ;;
  esac
}

[[ $MAX_MESSAGE_SIZE =~ ^[0-9]+$ ]] || die "PULSAR_MAX_MESSAGE_SIZE must be a number of bytes, got '$MAX_MESSAGE_SIZE'"
for p in PORT HTTP_PORT BOOKIE_PORT TLS_PORT HTTPS_PORT START_TIMEOUT STOP_TIMEOUT; do
  [[ ${!p} =~ ^[0-9]+$ ]] || die "$p must be a number, got '${!p}'"
done
# Commands.MESSAGE_SIZE_FRAME_PADDING in Pulsar is 10 KiB.
NETTY_MAX_FRAME=$((MAX_MESSAGE_SIZE + 10240))
if is_true "${PULSAR_DEDUP:-0}"; then DEDUP=true; else DEDUP=false; fi

# pick_java, JAVA17_OPENS and proc_alive: shared with cluster.sh.
# shellcheck source=jvm.sh
source "$HERE/jvm.sh"

# ---------------------------------------------------------------------------------------------
# jars

do_fetch() {
  if [[ -f $CACHE/lib.ok ]]; then
    return 0
  fi
  mkdir -p "$CACHE"
  local java java_home rc=0
  java=$(pick_java)
  java_home=$(dirname "$(dirname "$(realpath "$java")")")
  (
    flock 8
    [[ -f $CACHE/lib.ok ]] && exit 0
    command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
    log "resolving Pulsar $VERSION jars from Maven Central into $LIB (first time only; ~1 min)"
    rm -rf "$LIB.tmp"
    local t0=$SECONDS
    if ! JAVA_HOME=$java_home mvn -q -B -s "$HERE/settings.xml" -f "$HERE/pom.xml" \
      -Dpulsar.version="$VERSION" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB.tmp" \
      >"$CACHE/mvn.log" 2>&1 </dev/null; then
      tail -n 40 "$CACHE/mvn.log" >&2 || true
      die "maven resolution failed (full log: $CACHE/mvn.log)"
    fi
    [[ -f $LIB.tmp/pulsar-broker-$VERSION.jar ]] || die "pulsar-broker-$VERSION.jar missing after resolution"
    rm -rf "$LIB"
    mv "$LIB.tmp" "$LIB"
    touch "$CACHE/lib.ok"
    log "resolved $(find "$LIB" -name '*.jar' | wc -l) jars ($(du -sh "$LIB" | cut -f1)) in $((SECONDS - t0)) s"
  ) 8>"$CACHE/.fetch.lock" || rc=$?
  # a copy-dependencies run on a pom project leaves nothing behind, but be tidy anyway
  rm -rf "$HERE/target"
  return $rc
}

# ---------------------------------------------------------------------------------------------
# token helpers (HS256 JWTs, the format of `pulsar tokens create --secret-key`)

mint_token() { # subject keyfile
  python3 - "$1" "$2" <<'PY'
import base64, hashlib, hmac, json, os, sys, time
sub, keyfile = sys.argv[1], sys.argv[2]
key = open(keyfile, "rb").read()
if len(key) < 32:
    sys.exit("token secret key must be at least 32 bytes (HS256)")
b64 = lambda d: base64.urlsafe_b64encode(d).rstrip(b"=").decode()
head = b64(json.dumps({"alg": "HS256"}, separators=(",", ":")).encode())
claims = {"sub": sub}
if os.environ.get("PULSAR_TOKEN_EXPIRES_IN_S"):  # an expiring token, for the refresh test
    claims["exp"] = int(time.time()) + int(os.environ["PULSAR_TOKEN_EXPIRES_IN_S"])
body = b64(json.dumps(claims, separators=(",", ":")).encode())
sig = b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
print(f"{head}.{body}.{sig}")
PY
}

admin_token() {
  [[ -n $TOKEN_KEY ]] || return 0
  mint_token "$TOKEN_SUPERUSER" "$TOKEN_KEY"
}

# ---------------------------------------------------------------------------------------------
# configuration

render_conf() { # output file
  local out=$1
  {
    echo "# generated by tests/pulsar/broker.sh from standalone.conf.in -- do not edit"
    echo "# rigd: version=$VERSION heap=$HEAP direct=$DIRECT bookie_port=$BOOKIE_PORT log_level=$LOG_LEVEL"
    echo "# rigd: extra_jvm_opts=${PULSAR_JVM_OPTS:-}"
    sed -e "s|@PORT@|$PORT|g" \
      -e "s|@HTTP_PORT@|$HTTP_PORT|g" \
      -e "s|@MAX_MESSAGE_SIZE@|$MAX_MESSAGE_SIZE|g" \
      -e "s|@NETTY_MAX_FRAME@|$NETTY_MAX_FRAME|g" \
      -e "s|@DEDUP@|$DEDUP|g" \
      -e "s|@DEDUP_INACTIVITY@|${PULSAR_DEDUP_INACTIVITY_MIN:-360}|g" \
      -e "s|@HOST@|$HOST|g" \
      -e "s|@LIVENESS@|${PULSAR_LIVENESS_CHECK_MS:-5000}|g" \
      "$HERE/standalone.conf.in"
    if [[ -n $TLS_DIR ]]; then
      local tls
      tls=$(realpath "$TLS_DIR")
      local f
      for f in ca.pem broker.pem broker.key.pem; do
        [[ -r $tls/$f ]] || die "PULSAR_TLS_DIR=$TLS_DIR has no readable $f"
      done
      cat <<EOF

### TLS (PULSAR_TLS_DIR=$tls)
brokerServicePortTls=$TLS_PORT
webServicePortTls=$HTTPS_PORT
tlsCertificateFilePath=$tls/broker.pem
tlsKeyFilePath=$tls/broker.key.pem
tlsTrustCertsFilePath=$tls/ca.pem
tlsAllowInsecureConnection=false
tlsRequireTrustedClientCertOnConnect=$(is_true "$TLS_CLIENT_AUTH" && echo true || echo false)
EOF
    fi
    if [[ -n $TOKEN_KEY ]]; then
      local key token
      key=$(realpath "$TOKEN_KEY")
      [[ -r $key ]] || die "PULSAR_TOKEN_SECRET_KEY=$TOKEN_KEY is not readable"
      token=$(mint_token "$TOKEN_SUPERUSER" "$key")
      cat <<EOF

### Token authentication (PULSAR_TOKEN_SECRET_KEY=$key)
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken$(is_true "$TLS_CLIENT_AUTH" && echo ,org.apache.pulsar.broker.authentication.AuthenticationProviderTls)
tokenSecretKey=file://$key
superUserRoles=$TOKEN_SUPERUSER
authenticationRefreshCheckSeconds=${PULSAR_AUTH_REFRESH_S:-60}
authorizationEnabled=$(is_true "$AUTHZ" && echo true || echo false)
brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
brokerClientAuthenticationParameters=token:$token
EOF
    fi
  } >"$out"
}

jvm_opts() {
  JVM_OPTS=(
    "-Xms128m" "-Xmx$HEAP" "-XX:MaxDirectMemorySize=$DIRECT"
    -XX:+UseG1GC -XX:MaxGCPauseMillis=50 -XX:ParallelGCThreads=2 -XX:ConcGCThreads=1
    -XX:CICompilerCount=2 -XX:+ExitOnOutOfMemoryError -XX:+PerfDisableSharedMem
    "${PULSAR_SYSPROPS[@]}"
    "${JAVA17_OPENS[@]}"
    "-Dlog4j.configurationFile=$DATA/conf/log4j2.xml"
    "-Dpulsar.log.dir=$DATA/logs"
    "-Dpulsar.log.level=$LOG_LEVEL"
    # identifies our JVM in /proc/PID/cmdline (pid reuse guard)
    "-Drigd.pulsar.data=$DATA"
  )
  if [[ -n ${PULSAR_JVM_OPTS:-} ]]; then
    local extra
    read -r -a extra <<<"$PULSAR_JVM_OPTS"
    JVM_OPTS+=("${extra[@]}")
  fi
}

# ---------------------------------------------------------------------------------------------
# process


recorded_pid() { # prints the pid if the pidfile names our live broker JVM
  [[ -f $PIDFILE ]] || return 1
  local pid cmd
  pid=$(<"$PIDFILE")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  proc_alive "$pid" || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *"-Drigd.pulsar.data=$DATA "* && $cmd == *PulsarStandaloneStarter* ]] || return 1
  echo "$pid"
}

http_get() { # path -> body (fails on HTTP errors)
  local auth=()
  if [[ -n ${ADMIN_TOKEN:-} ]]; then auth=(-H "Authorization: Bearer $ADMIN_TOKEN"); fi
  curl -sf -m 10 "${auth[@]}" "$ADMIN_URL$1"
}

healthy() {
  local body
  body=$(http_get /admin/v2/brokers/health 2>/dev/null) || return 1
  [[ $body == ok ]]
}

ready() {
  local body
  body=$(http_get /admin/v2/namespaces/public 2>/dev/null) || return 1
  [[ $body == *'"public/default"'* ]] || return 1
  healthy
}

port_in_use() { # port
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

log_tail() {
  local f
  for f in "$DATA/logs/stdout.log" "$DATA/logs/pulsar.log"; do
    if [[ -s $f ]]; then
      log "---- last lines of $f ----"
      # (Jersey's JAXB/WADL warnings on stdout are harmless noise)
      grep -v -e 'WadlFeature configure' -e 'WADL feature is disabled' "$f" | tail -n "${1:-40}" >&2 || true
    fi
  done
}

kill_broker() { # pid : SIGTERM its process group, wait, then SIGKILL
  local pid=$1 pgid target
  pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ') || pgid=
  if [[ $pgid == "$pid" ]]; then target=-$pid; else target=$pid; fi
  log "stopping broker (pid $pid) with SIGTERM"
  kill -TERM -- "$target" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while proc_alive "$pid" && ((SECONDS < deadline)); do sleep 0.5; done
  if proc_alive "$pid"; then
    log "broker (pid $pid) still alive after ${STOP_TIMEOUT}s: SIGKILL"
    kill -KILL -- "$target" 2>/dev/null || true
    deadline=$((SECONDS + 15))
    while proc_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    proc_alive "$pid" && die "broker pid $pid survived SIGKILL"
  fi
  # anything left in its process group (there should be nothing) goes too
  if [[ $target == -* ]]; then kill -KILL -- "$target" 2>/dev/null || true; fi
  # reap it if it is our own child (start that timed out)
  wait "$pid" 2>/dev/null || true
}

with_lock() { # run "$@" holding the data-dir lock
  mkdir -p "$(dirname "$LOCKFILE")"
  exec 9>"$LOCKFILE"
  flock 9
  "$@"
}

# ---------------------------------------------------------------------------------------------
# commands

start_locked() {
  ADMIN_TOKEN=$(admin_token)
  local tmp pid
  if [[ ! -f $MARKER ]] && [[ -n $(ls -A "$DATA" 2>/dev/null) ]]; then
    die "PULSAR_DATA=$DATA exists, is not empty and is not a broker.sh data dir; choose another one"
  fi
  mkdir -p "$DATA/conf"
  touch "$MARKER"
  tmp=$(mktemp "$DATA/conf/.standalone.conf.XXXXXX")
  TMP_CONF=$tmp
  trap 'rm -f "$TMP_CONF"' EXIT
  render_conf "$tmp"

  if pid=$(recorded_pid); then
    if ! cmp -s "$tmp" "$CONF"; then
      rm -f "$tmp"
      diff "$CONF" <(render_conf /dev/stdout) >&2 || true
      RC=3 die "a broker (pid $pid) is already running with a different configuration (diff above); run '$0 stop' first"
    fi
    rm -f "$tmp"
    if ! healthy; then
      log "broker (pid $pid) is running but not healthy yet; waiting"
      wait_ready "$pid"
    fi
    log "broker already running (pid $pid)"
    echo "$SERVICE_URL"
    return 0
  fi
  rm -f "$PIDFILE"

  do_fetch

  local p
  local bookie_port=$BOOKIE_PORT cookie=$DATA/bookkeeper/current/VERSION
  if [[ -f $cookie ]] && [[ $(grep -m1 bookieHost "$cookie") =~ :([0-9]+)\" ]]; then
    bookie_port=${BASH_REMATCH[1]} # an existing bookie keeps the port in its cookie
  fi
  local ports=("$PORT" "$HTTP_PORT" "$bookie_port")
  if [[ -n $TLS_DIR ]]; then ports+=("$TLS_PORT" "$HTTPS_PORT"); fi
  for p in "${ports[@]}"; do
    if port_in_use "$p"; then
      rm -f "$tmp"
      die "port $p on $HOST is already in use by another process (another broker? see PULSAR_PORT etc.)"
    fi
  done

  if [[ -d $DATA/zookeeper ]] || [[ -d $DATA/data/standalone/zookeeper ]]; then
    log "WARNING: a zookeeper dir exists in $DATA; standalone would switch to ZooKeeper mode"
  fi
  mkdir -p "$DATA/logs" "$DATA/metadata" "$DATA/bookkeeper"
  mv "$tmp" "$CONF"
  trap - EXIT
  cp "$HERE/log4j2.xml" "$DATA/conf/log4j2.xml"
  if [[ -n $TOKEN_KEY ]]; then
    printf '%s\n' "$ADMIN_TOKEN" >"$DATA/conf/admin.token"
  else
    rm -f "$DATA/conf/admin.token"
  fi

  local java
  java=$(pick_java)
  jvm_opts
  {
    echo "==== $(date -Is) starting Pulsar $VERSION standalone with $java"
  } >>"$DATA/logs/stdout.log"
  log "starting Pulsar $VERSION standalone (data: $DATA, logs: $DATA/logs/pulsar.log)"
  # setsid: own session and process group (pid == pgid), so stop can signal the whole group and
  # Ctrl-C in the caller's terminal does not reach it. stdin/stdout/stderr are detached so callers
  # that capture our stdout (subprocess, $(...)) are not held open by the JVM; fd 9 (the lock) is closed.
  (
    cd "$DATA"
    unset PULSAR_STANDALONE_USE_ZOOKEEPER
    exec setsid "$java" "${JVM_OPTS[@]}" -cp "$LIB/*" org.apache.pulsar.PulsarStandaloneStarter \
      --config "$CONF" -nfw -nss \
      --metadata-dir "$DATA/metadata" \
      --bookkeeper-dir "$DATA/bookkeeper" \
      --bookkeeper-port "$BOOKIE_PORT" \
      --zookeeper-dir "$DATA/zookeeper"
  ) </dev/null >>"$DATA/logs/stdout.log" 2>&1 9>&- &
  pid=$!
  echo "$pid" >"$PIDFILE"
  wait_ready "$pid"
  log "broker ready (pid $pid) after $((SECONDS - START_T0)) s"
  echo "$SERVICE_URL"
}

wait_ready() { # pid
  local pid=$1 deadline=$((SECONDS + START_TIMEOUT)) n=0
  while :; do
    if ! proc_alive "$pid"; then
      wait "$pid" 2>/dev/null || true
      rm -f "$PIDFILE"
      log_tail 60
      die "broker process $pid died during startup (logs in $DATA/logs)"
    fi
    if ready; then return 0; fi
    if ((SECONDS >= deadline)); then
      log_tail 60
      kill_broker "$pid"
      rm -f "$PIDFILE"
      die "broker not ready after ${START_TIMEOUT}s; stopped it (logs in $DATA/logs)"
    fi
    n=$((n + 1))
    if ((n % 15 == 0)); then log "waiting for broker readiness... ($((SECONDS - START_T0)) s)"; fi
    sleep 1
  done
}

stop_locked() {
  local pid
  if ! pid=$(recorded_pid); then
    rm -f "$PIDFILE"
    log "broker not running"
    return 0
  fi
  local t0=$SECONDS
  kill_broker "$pid"
  rm -f "$PIDFILE"
  log "broker stopped in $((SECONDS - t0)) s"
}

wipe_locked() {
  if pid=$(recorded_pid); then
    die "broker is running (pid $pid); run '$0 stop' first"
  fi
  if [[ ! -e $DATA ]]; then
    log "nothing to wipe at $DATA"
    return 0
  fi
  case "$DATA" in / | "$HOME" | /tmp | /root | /home) die "refusing to wipe $DATA" ;; esac
  if [[ ! -f $MARKER ]] && [[ -n $(ls -A "$DATA" 2>/dev/null) ]]; then
    die "$DATA does not look like a broker.sh data dir (no $(basename "$MARKER")); not deleting it"
  fi
  rm -rf "$DATA"
  log "wiped $DATA"
}

cmd_status() {
  ADMIN_TOKEN=$(admin_token)
  local pid
  if ! pid=$(recorded_pid); then
    log "broker not running (data: $DATA)"
    return 1
  fi
  if ready; then
    log "broker running and healthy: pid $pid, $SERVICE_URL, admin $ADMIN_URL, data $DATA"
    return 0
  fi
  log "broker process $pid is alive but not healthy"
  return 2
}

cmd_env() {
  echo "PULSAR_SERVICE_URL=$SERVICE_URL"
  echo "PULSAR_ADMIN_URL=$ADMIN_URL"
  if [[ -n $TLS_DIR ]]; then
    echo "PULSAR_TLS_SERVICE_URL=pulsar+ssl://$HOST:$TLS_PORT"
    echo "PULSAR_TLS_ADMIN_URL=https://$HOST:$HTTPS_PORT"
    echo "PULSAR_TLS_CA=$(realpath "$TLS_DIR")/ca.pem"
  fi
  if [[ -n $TOKEN_KEY ]]; then
    echo "PULSAR_ADMIN_TOKEN_FILE=$DATA/conf/admin.token"
  fi
  echo "PULSAR_DATA=$DATA"
  echo "PULSAR_LOG=$DATA/logs/pulsar.log"
  local pid
  if pid=$(recorded_pid); then echo "PULSAR_BROKER_PID=$pid"; fi
}

cmd_gen_tls() { # dir
  local dir=${1:?usage: $0 gen-tls DIR}
  command -v openssl >/dev/null || die "openssl not found"
  mkdir -p "$dir"
  (
    cd "$dir"
    umask 077
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out ca.key.pem 2>/dev/null
    openssl req -x509 -new -key ca.key.pem -sha256 -days 3650 -subj "/CN=rigd-test-ca" -out ca.pem
    local name
    for name in broker client; do
      openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$name.key.pem" 2>/dev/null
      openssl req -new -key "$name.key.pem" -subj "/CN=$name" -out "$name.csr" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$name.ext"
      openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key.pem -CAcreateserial -days 3650 -sha256 \
        -extfile "$name.ext" -out "$name.pem" 2>/dev/null
      rm -f "$name.csr" "$name.ext"
    done
    rm -f ca.srl
    chmod 644 ./*.pem
  )
  log "wrote ca.pem, broker.pem, broker.key.pem (PKCS#8), client.pem, client.key.pem to $dir"
}

cmd_gen_token_key() { # file
  local f=${1:?usage: $0 gen-token-key FILE}
  (umask 077 && head -c 32 /dev/urandom >"$f")
  log "wrote a 32-byte HS256 secret key to $f"
}

cmd_token() { # subject
  local sub=${1:?usage: PULSAR_TOKEN_SECRET_KEY=FILE $0 token SUBJECT}
  [[ -n $TOKEN_KEY ]] || die "set PULSAR_TOKEN_SECRET_KEY to the secret key file"
  mint_token "$sub" "$TOKEN_KEY"
}

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
}

START_T0=$SECONDS
case "${1:-}" in
  start) with_lock start_locked ;;
  stop) with_lock stop_locked ;;
  wipe) with_lock wipe_locked ;;
  status) cmd_status ;;
  fetch)
    do_fetch
    echo "$LIB"
    ;;
  env) cmd_env ;;
  gen-tls) cmd_gen_tls "${2:-}" ;;
  gen-token-key) cmd_gen_token_key "${2:-}" ;;
  token) cmd_token "${2:-}" ;;
  -h | --help | help) usage ;;
  *)
    usage
    exit 2
    ;;
esac
