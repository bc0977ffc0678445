"""vLLM's output layout: one RequestOutput per prompt, its SamplingParams.n completions in `outputs`
(CompletionOutput), choice j seeded seed + j; the RequestOutput's own fields are its first completion's.
And vLLM's prompt dicts, get_tokenizer and `finished`, so code written for vLLM runs unchanged."""

from __future__ import annotations

import pytest

from helpers import make_tiny_target
from treeflash import LLM, CompletionOutput, SamplingParams


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    return LLM(str(make_tiny_target(tmp_path_factory.mktemp("outputs") / "chars", tokenizer=True)), device="cpu")


def test_n_completions_per_prompt_in_vllms_layout(llm):
    params = SamplingParams(n=3, seed=5, max_tokens=6, ignore_eos=True, logprobs=1)
    outs = llm.generate(["abc", "de"], params, use_tqdm=False)
    assert len(outs) == 2 and all(len(o.outputs) == 3 for o in outs)
    for out, prompt in zip(outs, ["abc", "de"]):
        assert [c.index for c in out.outputs] == [0, 1, 2] and all(isinstance(c, CompletionOutput) for c in out.outputs)
        first = out.outputs[0]
        assert (first.text, first.token_ids, first.finish_reason) == (out.text, out.token_ids, out.finish_reason)
        assert first.cumulative_logprob == pytest.approx(out.cumulative_logprob)
        for j, completion in enumerate(out.outputs):  # choice j is the request seeded seed + j
            alone = llm.generate([prompt], SamplingParams(seed=5 + j, max_tokens=6, ignore_eos=True, logprobs=1),
                                 use_tqdm=False)[0]
            assert completion.token_ids == alone.token_ids and completion.text == alone.text
            assert completion.cumulative_logprob == pytest.approx(alone.cumulative_logprob)
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # (different seeds, different samples)
    greedy = llm.generate(["abc"], SamplingParams(n=2, temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids


def test_one_completion_is_outputs_zero(llm):
    out = llm.generate("abc", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert len(out.outputs) == 1 and out.outputs[0].text == out.text and out.outputs[0].metrics is out.metrics


@pytest.mark.parametrize("fields, says", [({"n": 0}, "n must be at least 1"), ({"n": True}, "n must be an integer"),
                                          ({"n": 2, "seed": (1 << 64) - 1}, "with n = 2, seed must be at most")])
def test_bad_n_is_refused(fields, says):
    with pytest.raises(ValueError, match=says):
        SamplingParams(**fields)


def test_stream_refuses_several_completions(llm):
    with pytest.raises(ValueError, match="stream yields one completion"):
        llm.stream("abc", SamplingParams(n=2))


def test_vllms_prompt_dicts_give_what_text_and_token_ids_give(llm):
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    ids = llm.get_tokenizer().encode("abc")
    want = llm.generate(["abc"], greedy, use_tqdm=False)[0]
    for prompt in ({"prompt": "abc"}, {"prompt_token_ids": ids}, {"prompt_token_ids": ids, "prompt": "abc"}):
        got = llm.generate([prompt, "de"], greedy, use_tqdm=False)[0]
        assert got.token_ids == want.token_ids and got.prompt_token_ids == ids and got.finished
    assert llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0].prompt is None
    assert "".join(c.text for c in llm.stream({"prompt": "abc"}, greedy)) == want.text
    for bad, says in (({"prompt": "abc", "multi_modal_data": {}}, r"fields \['multi_modal_data'\]"),
                      ({}, "needs 'prompt'"), ({"prompt": 3}, "must be a string"),
                      ({"prompt_token_ids": "abc"}, "sequence of integer token ids")):
        with pytest.raises(ValueError, match=says):
            llm.generate([bad], greedy, use_tqdm=False)
