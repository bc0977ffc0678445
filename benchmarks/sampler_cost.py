"""What one draw per tree node costs at a Qwen-sized vocabulary, for the ways an exact draw can be made.

  python benchmarks/sampler_cost.py --out benchmarks/sampler_cost_h200.json           # on CUDA
  python benchmarks/sampler_cost.py --device cpu --rows 8 --out /tmp/sampler_cost.json

Rows are tree nodes (default 8 slots x 65 nodes), each with a float32 distribution over --vocab
tokens. Timed, per call over all rows:
  softmax        the float32 softmax itself (what processed_probs costs without filters), for scale
  float32_cdf    the old draw: float32 cumsum + searchsorted (not exact: TV ~2e-3 at 152k tokens)
  float64_cdf    a float64 cumsum of every row + searchsorted (exact, a float64 copy of all rows)
  two_level      treeflash's inverse_cdf: float64 block sums, then a float64 cumsum of one block
  block_sums     its first level alone as the draw makes it (on CUDA one Triton kernel, block_sums.py)
  block_sums_torch  the same sums by PyTorch's sum(dtype=float64), which copies the probabilities to
                 float64 first (what two_level did before the kernel)
  exp_race       argmax p_i / E_i with E_i = -log(u_i), u_i hashed from (seed, position, token)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_info import run_info  # noqa: E402
from treeflash.sampling import (_BLOCK, _block_sums, _block_sums_torch, _fmix32, _MASK32,  # noqa: E402
                                draw_uniforms, inverse_cdf)


def float32_cdf(probs, u):
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:].double()).float(), right=True)


def float64_cdf(probs, u):
    cdf = probs.cumsum(-1, dtype=torch.float64)
    return torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)


def two_level(probs, u):
    return inverse_cdf(probs, u[:, None])


def exp_race(probs, u, seed, positions):
    # One uniform per (row, token): the same hash chain keyed by the token id as well.
    tokens = torch.arange(probs.shape[-1], device=probs.device)
    h = _fmix32((positions[:, None] & _MASK32) ^ tokens)
    h = _fmix32(h ^ seed[:, :1])
    k = (_fmix32(h ^ 0x7F4A7C15) << 20) | (_fmix32(h ^ 0x2545F491) >> 12)
    e = -torch.log(((k << 1) | 1).double() * 2.0 ** -53)
    return (probs.double() / e).argmax(-1)


def timed(fn, device, repeats: int) -> float:
    """Median milliseconds of fn() over `repeats` calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=8 * 65, help="tree nodes drawn at once (default 8 x 65)")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary size (default 151936, Qwen)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, generator=gen, device=device) * 2.5
    probs = torch.softmax(logits, -1)
    seed = torch.randint(0, 1 << 32, (args.rows, 2), generator=gen, device=device)
    positions = torch.arange(args.rows, device=device)
    u = draw_uniforms(seed, positions[:, None])[:, 0]
    cases = {
        "softmax": lambda: torch.softmax(logits, -1),
        "float32_cdf": lambda: float32_cdf(probs, u),
        "float64_cdf": lambda: float64_cdf(probs, u),
        "two_level": lambda: two_level(probs, u),
        "block_sums": lambda: _block_sums(probs, _BLOCK),
        "block_sums_torch": lambda: _block_sums_torch(probs, _BLOCK),
        "exp_race": lambda: exp_race(probs, u, seed, positions),
    }
    ms = {name: round(timed(fn, device, args.repeats), 4) for name, fn in cases.items()}
    for name, t in ms.items():
        print(f"{name:16s} {t:9.3f} ms")
    result = {**run_info(device), "rows": args.rows, "vocab": args.vocab, "repeats": args.repeats,
              "median_ms": ms}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
