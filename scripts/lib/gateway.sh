# Sourced by the scripts that start a gateway in the background: `await_listening PID OUT LOG`
# waits until the gateway of pid PID has printed its "listening on URL" line to the file OUT,
# then sets `url`. It waits as long as the process lives, up to GATEWAY_START_TIMEOUT seconds
# (default 120: a loaded CI machine can take many seconds to load a debug binary or to migrate
# a fresh PostgreSQL database). A gateway that exits or never listens fails the script with its
# exit status and the end of its log (the file LOG).
await_listening() {
  local pid=$1 out=$2 log=$3 deadline=$((SECONDS + ${GATEWAY_START_TIMEOUT:-120}))
  url=
  while [ "$SECONDS" -lt "$deadline" ]; do
    url=$(sed -n 's/^listening on //p' "$out" 2>/dev/null || true) # not written yet
    [ -z "$url" ] || return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      local rc=0
      wait "$pid" || rc=$?
      echo "the gateway exited (status $rc) before it listened; its log:"
      tail -n 40 "$log"
      exit 1
    fi
    sleep 0.1
  done
  echo "the gateway (pid $pid) did not listen within ${GATEWAY_START_TIMEOUT:-120} s; its log:"
  tail -n 40 "$log"
  exit 1
}
