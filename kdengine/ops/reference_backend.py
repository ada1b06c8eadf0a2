"""Backend adapter for the torch reference (kdengine.ops.reference): runs on any device."""

from __future__ import annotations

import torch

from kdengine.ops.reference import verify_attention_reference as run  # noqa: F401


def available(device: torch.device) -> str | None:
    return None
