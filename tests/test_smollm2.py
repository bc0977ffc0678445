"""The embedded default, SmolLM2-135M-Instruct (GGUF): greedy output identical to transformers.

One LLM is loaded per module and shared; the tests that load transformers' reference or build a
second LLM with a drafter are marked `slow` (over ~20 s on 2 busy cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import one_thread
from treeflash import LLM, SamplingParams
from treeflash.default_model import default_gguf_path

pytestmark = pytest.mark.integration

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
CHATS = [[{"role": "user", "content": "What is the boiling point of water?"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three trees."}]]
NEW_TOKENS = 32


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    # The CLI's default on this kind of machine too, so the CLI and in-process runs compute alike.
    with one_thread():
        yield


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(spec="none")  # no model argument: the embedded default target, decoded plainly


@pytest.fixture(scope="module")
def reference():
    """transformers' own load of the same GGUF file, float32."""
    from transformers import AutoModelForCausalLM

    path = default_gguf_path()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def reference_greedy(model, ids: list[int]) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def test_default_model_is_smollm2(llm: LLM) -> None:
    cfg = llm.config
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == ("LlamaForCausalLM", 30, 576, 49152)
    assert llm.tokenizer is not None and llm.tokenizer.chat_template


@pytest.mark.slow
def test_greedy_text_prompts_match_transformers(llm: LLM, reference) -> None:
    outs = llm.generate(PROMPTS, greedy())
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == reference_greedy(reference, out.prompt_token_ids), prompt
        assert out.finish_reason == "length" and out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


@pytest.mark.slow
def test_greedy_chat_prompts_match_transformers(llm: LLM, reference) -> None:
    outs = llm.chat(CHATS, greedy())
    for chat, out in zip(CHATS, outs):
        text = llm.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
        assert out.prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)
        assert out.token_ids == reference_greedy(reference, out.prompt_token_ids)


def test_chat_reply_stops_at_end_of_turn(llm: LLM) -> None:
    out = llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=200))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == llm.tokenizer.eos_token_id == 2
    assert "<|im_end|>" not in out.text and out.text.strip()


def test_batched_one_slot_and_many_slots_agree(llm: LLM) -> None:
    batched = llm.generate(PROMPTS, greedy(12))
    single = [llm.generate(p, greedy(12))[0] for p in PROMPTS]
    assert [o.token_ids for o in batched] == [o.token_ids for o in single]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "treeflash", *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_cli_generate_streams_the_greedy_text(llm: LLM) -> None:
    result = run_cli("generate", PROMPTS[0], "--temperature", "0", "--max-tokens", "8", "--ignore-eos")
    assert result.returncode == 0, result.stderr
    expected = llm.generate(PROMPTS[0], greedy(8))[0].text
    assert result.stdout.rstrip("\n") == expected
    assert "8 tokens" in result.stderr and "tokens/s" in result.stderr


def test_cli_chat_streams_the_seeded_templated_reply_and_show_tree_needs_a_drafter(llm: LLM) -> None:
    result = run_cli("generate", "Hi", "--chat", "--system", "Be brief.", "--max-tokens", "6", "--seed", "3",
                     "--show-tree", "--spec", "none")
    assert result.returncode == 0, result.stderr
    # The CLI's defaults (temperature 0.7) and seed give the reply the API gives the same conversation.
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = llm.chat(chat, SamplingParams(temperature=0.7, max_tokens=6, seed=3), use_tqdm=False)[0]
    assert result.stdout.rstrip("\n") == expected.text and expected.text
    # Plain decoding drafts no tree: said once, with no empty drawing.
    assert "no draft tree: plain decoding" in result.stderr and "draft tree:" not in result.stdout
    assert result.stderr.splitlines()[-2].startswith(f"[none] {len(expected.token_ids)} tokens in ")


