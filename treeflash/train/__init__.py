"""Training DFlash drafters (`treeflash train-drafter`).

prompts.py (training prompts, held-out split) -> data.py (the target's own responses, cached) ->
loss.py (the block objective, many blocks per sequence in one pass) -> loop.py (optimiser, schedule,
resumable checkpoints) -> evaluate.py (held-out acceptance through `LLM`) -> plots.py; pipeline.py
runs them in order. The model code is `treeflash.models.dflash`, the module inference runs.
"""
