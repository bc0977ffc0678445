"""A model's own sampling defaults, from its generation_config.json, as vLLM takes them.

Checkpoints say how they should be sampled (Qwen3: temperature 0.6, top_p 0.95, top_k 20; Qwen2.5:
repetition_penalty 1.05 too), and users of vLLM get those defaults wherever a request leaves a field out
(vLLM's `--generation-config auto`, its default). `LLM(generation_config=...)` reads them the same way:
"auto" (default) the model directory's file; "vllm" none (the API's own defaults: temperature 1.0, top_p 1,
...); a path, that directory's generation_config.json or that file. Only the fields vLLM takes are read:
temperature, top_p, top_k, min_p, repetition_penalty, and max_new_tokens as max_tokens; `do_sample` is
ignored, as vLLM ignores it. A value SamplingParams refuses is a ConfigError naming the file.
"""

from __future__ import annotations

from pathlib import Path

from treeflash.config import ConfigError, read_json_object
from treeflash.sampling import SamplingParams

FILE = "generation_config.json"
# generation_config.json key -> SamplingParams field
FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
          "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def sampling_defaults(source: str | Path | None, model_dir: Path | None) -> dict:
    """The SamplingParams fields the model sets by default ({} where it sets none, or source is "vllm" /
    None). model_dir: the target's directory ("auto" reads its file; None: no directory, no defaults)."""
    if source is None or source == "vllm":
        return {}
    if source == "auto":
        if model_dir is None or not (model_dir / FILE).is_file():
            return {}
        path = model_dir / FILE
    else:
        path = Path(source)
        path = path / FILE if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"generation_config: {source} is neither 'auto', 'vllm', a directory holding "
                              f"{FILE} nor such a file")
    config = read_json_object(path)
    defaults = {field: config[key] for key, field in FIELDS.items() if config.get(key) is not None}
    try:
        SamplingParams(**defaults)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    return defaults


def describe(defaults: dict) -> str:
    """'temperature=0.6, top_p=0.95' (for the log line that says the model's defaults are in force)."""
    return ", ".join(f"{k}={v}" for k, v in defaults.items())
