#!/usr/bin/env bash
# CI smoke test of qlock: build it, start three redis-server nodes on free
# 127.0.0.1 ports, run one command under a lock, check the exit codes, and
# stop the nodes by PID. Run from the repository root:
#   cmd/qlock/testdata/ci.sh
set -euo pipefail

dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # so that the EXIT trap stops the nodes

go build -o "$dir/qlock" ./cmd/qlock

# A port is free if nothing accepts a connection on it, and redis-server
# then manages to bind it (it exits otherwise, and we try another).
free_port() {
  local p
  while :; do
    p=$(( 20000 + RANDOM % 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

urls=()
for i in 1 2 3; do
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --dir "$dir" --logfile "$dir/redis-$i.log" &
    pid=$!
    ok=""
    for _ in $(seq 50); do
      if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then ok=1; break; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if [ -n "$ok" ]; then
      pids+=("$pid")
      urls+=("redis://127.0.0.1:$port")
      break
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
done
if [ ${#urls[@]} -ne 3 ]; then
  echo "ci.sh: could not start three redis-server nodes" >&2
  exit 1
fi
export QLOCK_NODES
QLOCK_NODES=$(IFS=,; echo "${urls[*]}")

expect() { # expect CODE COMMAND...
  local want=$1; shift
  set +e
  "$@"
  local got=$?
  set -e
  if [ "$got" -ne "$want" ]; then
    echo "ci.sh: '$*' exited $got, want $want" >&2
    exit 1
  fi
}

echo "-- qlock run passes the command's exit code through"
expect 3 "$dir/qlock" run -fencing ci-smoke -- sh -c 'echo "running under $QLOCK_RESOURCE, fence $QLOCK_FENCE"; exit 3'

echo "-- while it is held, another run is refused (75) and status says held (0)"
"$dir/qlock" run ci-smoke -- sh -c "touch $dir/held; sleep 3" &
holder=$!
for _ in $(seq 100); do [ -e "$dir/held" ] && break; sleep 0.05; done
expect 75 "$dir/qlock" run ci-smoke -- true
expect 0 "$dir/qlock" status ci-smoke
wait "$holder"

echo "-- released: status says free (1)"
expect 1 "$dir/qlock" status ci-smoke
echo "ci.sh: qlock smoke test passed"
