"""The key/value cache of the local engine's running batch.

Owns per-layer K/V buffers ``[rows, kv_heads, cols, head_dim]`` for the sequences in flight (row i is
the i-th sequence), laid out *right-aligned*: every row's newest token sits in the same column, so one
decode step writes one column for all rows and hands the model a ``[start, end)`` window of the
buffers. Columns a row does not use are padding, recorded in ``valid`` and masked out. Rows join
(copied in from a prefill, into the padding on the left) and leave (the last row moves into the
hole) without touching the other rows, so continuous batching costs O(rows that change) per step,
not O(batch). Also builds the additive attention masks the model is given.

Does not run the model or sample (see :mod:`agentrl.engine.local.engine`), and does not page memory: the
attended window is as wide as the longest row in flight, and shorter rows pay for its padding.
Buffers grow by doubling while the batch is busy and are freed when it empties.
"""

from __future__ import annotations

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``allowed`` -> float mask (0 where allowed, dtype-min elsewhere). A float mask, not a
    bool one, because HF's eager attention *adds* the mask while SDPA accepts either."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


class KVBatch:
    """Right-aligned K/V for up to ``max_rows`` sequences. Also the HF cache object of a decode step:
    the model calls :meth:`update` once per layer between :meth:`begin_step` and :meth:`end_step`."""

    def __init__(self, *, max_rows: int, max_cols: int) -> None:
        self.max_rows = max_rows
        self.max_cols = max_cols  # no row is ever longer than this (the engine's max_context)
        self.n = 0  # rows in use
        self.start = 0  # first column any row uses
        self.end = 0  # one past the newest column (shared by all rows)
        self.first: list[int] = []  # first column of each row
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.valid = torch.zeros(0, 0, dtype=torch.bool)

    @property
    def width(self) -> int:
        return self.end - self.start

    def _relayout(self, rows: int, cols: int, new_end: int) -> None:
        """Copy the window of the rows in use into fresh zeroed buffers so that it ends at
        ``new_end``. Zeros, not empty memory: garbage NaN at masked columns would poison attention."""
        w = self.width
        s, e, ns = self.start, self.end, new_end - w
        for bufs in (self.k, self.v):
            for i, old in enumerate(bufs):
                new = old.new_zeros(rows, old.shape[1], cols, old.shape[3])
                new[: self.n, :, ns:new_end] = old[: self.n, :, s:e]
                bufs[i] = new
        valid = torch.zeros(rows, cols, dtype=torch.bool)
        valid[: self.n, ns:new_end] = self.valid[: self.n, s:e]
        self.valid = valid
        self.first = [f - s + ns for f in self.first]
        self.start, self.end = ns, new_end

    def _make_room(self, rows: int, left: int) -> None:
        """Ensure room for ``rows`` rows, ``left`` columns before ``end`` and one column at ``end``.
        Re-lays out only when short: dropping unused columns on the left first, doubling the
        capacity when that is not enough, so a long decode re-lays out O(log L) times."""
        cap_rows, cap_cols = self.valid.shape
        if rows <= cap_rows and left <= self.end < cap_cols:
            return
        new_end = max(self.width, left)
        new_rows = max(cap_rows, min(self.max_rows, max(rows, 2 * cap_rows)))
        new_cols = max(cap_cols, min(self.max_cols + 1, 2 * (new_end + 1)), new_end + 1)
        self._relayout(new_rows, new_cols, new_end)

    def add_rows(self, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor], valid: torch.Tensor) -> range:
        """Append rows from a left-padded prefill (``keys[layer]`` [k, H, P, D], ``valid`` [k, P])
        so that their last column is ``end - 1``; returns their row indices."""
        k, p = valid.shape
        if not self.k:  # first use: shapes and dtype come from the model's own K/V
            self.k = [keys[i].new_zeros(0, keys[i].shape[1], 0, keys[i].shape[3]) for i in sorted(keys)]
            self.v = [values[i].new_zeros(0, values[i].shape[1], 0, values[i].shape[3]) for i in sorted(values)]
        if self.n == 0:  # empty batch: put the window wherever the new rows fit
            self.first = []
            self.start = self.end = p if p < self.valid.shape[1] else 0
        self._make_room(self.n + k, p)
        rows = range(self.n, self.n + k)
        lo, hi = self.end - p, self.end
        for i, (kb, vb) in enumerate(zip(self.k, self.v)):
            kb[rows.start : rows.stop, :, lo:hi] = keys[i]
            vb[rows.start : rows.stop, :, lo:hi] = values[i]
        self.valid[rows.start : rows.stop] = False  # rows reused from finished sequences hold stale flags
        self.valid[rows.start : rows.stop, lo:hi] = valid
        self.first += [lo + int(torch.argmax(valid[j].to(torch.int8))) for j in range(k)]
        self.n += k
        self.start = min(self.first)
        return rows

    def remove_rows(self, rows: set[int]) -> list[tuple[int, int]]:
        """Drop ``rows``; the last surviving rows move into the holes. Returns the (src, dst) moves
        the caller must mirror in its own per-row state."""
        keep = self.n - len(rows)
        holes = [r for r in sorted(rows) if r < keep]
        movers = [r for r in range(keep, self.n) if r not in rows]
        s, e = self.start, self.end
        for src, dst in zip(movers, holes):
            for buf in (*self.k, *self.v):
                buf[dst, :, s:e] = buf[src, :, s:e]
            self.valid[dst] = self.valid[src]
            self.first[dst] = self.first[src]
        self.n = keep
        del self.first[keep:]
        if keep == 0:  # hold memory only while sequences are in flight
            self.k, self.v, self.valid = [], [], torch.zeros(0, 0, dtype=torch.bool)
            self.start = self.end = 0
        else:  # the window shrinks to the longest row still in flight
            self.start = min(self.first)
        return list(zip(movers, holes))

    def row_kv(self, row: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Copies of ``row``'s K/V over its tokens (columns ``[first, end)``): per layer
        [kv_heads, tokens, head_dim]. Copies, so they outlive the buffers and do not pin them."""
        f, e = self.first[row], self.end
        return tuple(k[row, :, f:e].clone() for k in self.k), tuple(v[row, :, f:e].clone() for v in self.v)

    # --- one decode step -------------------------------------------------------------------
    def begin_step(self) -> torch.Tensor:
        """Reserve the next column for every row; returns ``valid`` over the window it will have."""
        self._make_room(self.n, 0)
        self.valid[: self.n, self.end] = True
        return self.valid[: self.n, self.start : self.end + 1]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """HF cache protocol: store this step's K/V [n, H, 1, D]; return the whole window."""
        e = self.end
        kb, vb = self.k[layer_idx], self.v[layer_idx]
        kb[: self.n, :, e : e + 1] = key_states
        vb[: self.n, :, e : e + 1] = value_states
        return kb[: self.n, :, self.start : e + 1], vb[: self.n, :, self.start : e + 1]

    def end_step(self) -> None:
        self.end += 1
