"""top-p's nucleus without a sort, the two Triton kernels of benchmarks/h200-top-p-nucleus/ (an experiment, not
in the package: the first measured slower than the sort on the H200, the second not timed yet), run by Triton's
interpreter on CPU tensors: the tokens the sort keeps (`sampling._top_p_sorted`: ties ranked by the larger id first),
with ties, zeros and rows that keep everything."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash import sampling

pytestmark = [pytest.mark.usefixtures("mend"), pytest.mark.slow]
FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "h200-top-p-nucleus"


def kernel(name: str):
    spec = importlib.util.spec_from_file_location(f"nucleus_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.top_p_nucleus


KERNELS = {"nucleus_v1": kernel("nucleus_v1"), "nucleus": kernel("nucleus")}
top_p_nucleus = KERNELS["nucleus"]


def check(probs: torch.Tensor, top_p: list[float], **launch) -> None:
    tp = torch.tensor(top_p, dtype=torch.float64)
    want = sampling._top_p_sorted(probs, tp)  # the sort's nucleus
    got = top_p_nucleus(probs, tp, **launch)
    assert torch.equal(got > 0, want), [torch.nonzero(r).flatten().tolist() for r in (got > 0) ^ want]
    assert torch.equal(got, torch.where(want, probs, 0.0))  # the kept probabilities as they were


@pytest.mark.parametrize("vocab", [7, 256, 1000, 3 * 256 + 5])
def test_the_kernel_keeps_the_sorts_nucleus(vocab):
    gen = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(torch.randn(6, vocab, generator=gen) * 3, -1)
    check(probs, [0.05, 0.3, 0.5, 0.9, 0.999, 1.0])


def test_the_first_kernel_as_measured_keeps_the_sorts_nucleus_too():
    gen = torch.Generator().manual_seed(5)
    levels = torch.tensor([0.0, 1.0, 2.0])[torch.randint(0, 3, (2, 600), generator=gen)]
    probs = torch.cat([torch.softmax(torch.randn(3, 600, generator=gen) * 3, -1), levels / levels.sum(-1, keepdim=True)])
    tp = torch.tensor([0.2, 0.9, 1.0, 0.5, 0.8], dtype=torch.float64)
    want = sampling._top_p_sorted(probs, tp)
    assert torch.equal(KERNELS["nucleus_v1"](probs, tp), torch.where(want, probs, 0.0))


@pytest.mark.parametrize("ways,block", [(2, 256), (16, 128), (8, 64)])
def test_every_search_width_finds_the_same_nucleus(ways, block):
    gen = torch.Generator().manual_seed(ways)
    probs = torch.softmax(torch.randn(4, 1500, generator=gen) * 3, -1)
    levels = torch.tensor([0.0, 1.0, 3.0])[torch.randint(0, 3, (2, 1500), generator=gen)]
    check(torch.cat([probs, levels / levels.sum(-1, keepdim=True)]), [0.1, 0.5, 0.9, 0.97, 0.3, 0.8],
          ways=ways, block=block)


def test_ties_go_to_the_larger_ids_as_in_the_sort():
    # Probabilities from a few values: long runs of equal ones around every boundary.
    gen = torch.Generator().manual_seed(3)
    levels = torch.tensor([0.0, 1.0, 2.0, 4.0])
    raw = levels[torch.randint(0, 4, (8, 700), generator=gen)]
    probs = raw / raw.sum(-1, keepdim=True)
    check(probs, [0.1, 0.25, 0.5, 0.6, 0.75, 0.9, 0.95, 0.99])
    quarters = torch.full((4, 4), 0.25)  # exactly reaching top_p: one, two, three tokens
    check(quarters, [0.25, 0.5, 0.75, 0.3])
    check(torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.1, 0.2, 0.2, 0.2]]), [0.5, 0.5])  # test_filters' cases


def test_rows_keep_at_least_the_most_probable_token():
    probs = torch.zeros(3, 300)
    probs[0, 17] = 1.0  # one token holds everything
    probs[1, [5, 250]] = torch.tensor([0.5, 0.5])
    probs[2, 299] = 1e-30  # a tiny total
    check(probs, [0.01, 0.01, 0.5])
