"""GGUF -> HF directory conversion: exact round trips on tiny models, errors, and the real SmolLM2 GGUF."""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from contextlib import nullcontext
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from treeflash.config import ModelConfig, UnsupportedModelError
from treeflash import gguf_convert
from treeflash.gguf_convert import cached_conversion, convert_gguf, gguf_cache_key, hf_tensor_name

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"

# HF module suffix -> llama.cpp tensor name, written out independently of the converter's table.
_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # (Phi-3's fused projections)
}


def gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_TO_GGUF[module]}.{kind}"


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k permutation (rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """A 300-token byte-level BPE vocabulary: 256 bytes, 41 merges, 3 control tokens."""
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = sorted(ByteLevel.alphabet())
    merges = [f"{a} {b}" for a in "etaoin" for b in "etaoinsh"][:41]
    tokens += [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * 297 + [gguf.TokenType.CONTROL] * 3
    return tokens, merges, types


def tiny_sentencepiece_vocab() -> tuple[list[str], list[float], list[int]]:
    """A 300-token SentencePiece vocabulary as llama.cpp stores one: <unk> <s> </s>, 256 byte tokens, pieces."""
    pieces = ["▁", "e", "t", "a", "n", "▁t", "en", "ea", "▁te", "▁ten"]
    chat = ["<|endoftext|>", "<|user|>", "<|end|>", "<|assistant|>"]  # (Phi-3's, as control tokens)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + pieces
    tokens += [f"x{i}" for i in range(300 - len(tokens) - len(chat))] + chat
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [-1e3] * (300 - 259 - len(pieces))
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (300 - len(types) - len(chat))
    return tokens, scores, types + [gguf.TokenType.CONTROL] * len(chat)


def write_gguf(path: Path, model: torch.nn.Module, arch: str, *, extra_tensors: dict | None = None,
               extra_kv: dict | None = None, pre: str = "default", add_bos: bool | None = False,
               sentencepiece: bool = False) -> Path:
    """Write an HF model as an F32 GGUF the way llama.cpp's converter does (add_bos None: no such key;
    sentencepiece: Llama 2's and Mistral's kind of vocabulary instead of a byte-level BPE)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(int(head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0)))
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if arch == "phi3":  # as llama.cpp's Phi3MiniModel writes them
        w.add_pad_token_id(cfg.pad_token_id)
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_sliding_window(cfg.sliding_window or 0)
        if cfg.rope_parameters["rope_type"] == "longrope":
            scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
            original = cfg.original_max_position_embeddings
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
            for kind in ("long", "short"):
                w.add_tensor(f"rope_factors_{kind}.weight",
                             np.array(cfg.rope_parameters[f"{kind}_factor"], dtype=np.float32))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if sentencepiece:
        tokens, scores, types = tiny_sentencepiece_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    else:
        tokens, merges, types = tiny_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(298)
        w.add_eos_token_id(299)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in (extra_kv or {}).items():
        (w.add_string if isinstance(value, str) else w.add_float32)(key, value)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = t.detach().numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in name:
            a = llamacpp_permute(a, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            a = llamacpp_permute(a, cfg.num_key_value_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    for name, a in (extra_tensors or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_model(arch: str, rope: dict | None = None, **config) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 50000.0, **(rope or {})})
    if arch == "phi3":
        common |= dict(sliding_window=48, original_max_position_embeddings=256, tie_word_embeddings=False,
                       pad_token_id=0)
    common |= config
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{"tie_word_embeddings": False, **common}))
    elif arch == "phi3":  # Phi-3-mini-4k's kind by default: a window on every layer
        model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**common))
    elif arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{"tie_word_embeddings": True, **common}))
    else:  # head_dim != hidden/heads, as in real Qwen3 models
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{"tie_word_embeddings": True, "head_dim": 32,
                                                                          **common}))
    with torch.no_grad():  # norms and biases start at 1/0; randomise them so a mix-up would show
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p))
    return model.float().eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_roundtrip_exact(tmp_path: Path, arch: str) -> None:
    model = tiny_model(arch)
    src = write_gguf(tmp_path / f"tiny-{arch}.gguf", model, arch)
    out = convert_gguf(src, tmp_path / "out", tokenizer=False)

    expected = {k: v.numpy() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del expected["lm_head.weight"]
    got = load_file(out / "model.safetensors")
    assert sorted(got) == sorted(expected)
    for name, a in expected.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], a, err_msg=name)

    cfg = json.loads((out / "config.json").read_text())
    ref = model.config
    assert cfg["architectures"] == [type(model).__name__]
    assert cfg["model_type"] == arch
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "rms_norm_eps"):
        assert cfg[key] == getattr(ref, key), key
    assert cfg["head_dim"] == (32 if arch == "qwen3" else 16)
    assert cfg["rope_theta"] == 50000.0
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (298, 299)
    parsed = ModelConfig.from_dir(out)
    assert parsed.qk_norm == (arch == "qwen3") and parsed.qkv_bias == (arch == "qwen2")
    assert not (out / "tokenizer.json").exists()


def test_large_weights_are_written_in_shards(tmp_path: Path) -> None:
    """Past shard_bytes of float32 the weights go to shards with transformers' index, written one at a time;
    the checkpoint is the same model."""
    import transformers

    from treeflash.checkpoint import load_target

    model = tiny_model("llama")
    out = convert_gguf(write_gguf(tmp_path / "t.gguf", model, "llama"), tmp_path / "out", tokenizer=False,
                       shard_bytes=100_000)  # (the embedding and head alone are 76,800 bytes each)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert not (out / "model.safetensors").exists()
    got = {}
    for file in files:
        shard = load_file(out / file)
        assert sum(a.nbytes for a in shard.values()) <= 100_000 or len(shard) == 1
        got |= shard
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in got.values())
    for name, a in model.state_dict().items():
        np.testing.assert_array_equal(got[name], a.numpy(), err_msg=name)
    ids = torch.arange(40)[None]
    with torch.no_grad():
        torch.testing.assert_close(transformers.AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits,
                                   model(ids).logits, rtol=0, atol=0)
    assert load_target(out, "cpu", torch.float32)[0].embed_tokens.weight.shape == (300, 64)


@pytest.mark.parametrize("kv, factor", [
    ({"llama.rope.scaling.factor": 4.0}, 4.0),  # no type: llama.cpp reads linear
    ({"llama.rope.scale_linear": 4.0}, 4.0),  # the old key
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, 2.0),
    ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 4.0}, None),
    ({"llama.rope.scaling.factor": 1.0}, None),
    ({"llama.rope.scaling.factor": 0.0}, None),
    ({}, None),
])
def test_rope_scaling_is_read_as_llama_cpp_reads_it(tmp_path: Path, kv: dict, factor: float | None) -> None:
    out = convert_gguf(write_gguf(tmp_path / "s.gguf", tiny_model("llama"), "llama", extra_kv=kv), tmp_path / "out",
                       tokenizer=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg.get("rope_scaling") == (None if factor is None else {"rope_type": "linear", "factor": factor})


def test_unsupported_rope_scaling_is_refused(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "y.gguf", tiny_model("llama"), "llama", extra_kv={"llama.rope.scaling.type": "yarn"})
    with pytest.raises(UnsupportedModelError, match="unsupported rope scaling 'yarn'"):
        convert_gguf(src, tmp_path / "out", tokenizer=False)


def test_permutation_is_llamas() -> None:
    # The interleaved order llama.cpp stores: per head, rows (0, d/2, 1, d/2+1, ...).
    w = np.arange(8, dtype=np.float32).reshape(8, 1)  # 2 heads of dim 4
    assert llamacpp_permute(w, 2).ravel().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_tokenizer_and_chat_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    src = write_gguf(tmp_path / "tiny.gguf", tiny_model("llama"), "llama")
    out = convert_gguf(src, tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<|im_start|>", "<|im_end|>", 299)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok("ten tea<|im_end|>").input_ids
    assert ids[-1] == 299 and tok.decode(ids) == "ten tea<|im_end|>"
    # Merge ranks follow the GGUF order: "e n" outranks "t e".
    assert tok.convert_ids_to_tokens(ids) == ["t", "en", "Ġ", "t", "ea", "<|im_end|>"]


def test_llama3_pre_tokenizer(tmp_path: Path) -> None:
    """Llama 3's GGUFs (tokenizer.ggml.pre llama-bpe) split text as its own tokenizer.json does (cl100k's
    pattern, digits in threes, no space joined to a number), not as transformers' GGUF import does (GPT-2's);
    and they add a BOS to plain text, as llama.cpp does where the file does not say."""
    from transformers import AutoTokenizer

    src = write_gguf(tmp_path / "l3.gguf", tiny_model("llama"), "llama", pre="llama-bpe", add_bos=None)
    tok = AutoTokenizer.from_pretrained(convert_gguf(src, tmp_path / "out"))
    text = "In 2024, 12345 apples don'T\n\n  x"
    split = [piece for piece, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    assert split == ["In", "Ġ", "202", "4", ",", "Ġ", "123", "45", "Ġapples", "Ġdon", "'T", "ĊĊ", "Ġ", "Ġx"]
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file="l3.gguf")  # (what transformers alone gives)
    assert [p for p, _ in ref.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)][:2] == ["In", "Ġ2024"]
    ids = tok(text).input_ids
    assert ids[0] == 298 and ids[1:] == tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids[1:]) == text
    # a chat template writes its own BOS where it wants one: encoded without special tokens, none is added
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert tok.encode(chat, add_special_tokens=False)[0] == 298 and chat.startswith("<|im_start|>")


@pytest.mark.parametrize("pre, split, bos", [
    # Mistral Nemo: o200k's kind of split, a digit at a time, cased words apart; a BOS where the file is silent
    ("tekken", ["In", "Ġ", "2", "0", "2", "4", ",", "ĠHTTPServer", "Ġdon", "'t", "ĊĊ", "Ġ", "Ġx"], 298),
    # SmolLM: GPT-2's split after every digit alone
    ("smollm", ["In", "Ġ", "2", "0", "2", "4", ",", "ĠHTTPServer", "Ġdon", "'t", "ĊĊĠ", "Ġx"], None),
    ("gpt-2", ["In", "Ġ2024", ",", "ĠHTTPServer", "Ġdon", "'t", "ĊĊĠ", "Ġx"], None),
])
def test_byte_level_pre_tokenizers(tmp_path: Path, pre: str, split: list[str], bos: int | None) -> None:
    from transformers import AutoTokenizer

    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama", pre=pre, add_bos=None)
    tok = AutoTokenizer.from_pretrained(convert_gguf(src, tmp_path / "out"))
    text = "In 2024, HTTPServer don't\n\n  x"
    assert [piece for piece, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)] == split
    assert tok(text).input_ids[:1] == ([bos] if bos is not None else tok(text, add_special_tokens=False).input_ids[:1])
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


def test_end_of_turn_tokens_stop_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose EOS is the end of text (early Llama 3 GGUFs) still stops at the end of a turn, as llama.cpp
    does: control tokens named as turn ends join eos_token_id."""
    monkeypatch.setattr(gguf.GGUFWriter, "add_eos_token_id", lambda self, i: self.add_uint32(
        "tokenizer.ggml.eos_token_id", 297))  # <|endoftext|>; <|im_end|> (299) is a control token
    out = convert_gguf(write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama"), tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [297, 299]


def test_an_unread_pre_tokenizer_is_warned_of_at_every_load(tmp_path: Path) -> None:
    """At the conversion and again at each later load from the cache (which converts nothing)."""
    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama", pre="deepseek-coder")
    with pytest.warns(UserWarning, match="pre-tokenizer 'deepseek-coder' is not one treeflash reads"):
        convert_gguf(src, tmp_path / "out")
    for _ in range(2):
        with pytest.warns(UserWarning, match="pre-tokenizer 'deepseek-coder' is not one treeflash reads"):
            cached_conversion(src, tmp_path / "cache")
    quiet = write_gguf(tmp_path / "q.gguf", tiny_model("llama"), "llama", pre="llama-bpe")
    cached_conversion(quiet, tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cached_conversion(quiet, tmp_path / "cache")


@pytest.mark.parametrize("sentencepiece, add_bos, bos", [
    (True, None, 1),  # llama.cpp's default for SentencePiece vocabularies (Llama 2, Mistral)
    (True, False, None),
    (False, None, None),  # ... and for byte-level BPE ones (SmolLM2, Qwen)
    (False, True, 298),
    (False, False, None),
])
def test_add_bos_token_is_honoured(tmp_path: Path, sentencepiece: bool, add_bos: bool | None, bos: int | None
                                   ) -> None:
    """transformers' GGUF import drops tokenizer.ggml.add_bos_token: a plain prompt to a Mistral GGUF lost its
    BOS. The converted tokenizer adds it where llama.cpp would."""
    from transformers import AutoTokenizer

    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama", add_bos=add_bos, sentencepiece=sentencepiece)
    tok = AutoTokenizer.from_pretrained(convert_gguf(src, tmp_path / "out"))
    ids, bare = tok("ten tea").input_ids, tok("ten tea", add_special_tokens=False).input_ids
    assert ids == ([bos] if bos is not None else []) + bare
    assert tok.decode(bare) == "ten tea"


def test_phi3_tokenizer(tmp_path: Path) -> None:
    """A Phi-3 GGUF's SentencePiece vocabulary reads as Llama's does (transformers' own Phi-3 import loses every
    space), and its chat tokens strip the whitespace after them, as Phi-3's tokenizer.json says."""
    from transformers import AutoTokenizer

    model = tiny_model("phi3")
    tok = AutoTokenizer.from_pretrained(convert_gguf(write_gguf(tmp_path / "p.gguf", model, "phi3", sentencepiece=True,
                                                                add_bos=None), tmp_path / "out"))
    llama = AutoTokenizer.from_pretrained(convert_gguf(write_gguf(tmp_path / "l.gguf", tiny_model("llama"), "llama",
                                                                  sentencepiece=True, add_bos=None), tmp_path / "l"))
    ids = tok("ten tea").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["<s>", "▁ten", "▁t", "ea"] and ids == llama("ten tea").input_ids
    assert tok.decode(ids, skip_special_tokens=True) == "ten tea"
    chat = "<|user|>\nten tea<|end|>\n<|assistant|>\n<|endoftext|>\n"
    assert tok.convert_ids_to_tokens(tok(chat, add_special_tokens=False).input_ids) == [
        "<|user|>", "▁ten", "▁t", "ea", "<|end|>", "<|assistant|>", "<|endoftext|>", "▁", "<0x0A>"]
    assert (tok.bos_token, tok.eos_token) == ("<s>", "</s>") and len(tok) == 300  # (no token added)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == [2, 298]  # </s>, <|end|>


def test_phi4_mini_gguf_tokenizer_is_refused(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "p.gguf", tiny_model("phi3"), "phi3")  # (a byte-level BPE vocabulary)
    with pytest.raises(UnsupportedModelError, match="Phi-4's kind.*safetensors"):
        convert_gguf(src, tmp_path / "out")
    assert convert_gguf(src, tmp_path / "weights", tokenizer=False).is_dir()


def test_cached_conversion_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    src = write_gguf(tmp_path / "tiny.gguf", tiny_model("qwen3"), "qwen3", pre="qwen2")
    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "cache"))
    out = cached_conversion(src)
    assert out == tmp_path / "cache" / "converted" / f"tiny-{gguf_cache_key(src)}"
    # The first use says, in one line, that it converts and where the cache is; later uses are silent.
    assert capsys.readouterr().err == (f"treeflash: converting tiny.gguf once to safetensors in {out} "
                                       f"(set TREEFLASH_CACHE to move the cache)\n")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert cached_conversion(src) == out
    assert capsys.readouterr().err == ""
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    # No temporary directories left; beside the conversion, the digests remembered per file version.
    assert sorted(p.name for p in out.parent.iterdir()) == [".digests", out.name]
    assert cached_conversion(src, tmp_path / "other").parent == tmp_path / "other" / "converted"


