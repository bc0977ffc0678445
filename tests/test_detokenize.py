"""Incremental detokenisation: the text grown token by token equals decoding everything at once, and
text is never handed out while a character is incomplete or a stop string may still be forming."""

from __future__ import annotations

import pytest

from helpers import make_tiny_target
from treeflash import LLM, SamplingParams
from treeflash.detokenize import IncrementalDetokenizer

TEXT = "Grüße, 木 and a tree 🌳 at the end: ok 👍🏽!"


def byte_tokenizer():
    """A byte-level tokenizer with one token per byte (no merges): multi-byte characters span tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    chars = {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_incomplete_characters_are_held_back_and_the_text_equals_one_decode():
    tok = byte_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert ids == list(TEXT.encode())  # one token per byte
    detok, pieces = IncrementalDetokenizer(tok), []
    for n, token in enumerate(ids, 1):
        pieces.append(detok.push(token))
        assert "\ufffd" not in detok.text
        assert TEXT.encode().startswith(detok.text.encode())
        # Everything up to the last complete character is out.
        assert len(detok.text.encode()) == len(ids[:n]) - _incomplete_tail(bytes(ids[:n]))
    assert "".join(pieces) == detok.text == TEXT == tok.decode(ids)


def _incomplete_tail(data: bytes) -> int:
    for cut in range(4):
        try:
            data[:len(data) - cut].decode()
            return cut
        except UnicodeDecodeError:
            continue
    raise AssertionError


@pytest.mark.parametrize("seed", range(4))
def test_a_rounds_tokens_at_once_give_the_same_text_as_one_by_one(seed):
    import random

    tok = byte_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    rng = random.Random(seed)
    one, many = IncrementalDetokenizer(tok), IncrementalDetokenizer(tok)
    at = 0
    while at < len(ids):
        chunk = ids[at:at + rng.randint(1, 6)]  # a round's accepted tokens
        at += len(chunk)
        for token in chunk:
            one.push(token)
        many.push_many(chunk)
        # The same text out after every round: complete characters before an incomplete one too.
        assert many.text == one.text
    assert many.text == one.text == TEXT


def test_a_sequence_ending_mid_character_releases_it_on_flush():
    tok = byte_tokenizer()
    ids = list("ab🌳".encode())[:-1]  # the tree's last byte never comes
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push(t) for t in ids) == "ab"
    assert detok.flush() == "\ufffd" and detok.text == tok.decode(ids)
    assert detok.flush() == ""


@pytest.mark.integration
def test_smollm2_tokenizer_text_grows_exactly():
    from treeflash.checkpoint import load_tokenizer, resolve_model_dir

    tok = load_tokenizer(resolve_model_dir(None))
    text = "def f(x):\n    return x ** 2  # Grüße 木 🌳🌳 <|im_end|> ok"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    out = "".join(detok.push(t) for t in ids) + detok.flush()
    assert out == detok.text == tok.decode(ids, skip_special_tokens=True)
    rounds = IncrementalDetokenizer(tok)
    out = "".join(rounds.push_many(ids[i:i + 3]) for i in range(0, len(ids), 3)) + rounds.flush()
    assert out == rounds.text == detok.text


@pytest.fixture(scope="module")
def char_llm(tmp_path_factory):
    path = make_tiny_target(tmp_path_factory.mktemp("detok") / "chars", tokenizer=True)
    return LLM(str(path), device="cpu", max_num_seqs=2)


def test_stop_reason_and_a_stop_string_kept_in_the_text(char_llm):
    """vLLM's stop_reason (the stop string, the stop token's id, None for EOS and length) and
    include_stop_str_in_output (the text ends with the stop string, streamed too); the tokens are the same."""
    free = char_llm.generate("abc", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    stop = free.text[20:23]
    at = free.text.index(stop)
    cut = char_llm.generate("abc", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                  stop=["zzzzz", stop]))[0]
    kept = char_llm.generate("abc", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                   stop=["zzzzz", stop], include_stop_str_in_output=True))[0]
    assert (cut.text, cut.stop_reason, cut.finish_reason) == (free.text[:at], stop, "stop")
    assert (kept.text, kept.stop_reason) == (free.text[:at + len(stop)], stop) and kept.token_ids == cut.token_ids
    chunks = list(char_llm.stream("abc", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop],
                                                        include_stop_str_in_output=True)))
    assert "".join(c.text for c in chunks) == kept.text
    token = free.token_ids[7]
    by_id = char_llm.generate("abc", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                    stop_token_ids=[token]))[0]
    assert (by_id.stop_reason, by_id.finish_reason, by_id.token_ids[-1]) == (token, "stop", token)
    assert free.stop_reason is None  # (max_tokens)
    with pytest.raises(ValueError, match="include_stop_str_in_output"):
        SamplingParams(include_stop_str_in_output=1)


def test_skip_special_tokens_false_writes_them_into_the_text(char_llm):
    forced = dict(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={0: 100.0})  # id 0: the special <eos>
    kept = char_llm.generate("ab", SamplingParams(**forced, skip_special_tokens=False))[0]
    dropped = char_llm.generate("ab", SamplingParams(**forced))[0]
    assert kept.token_ids == dropped.token_ids == [0, 0, 0]
    assert (kept.text, dropped.text) == ("<eos><eos><eos>", "")
    chunks = list(char_llm.stream("ab", SamplingParams(**forced, skip_special_tokens=False)))
    assert "".join(c.text for c in chunks) == kept.text
    with pytest.raises(ValueError, match="skip_special_tokens"):
        SamplingParams(skip_special_tokens="no")


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(char_llm):
    """vLLM's left truncation: the prompt's last k tokens, as if given alone; -1 keeps as many as leave one
    token to generate, so an over-long prompt runs."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = char_llm.generate("the tail", params)[0]
    got = char_llm.generate("a long head and then the tail", SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, truncate_prompt_tokens=len("the tail")))[0]
    assert (got.prompt_token_ids, got.token_ids) == (want.prompt_token_ids, want.token_ids)
    longest = char_llm.max_model_len - 1
    over = "x" * (char_llm.max_model_len + 5)
    with pytest.raises(ValueError, match="max_model_len"):
        char_llm.generate(over, SamplingParams(max_tokens=1))
    out = char_llm.generate(over, SamplingParams(temperature=0, max_tokens=1, truncate_prompt_tokens=-1))[0]
    assert len(out.prompt_token_ids) == longest and len(out.token_ids) == 1
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_stream_holds_back_a_possible_stop_string(char_llm):
    free = char_llm.generate("abc", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].text
    stop = free[20:23]
    at = free.index(stop)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=["zzzzz", stop])
    chunks = list(char_llm.stream("abc", params))
    assert "".join(c.text for c in chunks) == chunks[-1].output.text == free[:at]
    printed = ""
    for chunk in chunks[:-1]:
        printed += chunk.text
        # Nothing handed out before the end may be part of the stop string: 4 characters stay back.
        assert len(printed) <= at and chunk.output is None
    assert chunks[-1].output.finish_reason == "stop"


