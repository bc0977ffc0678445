#!/bin/bash
# serve_run.sh NAME "CLIENTS:SECONDS ..." [serve options]: start `treeflash serve` on the staged GGUF, time it
# to /health, run serve_load.py phase by phase, stop it with SIGINT; everything under $OUT/NAME.
name=$1; phases=$2; shift 2
dir=$OUT/$name; mkdir -p $dir
CMD="python3 -m treeflash.cli serve ${MODEL-$HOME/smollm2.gguf} --max-num-seqs 32 --port 8100 --log-level warning $*"
echo "$CMD" > $dir/serve.cmd
t0=$EPOCHREALTIME
since() { awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}"; }
STAMP='import sys,time
t0=float(sys.argv[1])
for l in sys.stdin: print(f"{time.time()-t0:.1f} {l}", end="", flush=True)'
setsid $CMD > >(python3 -u -c "$STAMP" $t0 > $dir/server.log) 2>&1 &
pid=$!
HEALTH='import sys,urllib.request
try: sys.exit(0 if urllib.request.urlopen("http://127.0.0.1:8100/health", timeout=2).status == 200 else 1)
except Exception: sys.exit(1)'
for i in $(seq 1 300); do
  python3 -c "$HEALTH" && break
  kill -0 $pid 2>/dev/null || { echo "$name: server died"; tail -20 $dir/server.log; exit 1; }
  sleep 0.5
done
echo "$name: ready after $(since) s" | tee $dir/ready.txt
for ph in $phases; do
  c=${ph%%:*}; d=${ph##*:}
  echo "python benchmarks/serve_load.py --url http://127.0.0.1:8100 --clients $c --duration $d --no-check --out c$c.json" > $dir/c$c.cmd
  s=$(since)
  timeout -k 5 ${PHASE_LIMIT:-150} ${PY:-python3} ~/run/serve_load.py --url http://127.0.0.1:8100 --clients $c --duration $d --no-check \
    --note "phase started $s s after the server was launched" --out $dir/c$c.json 2>&1 | grep -v -i warn | grep -E "tokens/s|TTFT|ITL|errors|batch" | sed "s/^/$name c$c: /"
done
kill -INT -$pid 2>/dev/null; sleep 3; kill -9 -$pid 2>/dev/null; wait $pid 2>/dev/null
echo "$name: stopped at $(since) s; graphs captured: $(grep -c captured $dir/server.log)"
grep -E "measuring|captured" $dir/server.log | tail -3
