"""What loading an FP8 checkpoint holds: a random Qwen3-0.6B-shape checkpoint written twice (bfloat16, and FP8 with
128 x 128 block scales as Qwen's FP8 releases store it), each loaded by `load_target` into float32 and bfloat16 in
a process of its own; the time and the process's peak resident memory.

    python benchmarks/cpu-fp8-load/run.py DIR          # writes DIR/bf16, DIR/fp8, prints one line a load
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HIDDEN, LAYERS, MLP, VOCAB = 1024, 28, 3072, 151936  # Qwen3-0.6B's shape (tied embeddings)
BLOCK = 128


def write(path: Path, fp8: bool) -> None:
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (2048, HIDDEN), p + "self_attn.k_proj.weight": (1024, HIDDEN),
                   p + "self_attn.v_proj.weight": (1024, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, 2048),
                   p + "mlp.gate_proj.weight": (MLP, HIDDEN), p + "mlp.up_proj.weight": (MLP, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, MLP), p + "input_layernorm.weight": (HIDDEN,),
                   p + "post_attention_layernorm.weight": (HIDDEN,), p + "self_attn.q_norm.weight": (128,),
                   p + "self_attn.k_norm.weight": (128,)}
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        weight = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if fp8 and name.endswith("proj.weight"):
            scale = torch.full((-(-shape[0] // BLOCK), -(-shape[1] // BLOCK)), 0.02 / 100)
            tensors[name] = (weight.float() / 0.02 * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = scale
        else:
            tensors[name] = weight
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": HIDDEN,
           "intermediate_size": MLP, "num_hidden_layers": LAYERS, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
           "max_position_embeddings": 4096, "rope_theta": 1000000.0, "torch_dtype": "bfloat16"}
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [BLOCK, BLOCK]}
    (path / "config.json").write_text(json.dumps(cfg))


def load(path: Path, dtype: str) -> None:
    import torch

    from treeflash.checkpoint import load_target

    start = time.perf_counter()
    model, _ = load_target(path, "cpu", getattr(torch, dtype))
    seconds = time.perf_counter() - start
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (Linux: kilobytes)
    print(f"{path.name:>4} -> {dtype:<8}: {seconds:5.1f} s, model {size / 1e9:.2f} GB, peak resident "
          f"{peak / 1e9:.2f} GB", flush=True)


if __name__ == "__main__":
    # Every step in a process of its own, started from this one, which holds no tensors: a child's peak resident
    # memory counts what its parent held when it was forked.
    if sys.argv[1] == "--load":
        load(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "--write":
        write(Path(sys.argv[2]), sys.argv[3] == "fp8")
    else:
        root = Path(sys.argv[1])
        for kind in ("bf16", "fp8"):
            subprocess.run([sys.executable, __file__, "--write", str(root / kind), kind], check=True)
        for kind in ("bf16", "fp8"):
            for dtype in ("bfloat16", "float32"):
                subprocess.run([sys.executable, __file__, "--load", str(root / kind), dtype], check=True)