def test_cli_chat_holds_a_conversation_and_ddtree_replies_as_plain_decoding(llm: LLM) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "treeflash", "chat", "--temperature", "0", "--max-tokens", "24"],
                            input="What is 2+2?\nAnd times 3?\n", capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    conversation = [{"role": "user", "content": "What is 2+2?"}]
    params = SamplingParams(temperature=0, max_tokens=24)
    first = llm.chat(conversation, params, use_tqdm=False)[0].text
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "And times 3?"}]
    second = llm.chat(conversation, params, use_tqdm=False)[0].text
    assert result.stdout == f"{first}\n{second}\n"  # (the shipped pair's DDTree, plain decoding's text)
    assert result.stderr.count("[ddtree + lookup 8] ") == 2


def test_cli_holds_the_reply_to_a_structure(llm: LLM, tmp_path) -> None:
    result = run_cli("generate", "Is water wet?", "--chat", "--temperature", "0", "--choice", "yes", "--choice", "no")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") in ("yes", "no")
    schema = tmp_path / "city.json"
    schema.write_text('{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}')
    result = run_cli("generate", "Name a city.", "--chat", "--temperature", "0", "--json-schema", str(schema))
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) == {"city"}


@pytest.mark.parametrize("args, message", [
    (["generate", "x", "--top-p", "1.5"], "top_p"),
    (["generate", "x", "--json-schema", "/nonexistent/schema.json"], "cannot read"),
    (["generate", "x", "--regex", "(ab"], "cannot build an automaton"),
    (["generate", "x", "--model", "/nonexistent/model"], "no such model"),
    (["generate", "x", "--model", "other.gguf", "--spec", "ddtree"], "draft_model"),  # a model but no drafter
    (["generate", "x", "--device", "tpu"], "device must be 'cpu' or 'cuda'"),
])
def test_cli_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.startswith("treeflash: error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", [[], ["generate"], ["convert"]])
def test_cli_help_documents_every_command(command: list[str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0 and "usage: treeflash" in result.stdout and len(result.stdout) > 300


@pytest.fixture(scope="module")
def random_smollm2_drafter(tmp_path_factory, llm: LLM):
    """A randomly initialised one-layer DFlash drafter shaped for SmolLM2: it proposes poorly, which is
    exactly when losslessness must still hold (the shipped trained one: test_default_drafter.py)."""
    from treeflash.models.dflash import DFlashDrafter, DrafterConfig, save_drafter

    c = llm.config
    torch.manual_seed(0)
    cfg = DrafterConfig.from_hf({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 8,
        "dflash_config": {"mask_token_id": 3, "target_layer_ids": [15]}, "num_target_layers": c.num_layers,
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": 1536,
        "num_hidden_layers": 1, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192})
    return save_drafter(DFlashDrafter(cfg), tmp_path_factory.mktemp("drafter"))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["dflash", "ddtree"])
def test_speculative_greedy_on_smollm2_equals_plain(llm: LLM, random_smollm2_drafter, spec: str) -> None:
    spec_llm = LLM(draft_model=random_smollm2_drafter, spec=spec, tree_budget=16)
    outs = spec_llm.generate(PROMPTS, greedy(24))
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm.generate(PROMPTS, greedy(24))]
    # Every token after the first comes from a round; the last round may accept past max_tokens.
    assert all(o.metrics.rounds >= 1 and sum(o.metrics.acceptance_lengths) >= 23 for o in outs)


def test_cli_show_tree_draws_the_draft_tree(random_smollm2_drafter) -> None:
    result = run_cli("generate", PROMPTS[0], "--temperature", "0", "--max-tokens", "6", "--ignore-eos",
                     "--draft-model", str(random_smollm2_drafter), "--tree-budget", "8", "--show-tree")
    assert result.returncode == 0, result.stderr
    tree = result.stdout.split("last round's draft tree:")[1]
    assert "(8 draft nodes" in tree and "log q=" in tree and "accepted path" in tree
    # (prompt lookup, the default with a drafter, adds its nodes, named as such where it found any)
    assert ("from prompt lookup" in tree) == ("(lookup)" in tree)
    assert "[ddtree + lookup 8]" in result.stderr and "mean acceptance length" in result.stderr
