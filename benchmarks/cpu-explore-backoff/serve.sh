#!/usr/bin/env bash
# Through the server on this 2-core CPU: `treeflash serve` (defaults: 8 slots, auto) from BASE (a worktree of
# the commit before the change) and from this tree, and `--spec none`, 60 s of the load script each, one
# server at a time; every answer compared offline with plain decoding.
#   bash benchmarks/cpu-explore-backoff/serve.sh /tmp/basetree
set -euo pipefail
BASE=$1
R=benchmarks/cpu-explore-backoff/serve
PY=.venv/bin/python
mkdir -p $R
run() {  # name tree clients [serve args...]
  local name=$1 tree=$2 clients=$3; shift 3
  PYTHONPATH=$tree $PY -m treeflash serve --port 8123 "$@" > /tmp/serve-$name.log 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:8123/v1/models > /dev/null; do sleep 1; done
  PYTHONPATH=. $PY benchmarks/serve_load.py --url http://127.0.0.1:8123 --clients $clients --duration 60 \
    --note "treeflash serve $* ($name), this 2-core CPU" --out $R/$name-${clients}clients.json | tail -3
  kill -INT $pid; wait $pid || true
}
for clients in 8 1; do
  run base $BASE $clients
  run new . $clients
  [ $clients = 8 ] && run none . $clients --spec none
done