class _CountingTokenizer:
    """Counts the tokens decoded, to see the cost per token stay flat."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kwargs)


@pytest.mark.parametrize("seed", range(3))
def test_runs_that_end_mid_character_cost_linear_time_and_give_the_final_text(seed):
    """A model that loops on bytes which never complete a character (lone lead bytes, stray continuation
    bytes) used to make every token decode the whole run again. The text let out is still final: a prefix
    of one decode of everything, whatever comes next, and equal to it after flush."""
    import random

    rng = random.Random(seed)
    tok = byte_tokenizer()
    # Mostly lead bytes and continuation bytes, some ASCII and whole characters: garbage with structure.
    pool = [[0xF0], [0xE2], [0x82], [0xAC], [0x9F], [0xFF], [ord("a")], list("€".encode()), list("🌳".encode())]
    ids = [b for _ in range(1500) for b in rng.choice(pool[:6] * 6 + pool[6:])] + list("🌳".encode())[:2]
    counting = _CountingTokenizer(tok)
    detok = IncrementalDetokenizer(counting)
    final = tok.decode(ids)
    for n, token in enumerate(ids, 1):
        detok.push(token)
        assert final.startswith(detok.text)
        # What is out lags the decoding so far by the held-back tail only.
        assert len(tok.decode(ids[:n])) - len(detok.text) <= 10
    assert counting.decoded < 40 * len(ids)
    detok.flush()
    assert detok.text == final
    # A round's tokens at once: the same text.
    many = IncrementalDetokenizer(tok)
    for at in range(0, len(ids), 5):
        many.push_many(ids[at:at + 5])
    many.flush()
    assert many.text == final


def test_a_long_run_of_one_lead_byte_is_let_out_as_it_goes():
    tok = byte_tokenizer()
    counting = _CountingTokenizer(tok)
    detok = IncrementalDetokenizer(counting)
    for _ in range(4000):
        detok.push(0xF0)
    assert set(detok.text) == {"\ufffd"} and 4000 - 10 <= len(detok.text) <= 4000 - 4
    assert counting.decoded < 40 * 4000
    detok.flush()
    assert detok.text == tok.decode([0xF0] * 4000)