def test_cache_key_reads_the_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two files of one size that differ only in the middle (the old key hashed the ends) must not
    # share a conversion, nor may a file rewritten in place reuse its stale one.
    import transformers

    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    src = write_gguf(tmp_path / "tiny.gguf", transformers.LlamaForCausalLM(config).float().eval(), "llama")
    data = bytearray(src.read_bytes())
    assert len(data) > 4 << 20  # the middle is far from both ends
    first = cached_conversion(src)
    middle = len(data) // 2
    data[middle] ^= 1
    other = tmp_path / "b" / "tiny.gguf"
    other.parent.mkdir()
    other.write_bytes(bytes(data))
    assert gguf_cache_key(other) != gguf_cache_key(src)
    assert cached_conversion(other) != first
    src.write_bytes(bytes(data))  # the same path, the same size, new bytes
    assert cached_conversion(src) == cached_conversion(other) != first
    # The remembered digest is the file's own: a second look (memo hit) gives what a fresh read gives.
    memo = first.parent / ".digests"
    before = cached_conversion(src)
    assert before.name.endswith(gguf_cache_key(src)) and any(memo.iterdir())
    # A new converter's output is a new conversion, though the file's digest is remembered.
    monkeypatch.setattr(gguf_convert, "_CONVERTER_VERSION", gguf_convert._CONVERTER_VERSION + 1)
    newer = cached_conversion(src)
    assert newer.name.endswith(gguf_cache_key(src)) and newer != before
    assert json.loads((newer / "config.json").read_text())["transformers_version"] == transformers.__version__


