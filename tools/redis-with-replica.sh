#!/usr/bin/env bash
# A redis-server that brings one replica along, for the bench harness's
# --redis-server option: the confirmed-enqueue figure (ENQUEUE_WAIT_REPLICAS
# = 1) needs a replica to confirm each push. The master is started with the
# arguments the harness gives; the replica listens on the next free port,
# replicates it, and stops when the master stops.
#
#   python3 ../shared/bench/run.py --systems cogworker,dramatiq \
#       --redis-server "$PWD/tools/redis-with-replica.sh"
#
# REDIS_SERVER: the real binary (default /usr/bin/redis-server).
set -euo pipefail

binary=${REDIS_SERVER:-/usr/bin/redis-server}
port="" dir=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --port) port=${args[i + 1]} ;;
        --dir) dir=${args[i + 1]} ;;
    esac
done
[[ -n $port && -n $dir ]] || { echo "redis-with-replica: needs --port and --dir" >&2; exit 2; }

# No delay before the replica's first sync (Redis 7 waits 5 s by default):
# an enqueue confirmed before the replica is in sync would raise.
"$binary" "$@" --repl-diskless-sync-delay 0 &
master=$!
replica_dir="$dir/replica"
mkdir -p "$replica_dir"
replica_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$binary" --port "$replica_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$replica_dir" \
    --logfile "$replica_dir/redis.log" --daemonize no --replicaof 127.0.0.1 "$port" \
    --repl-diskless-load swapdb &
replica=$!
# Waited for, so that they no longer write in --dir when the caller removes it.
trap 'kill "$replica" "$master" 2>/dev/null || true; wait "$replica" "$master" 2>/dev/null || true' EXIT TERM INT
wait "$master"
