"""Small host values onto the device without a hidden synchronisation.

`torch.tensor(values, device="cuda")` copies from pageable memory, and CUDA makes such a copy wait for
all the work already queued on the stream: admitting a request, the host stood idle through the whole
prefill forward at its first such copy, and then the device stood idle while the host issued the first
token's draw (benchmarks/admission; the draw has since moved into the prefill graph). With overlapped
rounds a pageable copy also waits for the round in flight. Through pinned memory the copy is queued like a
kernel; PyTorch's pinned-memory cache keeps the buffer until the copy has run.
"""

from __future__ import annotations

import torch


def to_device(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` (or a CPU tensor as it is) on `device`, queued without waiting on
    CUDA."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
