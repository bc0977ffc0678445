"""Tensor parallelism across processes: rank 0 is the caller's `LLM`, ranks 1..N-1 are workers it starts.

SPMD. Every rank holds its shard of the target (`models/parallel.py`), a whole copy of the drafter and an
identical `Engine`. Rank 0's engine (`MirroredEngine`) sends every call that changes engine state (add,
abort, step) to the workers through a pipe, in order, and each worker applies it to its own engine.
`TensorParallel.engine` sends a build the same way; a later one replaces every rank's engine (the
benchmark builds one per configuration on the same shards). The target comes from a source object
every rank builds from: a checkpoint (`CheckpointTarget`, each rank reading only its slices) or random
weights at a shape (`bench/synthetic.py: SyntheticTarget`). All
ranks therefore run the same round on the same inputs; the all-reduces inside the target give every rank
the same logits, so derive, walk and commit decide the same everywhere and the engines stay in lockstep
with no communication beyond the all-reduces. Greedy and seeded sampling are deterministic by design
(counter-based uniforms), so that holds for sampling too.

Processes: torch.multiprocessing with the spawn method (one process per GPU on CUDA, NCCL between them;
gloo on CPU). Rank 0 hosts the rendezvous store. A worker that dies, or raises, is reported by rank 0
with its error, and the other workers are stopped; a worker whose parent dies exits by itself. `close()`
(called by `LLM.close`, `__del__` and at interpreter exit) stops them all.

NOTE: spawn re-imports the caller's main module in every worker, so a script that builds an LLM with
tensor_parallel_size > 1 must do it under `if __name__ == "__main__":` (as with any spawn-based library).
"""

from treeflash.parallel.group import TensorParallel, TensorParallelError
from treeflash.parallel.mirror import MirroredEngine

__all__ = ["MirroredEngine", "TensorParallel", "TensorParallelError"]
