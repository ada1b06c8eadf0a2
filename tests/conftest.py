"""Shared test configuration: GPU/nvcc markers skip cleanly where the hardware or toolchain is absent."""

from __future__ import annotations

import shutil

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    has_nvcc = shutil.which("nvcc") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(skip_nvcc)
