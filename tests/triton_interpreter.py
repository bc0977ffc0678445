"""Running the GPU's Triton kernels on CPU tensors in tests: Triton's interpreter, made to work here.

Import this before any module that defines a kernel (it sets TRITON_INTERPRET=1, which Triton reads
when a kernel is defined), and use `mend` as an autouse fixture in the test module.
"""

from __future__ import annotations

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")


def mend_interpreter(setattr=setattr) -> None:
    """Triton 3.6's interpreter turns a loaded scalar into int() of a 1-element array, which NumPy >= 2.4
    refuses (a loop bounded by a loaded value fails); make it take the element instead. `setattr`: a
    monkeypatch's, to undo it after a test (benchmarks/splitkv_ab.py's CPU dry run keeps it)."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # another Triton: nothing to mend
        return

    def patch(tensor, scope):
        original(tensor, scope)
        tensor.__index__ = lambda self: int(self.handle.data.item())

    setattr(interpreter, "_patch_lang_tensor", patch)


@pytest.fixture
def mend(monkeypatch):
    mend_interpreter(monkeypatch.setattr)
