"""Device choice (cuda -> mps -> cpu) and mixed precision: bf16 autocast on CUDA only, since
bf16 matrix multiplies on CPUs without native support are far slower than fp32."""

from __future__ import annotations

import contextlib

import torch

from .errors import TmtError


def pick_device(name: str = "auto") -> torch.device:
    device = _choose(name)
    if device.type == "cuda":
        # Token-budget batches come in hundreds of (batch, length) shapes, and each decoding
        # step has a new length. PyTorch's cuDNN attention builds a plan for every new shape: on
        # an H200 a base-size training step on shapes it had not seen took 258 ms, against 49 ms
        # with it off (README, "On a GPU"). Off, SDPA runs its memory-efficient kernel, which
        # needs no plans, and was as fast on shapes seen before.
        torch.backends.cuda.enable_cudnn_sdp(False)
    return device


def _choose(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TmtError("train.device is 'cuda' but no CUDA device is available; use auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None)
                              and torch.backends.mps.is_available()):
        raise TmtError("train.device is 'mps' but MPS is not available; use auto or cpu")
    return torch.device(name)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
