# shellcheck shell=bash
# phase NAME COMMAND...: runs COMMAND, appends "NAME <wall s>" (and its exit code when not 0) to
# $RIGD_PHASES, returns COMMAND's status. Sourced by tests/run.sh and .ci/run.
phase() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "== $name" >&2
  "$@" || rc=$?
  echo "$name $((SECONDS - t0)) s$([ $rc = 0 ] || echo " (exit $rc)")" >>"$RIGD_PHASES"
  return $rc
}
