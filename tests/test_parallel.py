"""Tensor parallelism on CPU with gloo: each rank holds its slice of the target, every rank gets the same
logits, and tensor_parallel_size=2 gives exactly the tokens of tensor_parallel_size=1 (greedy and seeded
sampling; none, dflash and ddtree). Uneven splits are refused before any weight is read, and a worker
that dies is reported with no process left behind."""

from __future__ import annotations

import dataclasses

import datetime
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.checkpoint import load_target
from treeflash.kv_cache import append_layout
from treeflash.models.parallel import Communicator, Shard, TensorParallelConfigError
from treeflash.parallel import TensorParallelError
from helpers import make_tiny_target, one_thread
from spec_helpers import make_drafter

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (target dir, drafter dir); peaky heads so greedy is far from ties. The character tokenizer
    makes streams yield every round (a stream can then be closed, or a worker killed, mid-request)."""
    root = tmp_path_factory.mktemp("tp")
    out = {}
    for arch in ("llama", "qwen2", "qwen3"):
        target = make_tiny_target(root / arch, arch, logit_scale=2.0, tokenizer=True)
        out[arch] = target, make_drafter(root / f"{arch}-drafter", target, 4)
    return out


def _generate(target, drafter, spec, tp, params=GREEDY, prompts=PROMPTS, ngram_tokens=0):
    with one_thread(), LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None,
                           spec=spec, tree_budget=6, max_num_seqs=2, tensor_parallel_size=tp,
                           ngram_tokens=ngram_tokens) as llm:
        return [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)]


# --- the sharded decoder, in one process (ranks as threads) ---------------------------------------
def _forward_logits(model, tokens):
    n = tokens.shape[1]
    cache = model.new_cache(1, 32)
    rows, mask = append_layout(torch.tensor([0]), torch.ones(n, n, dtype=torch.bool).tril()[None], n)
    hidden, _ = model(tokens, torch.arange(n)[None], cache, rows, mask)
    return model.logits(hidden)


def _sharded_logits(path, size, tokens):
    """Every rank's logits and parameter count, the ranks run as threads over an in-process gloo group."""
    import torch.distributed as dist

    store, results = dist.HashStore(), [None] * size

    def rank(r):
        comm = Communicator()
        model, _ = load_target(path, "cpu", torch.float32, Shard(r, size, comm))
        comm.connect(dist.ProcessGroupGloo(store, r, size, datetime.timedelta(seconds=60)))
        results[r] = _forward_logits(model, tokens), model

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("arch, size, kv_heads, vocab", [("llama", 2, 2, 64), ("qwen2", 2, 2, 63), ("qwen3", 2, 2, 64),
                                                         ("qwen3", 4, 2, 62), ("llama", 4, 1, 64)])
