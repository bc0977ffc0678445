"""`treeflash generate`'s threads on this CPU: 1 and 2 threads (and the default), on an idle machine and
beside one busy process, plain decoding and the default pair, the README's main job.

    python benchmarks/cpu-threads/threads.py --out benchmarks/cpu-threads/results.json

Each run is one `treeflash generate` process (its summary line parsed); the busy runs start a Python busy
loop first and stop it after. Runs are interleaved: every configuration once per repeat.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from treeflash.provenance import git_commit, source_digest  # noqa: E402

PROMPT = "Write a Python function that checks whether a number is prime."
LINE = re.compile(r"^\[(?P<method>[^\]]+)\] (?P<tokens>\d+) tokens? in (?P<s>[\d.]+) s \((?P<rate>[\d.]+) tokens/s\)")


def generate(threads: int | None, spec: str, temperature: float, seed: int, max_tokens: int) -> dict:
    cmd = [sys.executable, "-m", "treeflash", "generate", "--chat", "--spec", spec, "--temperature", str(temperature),
           "--seed", str(seed), "--max-tokens", str(max_tokens), PROMPT]
    if threads is not None:
        cmd[4:4] = ["--threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    match = next((LINE.match(line) for line in done.stderr.splitlines() if LINE.match(line)), None)
    if done.returncode or match is None:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return {"command": "treeflash " + " ".join(cmd[3:]), "tokens": int(match["tokens"]),
            "seconds": float(match["s"]), "tokens_per_s": float(match["rate"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    configs = [(load, threads, spec, temp, seed)
               for load in ("idle", "busy") for threads in (1, 2, None)
               for spec, temp, seed in (("none", 0.0, 0), ("ddtree", 0.0, 0), ("ddtree", 0.7, 1))]
    runs = []
    for repeat in range(args.repeats):
        for load, threads, spec, temp, seed in configs:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy" else None
            try:
                time.sleep(0.5 if hog else 0.0)
                run = generate(threads, spec, temp, seed, args.max_tokens)
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
            run.update(load=load, threads=threads or "default", spec=spec, temperature=temp, seed=seed, repeat=repeat)
            print(f"{load:4} threads={run['threads']!s:7} {spec:6} T={temp}: {run['tokens']} tokens, "
                  f"{run['tokens_per_s']:.1f} tokens/s", flush=True)
            runs.append(run)
    Path(args.out).write_text(json.dumps({
        "command": "python benchmarks/cpu-threads/threads.py " + " ".join(sys.argv[1:]),
        "git_commit": git_commit(), "source_digest": source_digest(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
