"""Preallocated key/value cache: one row per token, one slot per running sequence.

Rows are written at explicit indices, so the verify forward can append a whole draft tree after a
slot's committed rows, and `compact` keeps the accepted path and drops the rest in place. Every
operation is a fixed-shape gather/scatter driven by device tensors: no host synchronisation.

`PrefixKV` is the cache-free counterpart for training: the new tokens attend over given prefix K/V
(or only over themselves) and nothing is stored, so gradients flow through every key and value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t, or for a 16-bit float tensor on the CPU the same memory as int16: rows move the same either way, and
    PyTorch's CPU scatter of bfloat16 / float16 copied the whole destination at every call (~0.1 ms a layer's
    write into a 2,048-row cache, 19 ms a compaction of a 30-layer stack, against 7 and 36 us as int16:
    benchmarks/cpu-bf16-prepack). On CUDA, as it is."""
    if t.device.type == "cpu" and t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    return t


def _resized(t: torch.Tensor, capacity: int) -> torch.Tensor:
    """t [..., rows, head_dim] in a zeroed tensor of `capacity` rows (its first `capacity` rows, if fewer)."""
    new = t.new_zeros(*t.shape[:-2], capacity, t.shape[-1])
    kept = min(capacity, t.shape[-2])
    new[..., :kept, :] = t[..., :kept, :]
    return new


@dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer: [slots, kv_heads, capacity, head_dim]
    values: list[torch.Tensor]
    # keys and values of every layer as one tensor each, [layers, slots, kv_heads, capacity, head_dim],
    # whose views the per-layer lists are (`allocate`): `compact` then moves every layer's rows in one
    # gather and one scatter instead of two kernels per layer. None: per-layer tensors only.
    stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def allocate(num_layers: int, slots: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> "KVCache":
        shape = (num_layers, slots, kv_heads, capacity, head_dim)
        return KVCache._of(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @staticmethod
    def _of(keys: torch.Tensor, values: torch.Tensor) -> "KVCache":
        return KVCache(list(keys.unbind(0)), list(values.unbind(0)), (keys, values))

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's keys and values."""
        return sum(t.numel() * t.element_size() for t in (self.stacked or (*self.keys, *self.values)))

    def resize_(self, capacity: int) -> None:
        """`capacity` rows per slot, in place: the rows written so far come along (the first `capacity` of them
        when it shrinks). Keys first: the old keys are freed before the new values are made, so a doubling holds
        2.5x the old caches at its peak instead of 3x (no one else may hold these tensors)."""
        if self.stacked is None:
            self.keys = [_resized(k, capacity) for k in self.keys]
            self.values = [_resized(v, capacity) for v in self.values]
            return
        keys, values = self.stacked
        self.keys, self.values, self.stacked = [], [], None  # (drops the old per-layer views)
        keys = _resized(keys, capacity)
        values = _resized(values, capacity)
        self.keys, self.values, self.stacked = list(keys.unbind(0)), list(values.unbind(0)), (keys, values)

    def slots(self, start: int, stop: int) -> "KVCache":
        """A view of slots [start, stop) that writes through to this cache."""
        if self.stacked is not None:
            return KVCache._of(*(t[:, start:stop] for t in self.stacked))
        return KVCache([k[start:stop] for k in self.keys], [v[start:stop] for v in self.values])

    def slot(self, index: int) -> "KVCache":
        """A one-slot view that writes through to this cache (for prefilling one request)."""
        return self.slots(index, index + 1)

    def copy_rows(self, src: int, dst: int, rows: int) -> None:
        """Slot `dst`'s first `rows` rows become slot `src`'s, in every layer (a prompt prefix reused)."""
        pick = (lambda t, i: t[:, i]) if self.stacked is not None else (lambda t, i: t[i])  # (layers first)
        for t in self.stacked or (*self.keys, *self.values):
            pick(t, dst)[..., :rows, :] = pick(t, src)[..., :rows, :]

    def select(self, slots: torch.Tensor, real: tuple[torch.Tensor, torch.Tensor] | None = None) -> "SlotSelection":
        """Slots `slots` [B] of this cache as one batch (for prefilling several requests at once)."""
        return SlotSelection(self, slots, real)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
        # k, v: [B, Hkv, T, D]; rows: [B, T] cache row of each new token.
        keys, values = self.keys[layer], self.values[layer]
        if keys.is_cuda:
            from treeflash import kv_store  # (Triton: CUDA only, imported when first needed)

            if kv_store.fits(k, v, keys, values):
                kv_store.store_rows(keys, values, k, v, rows)  # one launch for both
                return
        index = rows[:, None, :, None].expand_as(k)
        _bits(keys).scatter_(2, index, _bits(k))
        _bits(values).scatter_(2, index, _bits(v))

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
               kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' K/V at `rows`; return the first kv_len rows, which they attend over."""
        self.write(layer, k, v, rows)
        return self.keys[layer][:, :, :kv_len], self.values[layer][:, :, :kv_len]

    def compact(self, start: torch.Tensor, keep: torch.Tensor) -> None:
        """Move rows start+keep[:, j] to start+j, for every slot and layer.

        start: [B] first appended row; keep: [B, K] offsets of the rows to keep, ascending. Entries of
        `keep` past a slot's accepted count may be anything in range: they land beyond the slot's new
        length, where later writes overwrite them.
        """
        src = (start[:, None] + keep)[:, None, :, None]
        dst = (start[:, None] + torch.arange(keep.shape[1], device=keep.device))[:, None, :, None]
        if self.stacked is not None:  # every layer at once: the same rows move in each
            src, dst = src[None], dst[None]
        for cache in self.stacked or (*self.keys, *self.values):
            cache = _bits(cache)
            # Gather first: a row may be both read and written by this move.
            rows = cache.gather(-2, src.expand(*cache.shape[:-2], -1, cache.shape[-1]))
            cache.scatter_(-2, dst.expand_as(rows), rows)


@dataclass
class SlotSelection:
    """Any slots of a KVCache, in any order, as a batch: batch row b is slot `slots[b]`.

    Writes scatter into the chosen slots; `extend` returns those slots' first kv_len rows, gathered
    (a copy: the slots need not be contiguous). real: (batch index, token index) [N] each, of the new
    tokens to store; a batch of pieces padded to one length stores only its real tokens, so a padded
    token never lands in a row a slot uses, nor past the cache's end.
    """

    cache: KVCache
    slots: torch.Tensor  # [B] long
    real: tuple[torch.Tensor, torch.Tensor] | None = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
        # k, v: [B, Hkv, T, D]; rows: [B, T] cache row of each new token.
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        if self.real is None:
            slot = self.slots[:, None].expand_as(rows)
            # Two advanced indices around a slice put their dims first: [B, T, Hkv, D].
            keys[slot, :, rows] = k.transpose(1, 2)
            values[slot, :, rows] = v.transpose(1, 2)
            return
        b, t = self.real
        keys[self.slots[b], :, rows[b, t]] = k[b, :, t]  # [N, Hkv, D] on both sides
        values[self.slots[b], :, rows[b, t]] = v[b, :, t]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
               kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.write(layer, k, v, rows)
        return self.cache.keys[layer][self.slots, :, :kv_len], self.cache.values[layer][self.slots, :, :kv_len]


@dataclass
class PrefixKV:
    """Per-layer prefix keys/values [B, Hkv, P, D] (None: no prefix) that new tokens see before their own.

    Keys seen by new tokens are [prefix, new]: a mask [B, T, P + T] indexes that concatenation.
    """

    keys: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            k, v = torch.cat([self.keys[layer], k], 2), torch.cat([self.values[layer], v], 2)
        if k.shape[2] != kv_len:
            raise ValueError(f"mask covers {kv_len} keys, prefix + new tokens are {k.shape[2]}")
        return k, v


def append_layout(seq_lens: torch.Tensor, new_mask: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where T new tokens go in the cache and what each of them may attend to.

    seq_lens: [B] committed rows per slot; new_mask: [B, T, T] visibility among the new tokens
    (causal for a prompt, ancestor-or-self for a draft tree, all-true for a draft block).
    Returns rows [B, T] (new token t goes to row seq_lens+t) and mask [B, T, kv_len]: every new token
    sees all committed rows of its slot plus the new rows `new_mask` allows.
    """
    batch, t = new_mask.shape[:2]
    device = new_mask.device
    rows = seq_lens[:, None] + torch.arange(t, device=device)
    rel = torch.arange(kv_len, device=device)[None, :] - seq_lens[:, None]  # [B, L]
    committed = rel < 0
    is_new = (rel >= 0) & (rel < t)
    new_visible = new_mask.gather(2, rel.clamp(0, t - 1)[:, None, :].expand(batch, t, kv_len))
    return rows, committed[:, None, :] | (is_new[:, None, :] & new_visible)