def test_shards_hold_their_slice_and_every_rank_gets_the_same_logits(tmp_path, arch, size, kv_heads, vocab):
    """vocab not divisible by the ranks: the vocab-parallel logits pad the last rank's rows."""
    path = make_tiny_target(tmp_path / arch, arch, num_heads=4, num_kv_heads=kv_heads, vocab_size=vocab)
    full, cfg = load_target(path, "cpu", torch.float32)
    tokens = torch.tensor([[3, 5, 7, 9, 11, 2]])
    with one_thread():
        reference = _forward_logits(full, tokens)
        results = _sharded_logits(path, size, tokens)
    d = cfg.head_dim
    for r, (logits, model) in enumerate(results):
        assert torch.equal(logits, results[0][0])  # bit-identical on every rank: same tree, same walk
        torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)
        attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
        q = cfg.num_heads * d // size
        assert torch.equal(attn.q_proj.weight, full.layers[0].self_attn.q_proj.weight[r * q:(r + 1) * q])
        assert torch.equal(attn.o_proj.weight, full.layers[0].self_attn.o_proj.weight[:, r * q:(r + 1) * q])
        kv = r // (size // kv_heads) if kv_heads < size else r  # KV heads fewer than ranks: replicated
        per = max(kv_heads // size, 1) * d
        assert torch.equal(attn.k_proj.weight, full.layers[0].self_attn.k_proj.weight[kv * per:(kv + 1) * per])
        i = cfg.intermediate_size // size
        assert torch.equal(mlp.down_proj.weight, full.layers[0].mlp.down_proj.weight[:, r * i:(r + 1) * i])
        assert model.new_cache(1, 8).keys[0].shape[1] == max(kv_heads // size, 1)


def test_uneven_splits_are_refused_before_any_weight_or_process(tmp_path, monkeypatch):
    path = make_tiny_target(tmp_path / "t", "llama", num_heads=4, num_kv_heads=2)
    import treeflash.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "read_safetensors", lambda *a, **k: pytest.fail("weights were read"))
    before = set(multiprocessing.active_children())
    with pytest.raises(TensorParallelConfigError, match=r"4 attention heads.*do not divide by 3"):
        LLM(str(path), device="cpu", tensor_parallel_size=3)
    odd = make_tiny_target(tmp_path / "odd", "qwen3", hidden_size=48, num_heads=6, num_kv_heads=3, head_dim=8)
    with pytest.raises(TensorParallelConfigError, match=r"3 KV heads"):
        LLM(str(odd), device="cpu", tensor_parallel_size=2)  # 3 KV heads: neither split nor replicated evenly
    with pytest.raises(TensorParallelConfigError, match=r"sizes that do: 1$"):  # 2 divides its 6 heads: not named
        LLM(str(odd), device="cpu", tensor_parallel_size=2)
    for bad in (0, -2, "2", 1.5, True, 1.0):  # (True and 1.0 ran as 1)
        with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
            LLM(str(path), device="cpu", tensor_parallel_size=bad)
    moe = make_tiny_target(tmp_path / "moe", "qwen3_moe", num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=16)
    with pytest.raises(TensorParallelConfigError, match=r"does not split a mixture of experts"):
        LLM(str(moe), device="cpu", tensor_parallel_size=2)
    assert set(multiprocessing.active_children()) == before


# --- two processes --------------------------------------------------------------------------------
def test_tp2_greedy_and_seeded_sample_equal_tp1(models):
    """The quick representative: qwen3 + ddtree, greedy and a seeded sample (with log-probs, one with penalties
    and a logit bias, one held to a regular expression), in one TP=2 LLM."""
    target, drafter = models["qwen3"]
    sample = [SamplingParams(temperature=0.8, top_p=0.9, seed=7 + i, max_tokens=20, ignore_eos=True, logprobs=2)
              for i in range(len(PROMPTS))]
    sample[0] = dataclasses.replace(sample[0], repetition_penalty=1.3, presence_penalty=0.5, logit_bias={5: 2.0})
    sample[1] = dataclasses.replace(sample[1], prompt_logprobs=1)
    sample[2] = dataclasses.replace(sample[2], structured_outputs={"regex": "[a-e ]+"})  # (workers get the automaton)
    with one_thread():
        single = LLM(str(target), device="cpu", draft_model=str(drafter), tree_budget=6, max_num_seqs=2)
        want_greedy = [o.token_ids for o in single.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)]
        want = single.generate(prompt_token_ids=PROMPTS, sampling_params=sample)
        with LLM(str(target), device="cpu", draft_model=str(drafter), tree_budget=6, max_num_seqs=2,
                 tensor_parallel_size=2) as llm:
            assert [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)] == want_greedy
            got = llm.generate(prompt_token_ids=PROMPTS, sampling_params=sample)
            assert [o.token_ids for o in got] == [o.token_ids for o in want]
            assert set(got[2].text) <= set("abcde ") and got[2].text
            for a, b in zip(got, want):  # (float32 sums in another order: log-probs agree to rounding)
                assert [e.keys() for e in a.logprobs] == [e.keys() for e in b.logprobs]
                assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-4)
            prompt = [(e, f) for e, f in zip(got[1].prompt_logprobs, want[1].prompt_logprobs)][1:]
            assert got[1].prompt_logprobs[0] is None and len(prompt) == len(PROMPTS[1]) - 1
            assert all(e.keys() == f.keys() and all(abs(e[t].logprob - f[t].logprob) < 1e-4 for t in e)
                       for e, f in prompt)
            # Streams, aborts and stops are engine calls too: a stream closed early leaves the ranks in step.
            stream = llm.stream(prompt_token_ids=PROMPTS[0], sampling_params=GREEDY)
            next(stream)
            stream.close()
            assert [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)] == want_greedy
            procs = list(llm.parallel._procs)
        assert not any(p.is_alive() for p in procs) and all(p.exitcode == 0 for p in procs)  # closed cleanly


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["none", "dflash", "ddtree"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tp2_greedy_equals_tp1(models, arch, spec):
    target, drafter = models[arch]
    assert _generate(target, drafter, spec, 2) == _generate(target, drafter, spec, 1)


def test_tp2_with_prompt_lookup_equals_tp1(models):
    # A CPU round cuts the lookup rows to the valid ones after one host read (lookup.compact): every rank
    # holds the same history and tree, so every rank cuts the same and the all-reduces stay matched.
    target, drafter = models["qwen3"]
    prompts = [[3, 4, 5, 3, 4, 5, 3, 4], *PROMPTS[1:]]  # one that repeats, so copies get accepted
    sample = [SamplingParams(temperature=0.8, seed=3 + i, max_tokens=20, ignore_eos=True) for i in range(3)]
    for params in (GREEDY, sample):
        assert _generate(target, drafter, "ddtree", 2, params, prompts, ngram_tokens=6) == \
            _generate(target, drafter, "ddtree", 1, params, prompts, ngram_tokens=6)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_killed_worker_gives_a_clear_error_and_leaves_no_process(models):
    target, _ = models["llama"]
    with one_thread():
        llm = LLM(str(target), device="cpu", tensor_parallel_size=2)
    stream = llm.stream(prompt_token_ids=PROMPTS[0], sampling_params=SamplingParams(temperature=0, max_tokens=200,
                                                                                    ignore_eos=True))
    next(stream)  # mid-generation
    pid = llm.parallel.pids[0]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(TensorParallelError, match=rf"worker 1 \(pid {pid}\) was killed by signal 9"):
        for _ in stream:
            pass
    assert _gone(pid)
    assert not any(p.is_alive() for p in llm.parallel._procs)
    with pytest.raises(TensorParallelError, match="killed by signal 9"):  # the LLM stays failed, clearly
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    llm.close()


def test_a_worker_that_cannot_join_is_reported_at_once_with_its_error(models, monkeypatch):
    # Rank 0 waited in the rendezvous for it until the store's timeout (10 minutes), deaf to Ctrl-C, and
    # then said nothing of its error.
    import treeflash.parallel.group as group
    from helpers import CannotJoin

    target, _ = models["llama"]
    monkeypatch.setattr(group, "CheckpointTarget", CannotJoin)
    before = set(multiprocessing.active_children())
    with one_thread(), pytest.raises(TensorParallelError, match=r"(?s)worker 1 .*failed:.*injected"):
        LLM(str(target), device="cpu", tensor_parallel_size=2)
    assert set(multiprocessing.active_children()) == before


def test_a_worker_that_ends_before_loading_names_the_main_guard(models, tmp_path):
    # spawn re-runs the script's top level in each worker: without the guard the worker fails there.
    target, _ = models["llama"]
    script = tmp_path / "unguarded.py"
    script.write_text(f"from treeflash import LLM\nLLM({str(target)!r}, device='cpu', tensor_parallel_size=2)\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert run.returncode != 0 and 'build the LLM under `if __name__ == "__main__":`' in run.stderr


@pytest.mark.slow
def test_a_worker_error_is_reported_with_its_traceback_and_the_others_stop(models):
    target, _ = models["llama"]  # 4 heads, 2 KV heads: over 4 ranks each KV head serves two
    with one_thread():
        llm = LLM(str(target), device="cpu", tensor_parallel_size=4)
    llm.parallel._cmds[1].send(("no-such-command",))  # worker 2 raises on it
    with pytest.raises(TensorParallelError, match=r"(?s)worker 2 .*failed:.*unknown command 'no-such-command'"):
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert len(llm.parallel._procs) == 3 and not any(p.is_alive() for p in llm.parallel._procs)


@pytest.mark.slow
def test_workers_exit_when_rank_0_is_killed(models):
    """No orphans even when rank 0 dies without any cleanup (SIGKILL)."""
    target, _ = models["llama"]
    script = textwrap.dedent(f"""
        import os, signal, sys
        from treeflash import LLM
        llm = LLM({str(target)!r}, device="cpu", tensor_parallel_size=2)
        print(*llm.parallel.pids, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert pids
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids)


@pytest.mark.integration
@pytest.mark.slow
def test_smollm2_over_three_ranks_gives_the_same_greedy_tokens():
    """The real checkpoint: 9 heads and 3 KV heads split over 3 ranks (each rank reads its slices)."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with one_thread():
        want = [o.token_ids for o in LLM(device="cpu").generate(prompts, params, use_tqdm=False)]
        with LLM(device="cpu", tensor_parallel_size=3) as llm:
            assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "treeflash.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.slow
def test_cli_tensor_parallel_size_streams_the_same_text(models):
    target, _ = models["qwen2"]
    args = ["generate", "hello", "--model", str(target), "--device", "cpu", "--temperature", "0",
            "--max-tokens", "12", "--ignore-eos"]
    one, two = _cli(*args), _cli(*args, "--tensor-parallel-size", "2")
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    assert two.stdout == one.stdout and "12 tokens" in two.stderr


def test_cli_uneven_split_is_a_clear_error(models):
    target, _ = models["qwen2"]
    result = _cli("generate", "hello", "--model", str(target), "--device", "cpu", "--tensor-parallel-size", "3")
    assert result.returncode == 1 and "does not split" in result.stderr and "Traceback" not in result.stderr


def test_tp2_with_prefix_reuse_equals_tp1(tmp_path):
    # Every rank's engine decides the same reuse from the same requests, and copies its own shard's rows.
    target = make_tiny_target(tmp_path / "qwen3", "qwen3", logit_scale=2.0, max_position_embeddings=2048)
    drafter = make_drafter(tmp_path / "drafter", target, 4)
    base = [(7 * i) % 61 + 1 for i in range(600)]  # more than one 512-token prefill chunk
    runs = {}
    for tp in (1, 2):
        with one_thread(), LLM(str(target), device="cpu", draft_model=str(drafter), spec="ddtree", tree_budget=6,
                               max_num_seqs=2, tensor_parallel_size=tp) as llm:
            outs = [llm.generate(prompt_token_ids=[base + tail], sampling_params=GREEDY, use_tqdm=False)[0]
                    for tail in ([1, 2], [3], [4, 5, 6])]
            runs[tp] = [(o.token_ids, o.num_cached_tokens) for o in outs]
    assert runs[2] == runs[1] and [cached for _, cached in runs[1]] == [0, 512, 512]
