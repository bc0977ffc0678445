"""Tensor parallelism on several GPUs (NCCL), or on CPU processes (gloo) as a dry run of this script.

1. equality: greedy tokens with tensor_parallel_size=N equal tensor_parallel_size=1 for none, dflash and
   ddtree, and a seeded sample is identical, in float32 (exact); in bfloat16 the agreement is reported
   (the ranks' partial sums round differently from one GPU's, so ties may break differently).
2. graphs (CUDA only): every rank captures one decode forward of its shard, NCCL all-reduces inside,
   in a CUDA graph; replaying it must give the eager logits bit for bit; eager vs replay time per step.

Usage (from the repository root, on a machine with N GPUs):
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONPATH=. \
        python scripts/tp_gpu_check.py --size 2 --out results/tp_gpu_check.json
Dry run on CPU: PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/tp_gpu_check.py --device cpu --size 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from treeflash import LLM, SamplingParams

PROMPTS = [[11, 42, 7, 99, 5], [3, 1, 4, 1, 5, 9, 2, 6], [100, 200, 300]]
SHAPE = dict(vocab_size=8192, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
             head_dim=64, intermediate_size=3072, max_position_embeddings=4096)
DRY_SHAPE = {**SHAPE, "hidden_size": 128, "num_hidden_layers": 6, "head_dim": 16, "intermediate_size": 256,
             "vocab_size": 1024}  # the CPU dry run: same head counts, small enough for a laptop


def make_checkpoint(root: Path, shape: dict) -> tuple[Path, Path]:
    """A random Qwen3 target (peaky head, so greedy is far from ties) and a random DFlash drafter for it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from treeflash.models.dflash import DFlashDrafter, DrafterConfig, save_drafter

    torch.manual_seed(0)
    cfg = Qwen3Config(**shape, initializer_range=0.02, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, architectures=["Qwen3ForCausalLM"])
    model = Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    target = root / "target"
    model.save_pretrained(target)
    drafter_cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 8,
        "dflash_config": {"mask_token_id": shape["vocab_size"] - 1, "target_layer_ids": [1, 4]},
        "num_target_layers": shape["num_hidden_layers"], "vocab_size": shape["vocab_size"],
        "hidden_size": shape["hidden_size"], "intermediate_size": shape["intermediate_size"], "num_hidden_layers": 2,
        "num_attention_heads": shape["num_attention_heads"], "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"], "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    }
    drafter = DFlashDrafter(DrafterConfig.from_hf(drafter_cfg)).float()
    return target, save_drafter(drafter, root / "drafter")


def equality(target: Path, drafter: Path, device: str, size: int, dtype: str) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    sample = [SamplingParams(temperature=0.8, top_p=0.95, seed=i, max_tokens=48, ignore_eos=True)
              for i in range(len(PROMPTS))]
    out = {}
    for spec in ("none", "dflash", "ddtree"):
        kw = dict(device=device, dtype=dtype, draft_model=str(drafter) if spec != "none" else None, spec=spec,
                  tree_budget=32, max_num_seqs=4)
        runs = {}
        for tp in (1, size):
            with LLM(str(target), tensor_parallel_size=tp, **kw) as llm:
                runs[tp] = [[o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=p,
                                                               use_tqdm=False)] for p in (greedy, sample)]
        agree = [_common_prefix(a, b) for a, b in zip(runs[1][0], runs[size][0])]
        out[spec] = {"greedy_equal": runs[1][0] == runs[size][0], "sample_equal": runs[1][1] == runs[size][1],
                     "greedy_agreeing_prefix": agree, "tokens": greedy.max_tokens}
        print(f"[{dtype}] {spec}: {out[spec]}", flush=True)
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- CUDA graphs with NCCL inside, one process per rank ----------------------------------------------
def _graph_rank(rank: int, size: int, target: str, port: int, results) -> None:
    import torch.distributed as dist

    from treeflash.checkpoint import load_target
    from treeflash.kv_cache import append_layout
    from treeflash.models.parallel import Communicator, Shard
    from treeflash.parallel.rank import NCCL_ENV, CheckpointTarget, WorkerPlan, connect

    os.environ.update(NCCL_ENV)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, wait_for_workers=False)
    plan = WorkerPlan(CheckpointTarget(Path(target)), "cuda:0", torch.bfloat16, size, port, 1)
    comm = Communicator()
    model, _ = load_target(Path(target), device, torch.bfloat16, Shard(rank, size, comm))
    connect(comm, plan, rank, store)
    cache = model.new_cache(1, 512)
    with torch.inference_mode():
        prompt = torch.tensor([PROMPTS[1]], device=device)
        n = prompt.shape[1]
        rows, mask = append_layout(torch.tensor([0], device=device),
                                   torch.ones(n, n, dtype=torch.bool, device=device).tril()[None], n)
        model(prompt, rows, cache, rows, mask)
        # One decode step as static buffers: token, position, row and mask over the cache.
        token = torch.tensor([[7]], device=device)
        pos = torch.tensor([[n]], device=device)
        rows, mask = append_layout(torch.tensor([n], device=device), torch.ones(1, 1, 1, dtype=torch.bool,
                                                                                 device=device), 512)

        def step():
            hidden, _ = model(token, pos, cache, rows, mask)
            return model.logits(hidden)

        eager = step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = step()
        graph.replay()
        torch.cuda.synchronize()
        same = torch.equal(static, eager)

        def timed(fn, reps=200):
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            return round(1e3 * statistics.median(times), 4)

        result = {"replay_equals_eager": same, "eager_ms": timed(step), "replay_ms": timed(graph.replay)}
    results.put((rank, result))


def graphs(target: Path, size: int) -> dict:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    probe = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    port = probe.port
    del probe
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_graph_rank, args=(r, size, str(target), port, results)) for r in range(size)]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    print(f"graphs: {out}", flush=True)
    return {f"rank{r}": v for r, v in sorted(out.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2, help="tensor_parallel_size (default 2)")
    parser.add_argument("--device", default="cuda", help="cuda (NCCL) or cpu (gloo dry run)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--no-bf16", action="store_true",
                        help="skip the bfloat16 agreement pass (float32 equality and graphs only: half the time)")
    args = parser.parse_args()
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "torch": torch.__version__,
              "size": args.size, "device": args.device}
    if args.device == "cuda":
        report["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    with tempfile.TemporaryDirectory() as tmp:
        target, drafter = make_checkpoint(Path(tmp), SHAPE if args.device == "cuda" else DRY_SHAPE)
        report["equality_float32"] = equality(target, drafter, args.device, args.size, "float32")
        if args.device == "cuda":
            report["graphs_bfloat16"] = graphs(target, args.size)
            if not args.no_bf16:
                report["agreement_bfloat16"] = equality(target, drafter, args.device, args.size, "bfloat16")
    ok = all(v["greedy_equal"] and v["sample_equal"] for v in report["equality_float32"].values())
    ok = ok and all(v["replay_equals_eager"] for v in report.get("graphs_bfloat16", {}).values())
    report["ok"] = ok
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
