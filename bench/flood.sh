#!/usr/bin/env bash
# An agent host flooding the gateway, measured against a quiet run of the same setup: a front
# gateway whose agent is a host gateway's /acp (the echo agent behind it, over WebSocket), one
# session flooding (`/chunks N`, N updates in one turn) while another session's short prompts
# are timed. Prints, each as flood ÷ quiet of the same run:
#   - the bridge's RSS (the front's member process, `acp-gateway connect --once`): its VmRSS
#     when idle vs its VmHWM once the flood is over (target: bounded, not growing with N);
#   - the other session's prompt p99 during the flood vs alone (target ≤ 2×);
#   - the host gateway's RSS likewise (what the bridge does not read waits in the host).
# Each agent has POOL members (default 2), so the other session runs on a member of its own, as
# another tenant's would: its p99 shows what the flood costs the gateway, not the agent's own
# queue. LOCAL=1: the front runs the echo agent itself (a local agent flooding), and the RSS
# measured is the front gateway's.
#   [BIN=target/release/acp-gateway] [AGENT=target/release/examples/echo_agent] [POOL=2] \
#   [UPDATES=200000] [PROMPTS=200] [SCHEME=ws] [LOCAL=1] bash bench/flood.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/acp-gateway}
AGENT=${AGENT:-target/release/examples/echo_agent}
UPDATES=${UPDATES:-200000}
PROMPTS=${PROMPTS:-200}
SCHEME=${SCHEME:-ws}
POOL=${POOL:-2}
LOCAL=${LOCAL:-}
work=$(mktemp -d)
# Each gateway's pid is in $work/NAME/pid (`start` runs in a subshell): the host's and the
# front's, whose members end with them.
trap 'kill $(cat "$work"/*/pid 2>/dev/null) 2>/dev/null; sleep 1; rm -rf "$work"' EXIT

# start NAME ARGS…: a gateway on SQLite in $work/NAME; prints its base URL.
start() {
  local name=$1; shift
  mkdir -p "$work/$name"
  ECHO_AGENT_DIR="$work/$name/agent" RUST_LOG=warn "$BIN" --listen 127.0.0.1:0 \
    --database-url "sqlite://$work/$name/db.sqlite" "$@" >"$work/$name/out" 2>"$work/$name/err" &
  echo $! >"$work/$name/pid"
  local url=""
  for _ in $(seq 600); do
    url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/$name/out" | head -1 || true)
    [ -n "$url" ] && curl -fs "$url/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  echo "$url"
}

if [ -n "$LOCAL" ]; then
  front=$(start front --agent "$AGENT" --pool-size "$POOL")
  host_pid=$(cat "$work/front/pid")
  watched=$host_pid what="front gateway"
else
  host=$(start host --agent "$AGENT" --pool-size "$POOL")
  host_pid=$(cat "$work/host/pid")
  printf '[agents.host]\nurl = ["%s/acp"]\npool-size = %s\n' "${host/http:/$SCHEME:}" "$POOL" >"$work/front.toml"
  front=$(start front --config "$work/front.toml" --default-agent host)
  watched=$(curl -fs "$front/agent" | python3 -c 'import json,sys; print(" ".join(str(m["pid"]) for m in json.load(sys.stdin)["members"]))')
  what="bridge (largest of the members)"
fi
# kib FIELD [PID]: a field of the watched processes' /proc status (the largest), or PID's, in KiB.
kib() { for p in ${2:-$watched}; do awk -v k="$1:" '$1 == k {print $2}' "/proc/$p/status"; done | sort -n | tail -1; }
new_session() { curl -fs -H 'content-type: application/json' -d '{"cwd":"/tmp"}' "$front/sessions" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["sessionId"])'; }
flooder=$(new_session)
other=$(new_session)

# timed COUNT: COUNT prompts of the other session, one at a time; their p99 in ms.
timed() {
  for _ in $(seq "$1"); do
    curl -fs -o /dev/null -w '%{time_total}\n' -H 'content-type: application/json' \
      -d '{"text":"ping"}' "$front/sessions/$other/prompt"
  done | sort -n | awk '{a[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; printf "%.1f", a[i]*1000}'
}

timed 20 >/dev/null # warm
quiet_rss=$(kib VmRSS)
host_quiet=$(kib VmRSS "$host_pid")
quiet_p99=$(timed "$PROMPTS")

start_ns=$(date +%s%N)
curl -fs -o "$work/flood.json" -H 'content-type: application/json' \
  -d "{\"text\":\"/chunks $UPDATES\"}" "$front/sessions/$flooder/prompt" &
flood=$!
flood_p99=$(timed "$PROMPTS")
wait "$flood"
flood_s=$(( ($(date +%s%N) - start_ns) / 1000000 ))
peak_rss=$(kib VmHWM)
host_peak=$(kib VmHWM "$host_pid")

echo "$what RSS: quiet ${quiet_rss} KiB, peak during the flood ${peak_rss} KiB ($(awk -v a="$peak_rss" -v b="$quiet_rss" 'BEGIN{printf "%.2f", a/b}')×)"
if [ -z "$LOCAL" ]; then
  # The machine's floor: the same flood sent to a session of the host itself, which the front
  # never reads, while the other session is timed again; the host's own work on the shared cores
  # is what this p99 shows.
  hosted=$(curl -fs -H 'content-type: application/json' -d '{"cwd":"/tmp"}' "$host/sessions" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["sessionId"])')
  curl -fs -o /dev/null -H 'content-type: application/json' \
    -d "{\"text\":\"/chunks $UPDATES\"}" "$host/sessions/$hosted/prompt" &
  floor=$!
  floor_p99=$(timed "$PROMPTS")
  wait "$floor"
  echo "floor: the other session's p99 while the host floods a session of its own: ${floor_p99} ms ($(awk -v a="$floor_p99" -v b="$quiet_p99" 'BEGIN{printf "%.2f", a/b}')× quiet); the flood through the front ÷ this floor: $(awk -v a="$flood_p99" -v b="$floor_p99" 'BEGIN{printf "%.2f", a/b}')×"
fi
[ -n "$LOCAL" ] || echo "host RSS: quiet ${host_quiet} KiB, peak ${host_peak} KiB ($(awk -v a="$host_peak" -v b="$host_quiet" 'BEGIN{printf "%.2f", a/b}')×)"
echo "other session's prompt p99: quiet ${quiet_p99} ms, during the flood ${flood_p99} ms ($(awk -v a="$flood_p99" -v b="$quiet_p99" 'BEGIN{printf "%.2f", a/b}')×)"
echo "flood turn: $UPDATES updates over $([ -n "$LOCAL" ] && echo stdio || echo "$SCHEME") in ${flood_s} ms; $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stopReason"])' "$work/flood.json")"
