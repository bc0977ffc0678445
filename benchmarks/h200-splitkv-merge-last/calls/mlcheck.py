"""Merge by the last program vs the merge kernel, bf16 and float32, at real shapes: max difference, and the counters
left zero after 100 calls in a CUDA graph replayed 50 times."""
import torch
from treeflash.attention import SplitKVMask
from treeflash.splitkv_attention import splitkv_attention

torch.manual_seed(0)
dev = "cuda"
for name, heads, kv, d in (("qwen3-8b", 32, 8, 128), ("smollm2", 9, 3, 64)):
    for batch, t in ((1, 1), (1, 16), (1, 65), (1, 257), (8, 65), (32, 1)):
        for dtype in (torch.bfloat16, torch.float32):
            cap = 2048
            q = torch.randn(batch, heads, t, d, device=dev, dtype=dtype)
            k = torch.randn(batch, kv, cap, d, device=dev, dtype=dtype)
            v = torch.randn(batch, kv, cap, d, device=dev, dtype=dtype)
            seq = torch.randint(0, cap - t, (batch,), device=dev, dtype=torch.int32)
            nm = torch.ones(batch, t, t, device=dev, dtype=torch.uint8).tril()
            mask = SplitKVMask(seq, nm, cap)
            a = splitkv_attention(q, k, v, seq, nm, arrivals=mask.arrivals)
            b = splitkv_attention(q, k, v, seq, nm)
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    splitkv_attention(q, k, v, seq, nm, arrivals=mask.arrivals)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                outs = [splitkv_attention(q, k, v, seq, nm, arrivals=mask.arrivals) for _ in range(100)]
            bad = 0
            for _ in range(50):
                g.replay()
                torch.cuda.synchronize()
                bad += sum(int(not torch.equal(o, a)) for o in outs)
            left = int(mask.arrivals(1).abs().sum())
            print(f"{name} b{batch} t{t} {str(dtype)[6:]}: max |last - kernel| {float((a.float() - b.float()).abs().max()):.2e}"
                  f", replays unequal {bad}/5000, counters left {left}", flush=True)
