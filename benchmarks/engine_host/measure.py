"""Host-side cost of Engine.step at many slots, on the CPU with a tiny random target.

Counts per step: aten ops dispatched (each is a kernel launch + dispatcher time on a GPU), host syncs
(.tolist/.item/.cpu on a tensor), prefill forwards, admissions, retirements; and the Python time
of engine/speculator methods (their own time minus aten op time is host overhead).
"""
import sys, time, random, collections, argparse
sys.path.insert(0, "tests")
import torch
torch.set_num_threads(1)
from torch.utils._python_dispatch import TorchDispatchMode
from pathlib import Path
import shutil, glob

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=1024)
ap.add_argument("--slots", type=int, default=512)
ap.add_argument("--greedy", action="store_true")
ap.add_argument("--min-tokens", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=64)
ap.add_argument("--vocab", type=int, default=49152)
ap.add_argument("--count-ops", action="store_true")
ap.add_argument("--profile", action="store_true")
ap.add_argument("--admit-batch", type=int, default=None)
args = ap.parse_args()

from helpers import make_tiny_target
from treeflash.checkpoint import resolve_model_dir
d = Path(f"/tmp/treeflash-engine-host/tiny{args.vocab}")
if not d.exists():
    make_tiny_target(d, "llama", vocab_size=args.vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     intermediate_size=128, max_position_embeddings=2048, eos_token_id=2)
    src = resolve_model_dir(None)
    for f in glob.glob(str(src / "tokenizer*")) + glob.glob(str(src / "special_tokens_map.json")):
        shutil.copy(f, d)
from treeflash.llm import LLM
from treeflash.train.prompts import load_prompts
from treeflash.train.data import prompt_token_ids
from treeflash.sampling import SamplingParams

llm = LLM(str(d), max_num_seqs=args.slots, spec="none", time_stages=False, prefill_tokens_per_step=32768,
          max_model_len=256 + 64 + args.max_tokens, **({} if args.admit_batch is None else {"admit_batch": args.admit_batch}))
prompts = load_prompts("sharegpt")[:args.n]
ids = [prompt_token_ids(llm, p, 256) for p in prompts]
rng = random.Random(0)
# Staggered lengths stand in for EOS at different times (a random model rarely says EOS).
params = [SamplingParams(temperature=0.0 if args.greedy or i % 2 == 0 else 0.2, top_p=1.0 if args.greedy or i % 2 == 0 else 0.9,
                         max_tokens=rng.randint(args.min_tokens, args.max_tokens), ignore_eos=True, seed=i,
                         detokenize=False) for i in range(args.n)]

stats = collections.Counter()
class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, a=(), kw=None):
        stats["ops:" + stats_region[-1]] += 1
        return func(*a, **(kw or {}))
stats_region = ["other"]

def wrap(obj, name, region):
    f = getattr(obj, name)
    def g(*a, **k):
        stats_region.append(region)
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            stats["s:" + region] += time.perf_counter() - t
            stats["n:" + region] += 1
            stats_region.pop()
    setattr(obj, name, g)

eng = llm.engine
sp = eng.speculator
wrap(sp, "prefill_and_start", "prefill_and_start")  # forward, commit and first tokens
wrap(sp, "release_many", "release") if hasattr(sp, "release_many") else wrap(sp, "release", "release")
wrap(eng.runner, "round", "round")
wrap(eng, "_append", "append")
orig_tolist = torch.Tensor.tolist
steps = 0
t0 = time.perf_counter()
import cProfile, pstats
pr = cProfile.Profile() if args.profile else None
mode = Count() if args.count_ops else None
if mode: mode.__enter__()
if pr: pr.enable()
reqs = llm._requests(None, params, ids)
for r in reqs: eng.add(r)
step_t = 0.0
while not all(r.finished for r in reqs):
    t = time.perf_counter()
    eng.step()
    step_t += time.perf_counter() - t
    steps += 1
if pr: pr.disable()
if mode: mode.__exit__(None, None, None)
el = time.perf_counter() - t0
toks = sum(len(r.output_ids) for r in reqs)
print(f"n={args.n} slots={args.slots} greedy={args.greedy} tokens={toks} steps={steps} wall={el:.2f}s "
      f"step_total={step_t:.2f}s per_step={1e3*step_t/steps:.2f}ms tok/s={toks/el:.0f}")
for k in sorted(stats):
    v = stats[k]
    if k.startswith("s:"):
        print(f"  {k:24s} {v:8.3f}s  per step {1e3*v/steps:7.3f} ms")
    else:
        print(f"  {k:24s} {v:8d}    per step {v/steps:7.2f}")
if pr:
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
