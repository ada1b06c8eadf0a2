"""An independent float64 dense attention over the gathered sequence, written apart from the
package's reference so the two check each other."""

from __future__ import annotations

import torch


def dense_verify_f64(q, kv_cache, page_table, prefix_len, tree_mask, sm_scale):
    """out [B, T, H, 512] float64 and lse [B, T, H] float64, by the plainest loops."""
    B, T, H, _ = q.shape
    page_size = kv_cache.shape[1]
    outs, lses = [], []
    for b in range(B):
        n = int(prefix_len[b]) + T
        rows = []
        for pos in range(0, n, page_size):
            page = int(page_table[b, pos // page_size])
            rows.append(kv_cache[page, : min(page_size, n - pos)])
        kv = torch.cat(rows).double()  # [n, 576]
        allowed = torch.ones(T, n, dtype=torch.bool)
        allowed[:, n - T :] = tree_mask[b].cpu()
        s = torch.einsum("thd,nd->htn", q[b].double().cpu(), kv.cpu()) * sm_scale  # [H, T, n]
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None])
        outs.append(torch.einsum("htn,nd->thd", p, kv.cpu()[:, :512]))
        lses.append(lse.transpose(0, 1))
    return torch.stack(outs), torch.stack(lses)
