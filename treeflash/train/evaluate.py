"""Held-out acceptance length, measured the way inference gets it: through `LLM` and its engine.

One `LLM` per method (the DFlash chain, DDTree at one budget) is built once around a drafter
directory; each evaluation copies the weights being trained into its drafter and generates for
held-out prompts. The acceptance length is tokens per round pooled over all rounds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from treeflash.models.dflash import DFlashDrafter
from treeflash.sampling import SamplingParams


class AcceptanceProbe:
    def __init__(self, model, drafter_dir: str | Path, prompt_ids: list[list[int]], *, device, dtype,
                 budget: int, max_new_tokens: int, max_num_seqs: int):
        from treeflash.llm import LLM

        if not prompt_ids:
            raise ValueError("evaluation needs at least one held-out prompt")
        self.prompt_ids, self.max_new_tokens, self.budget = prompt_ids, max_new_tokens, budget
        # Every prompt is admitted in the first steps and all run to the end together: one graph size, and
        # prompts prefilled in a few batched forwards rather than one chunk per step.
        # No prompt lookup (on by default on CUDA): this measures the drafter, not what copying adds to it.
        common = dict(device=device, dtype=dtype, draft_model=str(drafter_dir), max_num_seqs=max_num_seqs,
                      cuda_graph_sizes=[max_num_seqs], prefill_tokens_per_step=32768, ngram_tokens=0)
        self.llms = {"dflash": LLM(model, spec="dflash", **common),
                     "ddtree": LLM(model, spec="ddtree", tree_budget=budget, **common)}

    @torch.no_grad()
    def measure(self, drafter: DFlashDrafter, temperatures: tuple[float, ...] = (0.0,)) -> dict[str, float]:
        """{"dflash@T0": tau, "ddtree@T0": tau, ...} for the drafter's current weights."""
        weights = drafter.state_dict()
        results = {}
        for method, llm in self.llms.items():
            llm.drafter.load_state_dict(weights)
            for t in temperatures:
                params = [SamplingParams(temperature=t, max_tokens=self.max_new_tokens, seed=i)
                          for i in range(len(self.prompt_ids))]
                outs = llm.generate(prompt_token_ids=self.prompt_ids, sampling_params=params, use_tqdm=False)
                lengths = [a for o in outs for a in o.metrics.acceptance_lengths]
                results[f"{method}@T{t:g}"] = sum(lengths) / max(1, len(lengths))
        return results
