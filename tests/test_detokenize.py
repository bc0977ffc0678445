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
