"""Stop strings end a request where plain decoding (one token per round) ends it, whatever a round emits.

The rule: the request ends at the first token after which any stop string occurs in the decoded text,
and the text is cut at the earliest occurrence found at that token. `plain_rule` below states it
directly (decode every prefix, search the whole text); the engine must agree with it when fed one
token per call, a whole run in one call, or any chunking in between, and so must speculative
decoding with an oracle drafter whose rounds accept many tokens at once.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from helpers import CHARS, make_tiny_target, one_thread
from spec_helpers import install_oracle, make_drafter
from treeflash import LLM, SamplingParams
from treeflash.engine import Engine, Request


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    with one_thread():
        yield


def plain_rule(decode, ids: list[int], stops: list[str], stop_ids=frozenset(), max_tokens: int | None = None):
    """The specification: (kept ids, text, finish reason) of plain decoding over the token stream `ids`."""
    for k in range(1, len(ids) + 1):
        text = decode(ids[:k])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return ids[:k], text[:min(hits)], "stop"
        if ids[k - 1] in stop_ids:
            return ids[:k], decode(ids[:k - 1]), "stop"
        if k == max_tokens:
            return ids[:k], text, "length"
    return ids, decode(ids), None


# --- the engine's append, fed in chunks ---------------------------------------------------------------
class CharTokenizer:
    """Id i is the character CHARS[i]."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(CHARS[i] for i in ids)

    def ids(self, text: str) -> list[int]:
        return [CHARS.index(c) for c in text]


