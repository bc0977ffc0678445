"""The server's engine loop in-process: a failing step fails only the requests in flight, an abort frees
the slot, and stopping ends the requests still running with ShuttingDown."""

from __future__ import annotations

import asyncio

import pytest

from helpers import make_tiny_target
from treeflash import LLM, SamplingParams
from treeflash.server.engine_loop import EngineLoop, ShuttingDown
from treeflash.server.metrics import ServerMetrics

PROMPT = [[5, 6, 7]]


@pytest.fixture(params=[None, True], ids=["default", "overlap"])
def llm(tmp_path, request):
    # overlap=True: rounds launched before the last is read back (the default on CUDA graphs), forced here
    return LLM(str(make_tiny_target(tmp_path / "chars", tokenizer=True, max_position_embeddings=2048)),
               device="cpu", max_num_seqs=2, overlap=request.param)


def greedy(n: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)]


async def text_of(group) -> str:
    return "".join([event.text async for event in group.events()])


def test_a_failing_step_fails_the_requests_in_flight_and_the_loop_serves_on(llm, monkeypatch):
    want = llm.generate(prompt_token_ids=PROMPT, sampling_params=greedy(12))[0].text
    step, calls = llm.engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return step()

    monkeypatch.setattr(llm.engine, "step", failing_step)
    loop = EngineLoop(llm.engine, ServerMetrics(2))

    async def run():
        loop.start()
        try:
            with pytest.raises(RuntimeError, match="boom"):
                await text_of(loop.submit(llm.new_requests(PROMPT, greedy(500))))
            return await text_of(loop.submit(llm.new_requests(PROMPT, greedy(12))))
        finally:
            await asyncio.to_thread(loop.stop)

    assert asyncio.run(asyncio.wait_for(run(), 120)) == want  # a dead loop would hang: fail instead
    assert not llm.engine.has_work() and not loop.alive


def test_abort_frees_the_slot_and_stop_ends_what_is_left(llm):
    metrics = ServerMetrics(2)
    loop = EngineLoop(llm.engine, metrics)

    async def run():
        loop.start()
        leaving = loop.submit(llm.new_requests(PROMPT, greedy(1500)))
        await anext(leaving.events())
        loop.abort(leaving)
        sample = metrics.registry.get_sample_value
        while sample("treeflash_requests_running") or sample("treeflash_requests_finished_total",
                                                            {"finish_reason": "abort"}) < 1:
            await asyncio.sleep(0.01)
        staying = loop.submit(llm.new_requests(PROMPT, greedy(1500)))
        await anext(staying.events())
        await asyncio.to_thread(loop.stop)
        with pytest.raises(ShuttingDown):
            await text_of(staying)
        with pytest.raises(ShuttingDown):
            loop.submit(llm.new_requests(PROMPT, greedy(3)))

    asyncio.run(asyncio.wait_for(run(), 120))
    assert not llm.engine.has_work()