def test_tokenizer_comes_from_the_gguf_alone(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from helpers import write_char_tokenizer

    clean, dirty = tmp_path / "clean", tmp_path / "dirty"
    clean.mkdir(), dirty.mkdir()
    src = write_gguf(clean / "tiny.gguf", tiny_model("llama"), "llama")
    shutil.copy(src, dirty / "tiny.gguf")
    write_char_tokenizer(dirty, 64)  # another model's tokenizer beside the GGUF, and code it names
    config = json.loads((dirty / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tok.Evil", "tok.Evil"]}
    (dirty / "tokenizer_config.json").write_text(json.dumps(config))
    (dirty / "tok.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    want = AutoTokenizer.from_pretrained(convert_gguf(src, tmp_path / "a"))("ten tea").input_ids
    got = AutoTokenizer.from_pretrained(convert_gguf(dirty / "tiny.gguf", tmp_path / "b"))("ten tea").input_ids
    assert got == want and not (tmp_path / "ran").exists()


def test_convert_refuses_existing_dir(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "tiny.gguf", tiny_model("llama"), "llama")
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        convert_gguf(src, tmp_path / "out", tokenizer=False)


def test_a_directory_is_not_a_gguf_file(tmp_path: Path) -> None:
    for fn in (lambda p: convert_gguf(p, tmp_path / "out"), cached_conversion):
        with pytest.raises(ValueError, match="is a directory, not a GGUF file"):
            fn(tmp_path)


def test_missing_file(tmp_path: Path) -> None:
    for fn in (lambda p: convert_gguf(p, tmp_path / "out"), cached_conversion):
        with pytest.raises(FileNotFoundError, match="nope.gguf"):
            fn(tmp_path / "nope.gguf")


def test_bad_magic(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    for fn in (lambda p: convert_gguf(p, tmp_path / "out"), lambda p: cached_conversion(p, tmp_path)):
        with pytest.raises(ValueError, match="model.gguf: not a GGUF file"):
            fn(bad)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep", [0.5, 0.99])  # inside the metadata / inside the tensor data
def test_truncated(tmp_path: Path, keep: float) -> None:
    src = write_gguf(tmp_path / "tiny.gguf", tiny_model("llama"), "llama")
    data = src.read_bytes()
    src.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match="tiny.gguf: .*truncated"):
        cached_conversion(src, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def stub_gguf(path: Path, arch: str) -> Path:
    """A GGUF file of `arch` holding nothing but a token embedding."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="'mamba"):
        convert_gguf(stub_gguf(tmp_path / "m.gguf", "mamba"), tmp_path / "out")


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_mixture_of_experts_gguf_is_refused_pointing_at_safetensors(tmp_path: Path, arch: str) -> None:
    with pytest.raises(UnsupportedModelError, match=f"mixtures of experts .{arch}.*safetensors"):
        convert_gguf(stub_gguf(tmp_path / "m.gguf", arch), tmp_path / "out")


def test_a_llama_gguf_with_experts_is_refused_as_a_mixture(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"  # llama.cpp's Mixtral: general.architecture llama, llama.expert_count 8
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_expert_count(8)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"mixtures of experts \(llama with 8 experts.*safetensors"):
        convert_gguf(path, tmp_path / "out")


def test_unknown_tensor_is_refused(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama",
                     extra_tensors={"blk.0.attn_sinks.weight": np.ones(4, dtype=np.float32)})
    with pytest.raises(UnsupportedModelError, match="attn_sinks"):
        convert_gguf(src, tmp_path / "out", tokenizer=False)


# Phi-3-mini-4k's kind (a window on every layer), and Phi-4-mini's (half of each head rotated, tied embeddings,
# LongRoPE over a pre-training context of 256 positions, no window: llama.cpp writes 0).
@pytest.mark.parametrize("config", [{}, {
    "partial_rotary_factor": 0.5, "tie_word_embeddings": True, "sliding_window": None, "max_position_embeddings": 1024,
    "rope": {"rope_type": "longrope", "short_factor": [1.0, 1.25, 2.5, 3.75], "long_factor": [1.5, 4.0, 8.0, 12.0],
             "partial_rotary_factor": 0.5}}])
def test_phi3_gguf(tmp_path: Path, config: dict) -> None:
    """Phi-3 / Phi-4-mini GGUFs: the fused q/k/v and gate/up tensors under Phi-3's HF names (split at load as
    its safetensors' are), the rotated share, the window and LongRoPE's factors into config.json; the converted
    checkpoint computes the original's logits, in transformers and in this engine."""
    import transformers

    from treeflash.checkpoint import load_target
    from treeflash.kv_cache import append_layout

    model = tiny_model("phi3", **config)
    out = convert_gguf(write_gguf(tmp_path / "phi.gguf", model, "phi3"), tmp_path / "out", tokenizer=False)
    got = load_file(out / "model.safetensors")
    assert "model.layers.1.self_attn.qkv_proj.weight" in got and "model.layers.1.mlp.gate_up_proj.weight" in got
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["sliding_window"]) == (["Phi3ForCausalLM"], model.config.sliding_window)
    assert cfg.get("partial_rotary_factor", 1.0) == config.get("partial_rotary_factor", 1.0)
    if "rope" in config:
        assert cfg["rope_scaling"] == {k: config["rope"][k] for k in ("rope_type", "short_factor", "long_factor")}
        assert cfg["original_max_position_embeddings"] == 256

    ids = torch.randint(0, 300, (1, 200), generator=torch.Generator().manual_seed(0))
    converted = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(converted(ids).logits, want, rtol=1e-6, atol=1e-6)
        with pytest.warns(UserWarning, match="limited to its short factors") if "rope" in config else nullcontext():
            ours, _ = load_target(out, "cpu", torch.float32)
        n = ids.shape[1]
        rows, mask = append_layout(torch.tensor([0]), torch.ones(1, n, n, dtype=torch.bool).tril(), n)
        hidden, _ = ours(ids, rows, ours.new_cache(1, n), rows, mask, ())
        torch.testing.assert_close(ours.logits(hidden), want, rtol=0, atol=1e-4)


def llamacpp_rope_freqs(theta: float, head_dim: int, factor: float, low: float, high: float, original: int
                        ) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's rope_freqs.weight for a Llama 3.1 rope_scaling, written out one
    frequency at a time as it does (float32 frequencies, Python floats for the rest)."""
    out = []
    for freq in (1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)).tolist():
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# head_dim 16, theta 50,000: wavelengths 6 to 82,000 positions. Meta's Llama 3.1 values leave one frequency on
# the ramp (so the parameters come from the candidates); the others two (fitted to the ramp: low 1, high 8 and a
# context of 2,048, which give the same divisors as the parameters written).
@pytest.mark.parametrize("params", [
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 16.0, "original_max_position_embeddings": 4096},
])
def test_llama3_rope_freqs_become_its_rope_scaling(tmp_path: Path, params: dict) -> None:
    """Llama 3.1 / 3.2 / 3.3 GGUFs keep their RoPE scaling only as rope_freqs.weight: the converted
    checkpoint must compute the original model's logits, where dropping the tensor would not."""
    import transformers

    model = tiny_model("llama", rope={"rope_type": "llama3", **params})
    divisors = llamacpp_rope_freqs(50000.0, 16, params["factor"], params["low_freq_factor"],
                                   params["high_freq_factor"], params["original_max_position_embeddings"])
    assert ((divisors > 1) & (divisors < params["factor"])).sum() >= 1
    src = write_gguf(tmp_path / "l3.gguf", model, "llama", extra_tensors={"rope_freqs.weight": divisors})
    out = convert_gguf(src, tmp_path / "out", tokenizer=False)
    scaling = json.loads((out / "config.json").read_text())["rope_scaling"]
    ratio = params["low_freq_factor"]  # (parameters with the same ramp, low = 1)
    assert scaling == {"rope_type": "llama3", "factor": params["factor"], "low_freq_factor": 1.0,
                       "high_freq_factor": params["high_freq_factor"] / ratio,
                       "original_max_position_embeddings": params["original_max_position_embeddings"] / ratio}
    assert "rope_freqs.weight" not in load_file(out / "model.safetensors")

    ids = torch.randint(0, 300, (1, 250), generator=torch.Generator().manual_seed(0))
    converted = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(converted(ids).logits, want, rtol=1e-6, atol=1e-6)  # (equal, here)
        # (the check has teeth: the same weights without the scaling give other logits)
        converted.config.rope_parameters = {"rope_type": "default", "rope_theta": 50000.0}
        plain = transformers.LlamaForCausalLM(converted.config).eval()
        plain.load_state_dict(converted.state_dict())
        assert (plain(ids).logits - want).abs().max() > 1e-4  # (4e-4 and 2e-3 here)


@pytest.mark.parametrize("divisors, message", [
    (np.ones(5, dtype=np.float32), "shape"),
    (np.linspace(1, 3, 8, dtype=np.float32)[::-1].copy(), "no Llama 3 rope scaling"),
])
def test_rope_freqs_no_llama3_scaling_gives_is_refused(tmp_path: Path, divisors: np.ndarray, message: str) -> None:
    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama", extra_tensors={"rope_freqs.weight": divisors})
    with pytest.raises(UnsupportedModelError, match=message):
        convert_gguf(src, tmp_path / "out", tokenizer=False)


def test_rope_freqs_of_ones_scale_nothing(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama",
                     extra_tensors={"rope_freqs.weight": np.ones(8, dtype=np.float32)})
    assert "rope_scaling" not in json.loads((convert_gguf(src, tmp_path / "o", tokenizer=False) / "config.json")
                                            .read_text())


def test_rope_freqs_and_a_linear_factor_are_refused(tmp_path: Path) -> None:
    divisors = llamacpp_rope_freqs(50000.0, 16, 8.0, 1.0, 4.0, 8192)
    src = write_gguf(tmp_path / "t.gguf", tiny_model("llama"), "llama", extra_tensors={"rope_freqs.weight": divisors},
                     extra_kv={"llama.rope.scaling.factor": 2.0})
    with pytest.raises(UnsupportedModelError, match="both rope_freqs.weight and a linear"):
        convert_gguf(src, tmp_path / "out", tokenizer=False)


def test_tensor_names() -> None:
    assert hf_tensor_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.3.attn_k_norm.weight") == "model.layers.3.self_attn.k_norm.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.0.ffn_gate_exps.weight") is None


# ---- the real default checkpoint -------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(GGUF path, converted directory), converted once per test session into a private cache."""
    from treeflash.default_model import default_gguf_path

    src = default_gguf_path()
    return src, cached_conversion(src, tmp_path_factory.mktemp("cache"))


@pytest.mark.integration
def test_default_model_path() -> None:
    from treeflash.default_model import DEFAULT_MODEL_NAME, default_gguf_path

    path = default_gguf_path()
    assert path.name == f"{DEFAULT_MODEL_NAME}.Q4_1.gguf" and path.stat().st_size == 98_362_432


@pytest.mark.integration
@pytest.mark.slow  # converts the GGUF into a private cache first
def test_smollm2_weights_and_config_match_transformers(smollm2: tuple[Path, Path]) -> None:
    from transformers import AutoModelForCausalLM

    src, out = smollm2
    ref = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    ref_state = ref.state_dict()
    got = load_file(out / "model.safetensors")
    assert set(got) == set(ref_state) - {"lm_head.weight"}  # tied to the embedding
    for name, a in got.items():
        np.testing.assert_array_equal(a, ref_state[name].numpy(), err_msg=name)

    cfg = json.loads((out / "config.json").read_text())
    rc = ref.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings"):
        assert cfg[key] == getattr(rc, key), key
    assert cfg["rms_norm_eps"] == 1e-5 and np.float32(rc.rms_norm_eps) == np.float32(1e-5)
    assert cfg["rope_theta"] == rc.rope_parameters["rope_theta"] == 100000.0
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    # The GGUF's eos is <|im_end|> (2); the HF config loaded from the GGUF agrees, its tokenizer does not.
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)

    # The directory is a valid HF checkpoint computing the same logits.
    mine = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[1, 9690, 198, 19556, 905, 2]])
    with torch.no_grad():
        torch.testing.assert_close(mine(ids).logits, ref(ids).logits, rtol=0, atol=0)


@pytest.mark.integration
@pytest.mark.slow  # converts the GGUF into a private cache first
def test_smollm2_tokenizer(smollm2: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    src, out = smollm2
    ref = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tok = AutoTokenizer.from_pretrained(out)
    for text in ["Hello world", "  leading spaces and\ttabs\n\nnewlines", "In 2024, 12345 apples cost $3.50.",
                 "naïve café — 東京 🙂", "<|im_start|>user\nhi<|im_end|>\n"]:
        assert tok(text).input_ids == ref(text).input_ids, text
        assert tok.decode(tok(text).input_ids) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.integration
@pytest.mark.slow  # converts the GGUF into a private cache first
def test_smollm2_cache_is_reused(smollm2: tuple[Path, Path]) -> None:
    src, out = smollm2
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert cached_conversion(src, out.parent.parent) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(os.listdir(out)) == ["chat_template.jinja", "config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]


@pytest.mark.parametrize("patch, message", [
    ({"add_head_count": lambda self, n: None}, "lacks llama.attention.head_count"),
    ({"add_head_count": lambda self, n: self.add_uint32("llama.attention.head_count", 0)}, "must be at least 1"),
    ({"add_head_count": lambda self, n: self.add_array("llama.attention.head_count", [n, n])}, "must be one int"),
    ({"add_eos_token_id": lambda self, n: self.add_uint32("tokenizer.ggml.eos_token_id", 5000)}, "past the 300 tokens"),
])
def test_bad_metadata_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patch, message) -> None:
    # Each failed deep inside before (a ZeroDivisionError, a TypeError, an IndexError in gguf's reader).
    for name, method in patch.items():
        monkeypatch.setattr(gguf.GGUFWriter, name, method)
    src = write_gguf(tmp_path / "tiny.gguf", tiny_model("llama"), "llama")
    with pytest.raises(ValueError, match=message):
        convert_gguf(src, tmp_path / "out")