class ByteTokenizer:
    """Id i is the byte i: a multi-byte character spans tokens and decodes as U+FFFD until complete."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")

    def ids(self, text: str) -> list[int]:
        return list(text.encode())


def fed(tokenizer, ids: list[int], stops: list[str], chunks: list[int], stop_ids=frozenset(), max_tokens=1000):
    """Feed `ids` to `Engine._append` in chunks of the given sizes (the rest in one), as rounds would."""
    # Only the stop handling is under test: an engine with a tokenizer and nothing else.
    engine = Engine.__new__(Engine)
    engine.tokenizer = tokenizer
    request = Request(id=0, prompt=None, prompt_ids=[1], params=SamplingParams(stop=stops, max_tokens=max_tokens),
                      seed=0, stop_ids=frozenset(stop_ids), max_new_tokens=max_tokens)
    returned, start = [], 0
    for size in chunks + [len(ids)]:
        if request.finished or start >= len(ids):
            break
        returned += engine._append(request, ids[start:start + size])
        start += size
    assert returned == request.output_ids
    return request.output_ids, engine.text_of(request), request.finish_reason


def test_the_issue_example_one_token_per_round_and_all_at_once_agree():
    tok = CharTokenizer()
    ids = tok.ids("say hello world and more")
    stops = ["hello world", "lo"]
    want = (ids[:9], "say hel", "stop")  # "lo" is completed first, by the 9th token
    assert plain_rule(tok.decode, ids, stops) == want
    assert fed(tok, ids, stops, [1] * len(ids)) == want
    assert fed(tok, ids, stops, []) == want  # all in one call


@pytest.mark.parametrize("text,stops,kept,cut", [
    ("xxabcdyy", ["abcd", "bc"], 5, "xxa"),          # nested: the inner string ends first
    ("xxabcdyy", ["bc", "abcd"], 5, "xxa"),          # the list order does not matter
    ("xxabcdyy", ["abc", "bcd"], 5, "xx"),           # overlapping: the first to end wins
    ("xxabcdyy", ["cdy", "abc"], 5, "xx"),
    ("xxabcdyy", ["abcd", "cd"], 6, "xx"),           # the same end: cut at the earlier start
    ("xxabcdyy", ["abcd", "ab"], 4, "xx"),           # a prefix ends first
    ("abab abab", ["ab", "ab"], 2, ""),              # a repeated stop string, at the very start
    ("xaaaay", ["aaa", "aa"], 3, "x"),               # self-overlapping repeats
    ("xyz", ["xyzw"], 3, None),                      # never completed: no stop
])
def test_overlapping_nested_and_repeated_stops(text, stops, kept, cut):
    tok = CharTokenizer()
    ids = tok.ids(text)
    want = (ids[:kept], cut, "stop") if cut is not None else (ids, text, None)
    assert plain_rule(tok.decode, ids, stops) == want
    for chunks in ([1] * len(ids), [], [2] * len(ids), [3, 1, 5]):
        assert fed(tok, ids, stops, chunks) == want, chunks


@pytest.mark.parametrize("tokenizer", [CharTokenizer(), ByteTokenizer()], ids=["chars", "bytes"])
def test_random_streams_and_stops_match_plain_decoding_for_every_chunking(tokenizer):
    """Small alphabets make overlaps, nesting and repeats common; bytes split é (2) and € (3) over tokens."""
    rng = random.Random(0)
    alphabet = "ab" if isinstance(tokenizer, CharTokenizer) else "aé€"
    stops_seen = 0
    for case in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        ids = tokenizer.ids(text)
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        stop_ids = frozenset(rng.sample(ids, 1)) if rng.random() < 0.2 else frozenset()
        max_tokens = rng.randint(1, len(ids) + 2)
        want = plain_rule(tokenizer.decode, ids, stops, stop_ids, max_tokens)
        stops_seen += want[2] == "stop"
        chunkings = [[1] * len(ids), []] + [[rng.randint(1, 5) for _ in range(len(ids))] for _ in range(3)]
        for chunks in chunkings:
            assert fed(tokenizer, ids, stops, chunks, stop_ids, max_tokens) == want, (case, text, stops, chunks)
    assert stops_seen > 150


@pytest.mark.parametrize("stops,cut", [
    (["é"], "ab"),            # a stop string that is one two-byte character: completed by its 2nd byte
    (["bé"], "a"),            # spanning an ASCII token and a two-byte character
    (["éc", "€"], "ab"),      # "éc" is completed first
    (["€", "éc"], "ab"),
    (["c€d", "€"], "abéc"),     # the three-byte character is completed by its 3rd byte
])
def test_stop_string_spanning_a_multibyte_character(stops, cut):
    tok = ByteTokenizer()
    ids = tok.ids("abéc€d")
    want_ids, want_text, reason = plain_rule(tok.decode, ids, stops)
    assert (want_text, reason) == (cut, "stop")
    for chunks in ([1] * len(ids), [], [2, 2, 2, 2]):
        assert fed(tok, ids, stops, chunks) == (want_ids, cut, "stop")


# --- through LLM.generate: every method gives plain decoding's stops -----------------------------------
FREE_TOKENS = 40


class TextModels:
    """A tiny target whose tokenizer has character pieces and a few byte pieces, chosen after its greedy
    run so that the run's text holds a € (3 bytes) and an é (2 bytes); a drafter; the oracle's run."""

    def __init__(self, root: Path):
        self.target = make_tiny_target(root / "target", "qwen3", vocab_size=64, seed=13)
        self.drafter = make_drafter(root / "drafter", self.target, 8)
        self.prompt = [1, 2, 3]
        greedy = SamplingParams(temperature=0, max_tokens=FREE_TOKENS, ignore_eos=True)
        self.run = run = LLM(str(self.target), device="cpu").generate(prompt_token_ids=[self.prompt],
                                                                      sampling_params=greedy)[0].token_ids
        # Byte pieces go to tokens that occur once in the run, so the rest of its text stays readable.
        pieces, free = ["<eos>"] + CHARS[:63], {t for t in run if run.count(t) == 1 and t != 0}
        for raw in (b"\xe2\x82\xac", b"\xc3\xa9"):
            j = next(j for j in range(len(run) - len(raw) + 1) if set(run[j:j + len(raw)]) <= free)
            for token, byte in zip(run[j:j + len(raw)], raw):
                pieces[token] = f"<0x{byte:02X}>"
                free.discard(token)
        write_piece_tokenizer(self.target, pieces)
        self.llm = LLM(str(self.target), device="cpu")
        self.decode = lambda ids: self.llm.tokenizer.decode(ids, skip_special_tokens=True)
        self.text = self.decode(self.run)


def write_piece_tokenizer(path: Path, pieces: list[str]) -> None:
    """A tokenizer whose id i is pieces[i] (id 0 a special <eos>); "<0xNN>" pieces decode as raw bytes."""
    import json

    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.WordLevel(vocab={p: i for i, p in enumerate(pieces)}, unk_token=pieces[0]))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([pieces[0]])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": pieces[0], "model_max_length": 1 << 20}))


@pytest.fixture(scope="module")
def text_models(tmp_path_factory) -> TextModels:
    return TextModels(tmp_path_factory.mktemp("stops"))


def stop_sets(text: str) -> list[list[str]]:
    """Overlapping, nested, repeated and multi-byte stop sets taken from the text of a greedy run."""
    sets = []
    for j in (4, 11, 19, 27):
        sets += [[text[j:j + 6], text[j + 2:j + 4]],      # nested
                 [text[j + 2:j + 4], text[j:j + 6]],
                 [text[j:j + 4], text[j + 2:j + 7]],      # overlapping
                 [text[j + 2:j + 7], text[j:j + 4]],
                 [text[j:j + 5], text[j + 3:j + 5]],      # the same end
                 [text[j:j + 4], text[j:j + 2]],          # a prefix
                 [text[j:j + 3], text[j:j + 3]]]          # the same string twice
    for ch in "é€":
        i = text.index(ch)
        sets += [[ch], [text[max(i - 1, 0):i + 1]], [text[i:i + 2], text[max(i - 2, 0):i + 3]],
                 [text[max(i - 3, 0):i + 2], ch]]
    # A string that occurs more than once: plain decoding stops at its first occurrence.
    repeated = next(text[j:j + 2] for j in range(len(text)) if text.count(text[j:j + 2]) > 1)
    sets.append([repeated, text[-6:]])
    return [s for s in sets if all(s) and not any("\ufffd" in x for x in s)]


@pytest.mark.parametrize("spec", ["none", "dflash", "ddtree"])
def test_every_method_stops_where_plain_decoding_stops(text_models, monkeypatch, spec):
    m = text_models
    assert "é" in m.text and "€" in m.text
    sets = stop_sets(m.text)
    assert len(sets) >= 25
    if spec != "none":
        install_oracle(monkeypatch, {tuple(m.prompt): m.prompt + m.run}, 64, decoy_rate=0.0)
    llm = LLM(str(m.target), device="cpu", draft_model=None if spec == "none" else str(m.drafter), spec=spec,
              tree_budget=16)
    params = [SamplingParams(temperature=0, max_tokens=FREE_TOKENS, ignore_eos=True, stop=s) for s in sets]
    outs = llm.generate(prompt_token_ids=[m.prompt] * len(sets), sampling_params=params)
    inside_a_round = 0
    for stops, out in zip(sets, outs):
        ids, text, reason = plain_rule(m.decode, m.run, stops)
        assert (out.token_ids, out.text, out.finish_reason) == (ids, text, reason or "length"), stops
        rounds = out.metrics.acceptance_lengths
        assert 1 + sum(rounds) == len(out.token_ids)  # what rounds emitted, not what they accepted
        inside_a_round += len(rounds) > 1 and rounds[-1] < max(rounds[:-1])  # the stop cut the last one short
    if spec != "none":
        assert inside_a_round > len(sets) // 2, "most stops should fall inside a multi-token round"


class ChunkTokenizer:
    """Tokens of several bytes, some ending in the first bytes of a character (as byte-level BPE's ' \\xf0',
    a space and an emoji's lead byte): the text before such a part character is complete."""

    TABLE = [b"a", b" ", b"x", b" \xc3", b"\xa9", b"a\xe2", b"\x82\xac", b"\xe2\x82", b"\xac", b"\xc3\xa9"]

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.TABLE[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_before_a_part_character_in_the_same_token():
    # "x" then " " + é's first byte: the decode after the 2nd token is "x \ufffd", which holds " ". It was
    # missed (nothing settled), so the request ran on, and ended with the stop string in its text.
    tok = ChunkTokenizer()
    ids = [2, 3, 4, 0]
    want = (ids[:2], "x", "stop")
    assert plain_rule(tok.decode, ids, [" "]) == want
    for chunks in ([1] * 4, [], [3]):
        assert fed(tok, ids, [" "], chunks) == want
    assert fed(tok, ids, [" "], [1] * 4, max_tokens=2) == want  # was 'x \ufffd', "length"
    assert fed(tok, ids, [" "], [1] * 4, stop_ids={4}) == want  # was 'x \ufffd' with the stop token


def test_random_multibyte_token_streams_match_plain_decoding():
    tok = ChunkTokenizer()
    rng = random.Random(1)
    stops_seen = 0
    for case in range(400):
        ids = [rng.randrange(len(tok.TABLE)) for _ in range(rng.randint(1, 12))]
        stops = [rng.choice([" ", "a", "é", "€", " é", "a€", "€ ", "x", "\ufffd"]) for _ in range(rng.randint(1, 2))]
        max_tokens = rng.randint(1, len(ids))  # every request ends (an unended one holds a part character back)
        want = plain_rule(tok.decode, ids, stops, max_tokens=max_tokens)
        stops_seen += want[2] == "stop"
        for chunks in ([1] * len(ids), [], [rng.randint(1, 4) for _ in range(len(ids))]):
            assert fed(tok, ids, stops, chunks, max_tokens=max_tokens) == want, (case, ids, stops, chunks)
    assert stops_seen > 150
