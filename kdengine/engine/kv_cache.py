"""Paged latent KV cache: one bf16 pool per layer, a page table and committed lengths on the device,
and host-side page ownership. Pages come from a free list kept sorted (Tier 0 defrag: new pages come
out contiguous); relocate() moves a live sequence into one contiguous run of pages and rewrites its
page table between steps (Tier 1 defrag). Every page is free or owned by exactly one sequence.

    pool        [L, P, page_size, 576] bf16   latent rows (512 latent + 64 rope)
    page_table  [B, max_pages] int32 (device) page ids in token order; unused entries 0
    lengths     [B] int32 (device)            committed tokens per sequence (verify's prefix_len)
"""

from __future__ import annotations

import bisect

import torch

D_QK = 576


class PagedKVCache:
    def __init__(self, n_layers: int, num_pages: int, page_size: int, batch: int, max_pages: int, device):
        self.page_size, self.max_pages = page_size, max_pages
        self.pool = torch.zeros(n_layers, num_pages, page_size, D_QK, dtype=torch.bfloat16, device=device)
        self.page_table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.free: list[int] = list(range(num_pages))  # sorted ascending (Tier 0)
        self.pages: list[list[int]] = [[] for _ in range(batch)]  # host copy of each sequence's pages

    # ------------------------------------------------------------------ allocation

    def alloc(self, b: int, n: int) -> list[int]:
        """Append n pages (the lowest free ids, so they come out contiguous) to sequence b."""
        if n > len(self.free):
            raise RuntimeError(f"KV pool exhausted: need {n} pages, {len(self.free)} free")
        if len(self.pages[b]) + n > self.max_pages:
            raise ValueError(f"n: sequence {b} would hold {len(self.pages[b]) + n} pages, max_pages={self.max_pages}")
        new, self.free = self.free[:n], self.free[n:]
        start = len(self.pages[b])
        self.pages[b].extend(new)
        self.set_pages(b, start, new)
        return new

    def set_pages(self, b: int, start: int, ids: list[int]) -> None:
        """page_table[b, start:start+len(ids)] = ids; pinned non-blocking copy on CUDA (no host sync)."""
        t = torch.tensor(ids, dtype=torch.int32)
        if self.page_table.is_cuda:
            t = t.pin_memory().to(self.page_table.device, non_blocking=True)
        self.page_table[b, start : start + len(ids)] = t

    def ensure_capacity(self, b: int, n_tokens: int) -> None:
        """Make sequence b hold at least n_tokens slots."""
        need = -(-n_tokens // self.page_size) - len(self.pages[b])
        if need > 0:
            self.alloc(b, need)

    def release(self, ids: list[int]) -> None:
        for p in ids:
            bisect.insort(self.free, p)

    def free_tail(self, b: int, keep_tokens: int) -> None:
        """Give back the pages of sequence b beyond its first keep_tokens slots."""
        keep = -(-keep_tokens // self.page_size)
        tail, self.pages[b] = self.pages[b][keep:], self.pages[b][:keep]
        self.page_table[b, keep:] = 0
        self.release(tail)

    def free_sequence(self, b: int) -> None:
        self.free_tail(b, 0)
        self.lengths[b] = 0

    # ------------------------------------------------------------------ writes

    def write(self, layer: int, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """rows [B, T, 576] bf16 into slots [B, T] (token positions) of each sequence; no host sync."""
        page = self.page_table.gather(1, (slots // self.page_size).to(torch.int64)).long()  # [B, T]
        self.pool[layer, page, slots % self.page_size] = rows

    def fill_random(self, b: int, n_tokens: int, generator: torch.Generator | None = None) -> None:
        """Synthetic context: random latent rows for tokens 0..n_tokens-1 of sequence b (no forward)."""
        self.ensure_capacity(b, n_tokens)
        ids = torch.tensor(self.pages[b][: -(-n_tokens // self.page_size)], device=self.pool.device)
        for layer in range(self.pool.shape[0]):
            shape = (len(ids), self.page_size, D_QK)
            self.pool[layer, ids] = torch.randn(shape, generator=generator, device=self.pool.device).to(torch.bfloat16)
        self.lengths[b] = n_tokens

    def compact(self, path: torch.Tensor, count: torch.Tensor) -> None:
        """Commit: copy each sequence's accepted tree rows (tree slots lengths+path[:, j]) to
        lengths+j, then advance lengths by count. path [B, T] (padded past count), count [B]."""
        B, T = path.shape
        src = self.lengths[:, None].long() + path.long()
        dst = self.lengths[:, None].long() + torch.arange(T, device=path.device)
        ps = self.page_size
        src_page = self.page_table.gather(1, src // ps).long()
        keep = torch.arange(T, device=path.device)[None, :] < count[:, None]
        dst = torch.where(keep, dst, src)  # rows past count copy onto themselves
        dst_page = self.page_table.gather(1, dst // ps).long()
        rows = self.pool[:, src_page, src % ps]  # [L, B, T, 576] (a copy)
        self.pool[:, dst_page, dst % ps] = rows
        self.lengths += count.to(torch.int32)

    # ------------------------------------------------------------------ Tier 1 defrag

    def find_run(self, b: int) -> int | None:
        """Lowest start of a run of len(pages[b]) consecutive page ids that are free or b's own."""
        n = len(self.pages[b])
        usable = sorted(set(self.free) | set(self.pages[b]))
        run_start, run_len = None, 0
        for i, p in enumerate(usable):
            if i and p == usable[i - 1] + 1:
                run_len += 1
            else:
                run_start, run_len = p, 1
            if run_len == n:
                return run_start
        return None

    def relocate(self, b: int) -> bool:
        """Move sequence b into one contiguous run of pages (same token order) and rewrite its page
        table. Returns False (nothing moved) when no such run exists. Call between steps."""
        old = self.pages[b]
        if not old:
            return True
        start = self.find_run(b)
        if start is None:
            return False
        new = list(range(start, start + len(old)))
        if new == old:
            return True
        dev = self.pool.device
        data = self.pool[:, torch.tensor(old, device=dev)]  # [L, n, page_size, 576] (a copy)
        self.pool[:, torch.tensor(new, device=dev)] = data
        owned = set(new)
        self.free = sorted((set(self.free) | set(old)) - owned)
        self.pages[b] = new
        self.set_pages(b, 0, new)
        return True

    def is_contiguous(self, b: int) -> bool:
        p = self.pages[b]
        return all(q == p[0] + i for i, q in enumerate(p))

    def check_ownership(self) -> None:
        """Raise AssertionError on a leaked or doubly owned page, or a stale page table row."""
        owned = [p for seq in self.pages for p in seq]
        everything = owned + self.free
        assert len(everything) == len(set(everything)), "a page is owned twice (or free and owned)"
        assert sorted(everything) == list(range(self.pool.shape[1])), "a page leaked"
        assert self.free == sorted(self.free), "free list not sorted"
        for b, seq in enumerate(self.pages):
            assert self.page_table[b, : len(seq)].tolist() == seq, f"page table of sequence {b} is stale"
