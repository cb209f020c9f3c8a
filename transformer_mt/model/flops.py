"""FLOP accounting for the Transformer, and a probe of the device's matrix-multiply rate, so that
training and the benchmark can report model FLOPs utilisation (MFU), as nanoGPT's `estimate_mfu`.

Model FLOPs (forward; a pair with S real source positions [SOS] src [EOS] and T real target
positions; d = d_model, f = d_ff, L = layers, V = target vocabulary; a matmul of (m×k)·(k×n) is
2mkn FLOPs; padding is not counted, so padding lowers MFU):
    encoder, per layer   S·(8d² + 4df) + 4d·S²          W_q,W_k,W_v,W_o; FFN; QKᵀ and AV (S keys)
    decoder, per layer   T·(8d² + 4df) + 2d·T(T+1)      self-attention (position i sees i+1 keys);
                         + T·4d² + S·4d² + 4d·T·S       cross: W_q,W_o per target, W_k,W_v per source
    projection           2dV·T
Training = 3 × forward (the backward pass computes two matmuls per forward matmul). Dividing by
the real target tokens attributes the encoder's work to the target tokens of its sentence.

The benchmark measures its reference rate instead of taking it from a data sheet: on a shared
CPU the achievable rate moves with the load, so the probe runs in short bursts between the
measured steps and both see the same machine. Training logs MFU against `peak_flops`: the
TMT_PEAK_FLOPS environment variable, else the data-sheet rate of a known GPU, else a short probe.
"""

from __future__ import annotations

import os
import time

import torch

from ..config import ModelConfig
from ..errors import TmtError


def forward_flops(cfg: ModelConfig, tgt_vocab: int, src_len: torch.Tensor,
                  tgt_len: torch.Tensor) -> float:
    """Forward matmul FLOPs for pairs of real lengths `src_len`, `tgt_len` (the formula above)."""
    d, f, layers = cfg.d_model, cfg.d_ff, cfg.layers
    s, t = src_len.double(), tgt_len.double()
    encoder = s * (8 * d * d + 4 * d * f) + 4 * d * s * s
    decoder = (t * (8 * d * d + 4 * d * f) + 2 * d * t * (t + 1)
               + t * 4 * d * d + s * 4 * d * d + 4 * d * t * s)
    projection = 2 * d * tgt_vocab * t
    return float((layers * (encoder + decoder) + projection).sum())


def training_flops(cfg: ModelConfig, tgt_vocab: int, src_len: torch.Tensor,
                   tgt_len: torch.Tensor) -> float:
    """Forward and backward FLOPs of one training step on these pairs."""
    return 3 * forward_flops(cfg, tgt_vocab, src_len, tgt_len)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# Dense bf16 tensor-core FLOP/s from NVIDIA's data sheets (no sparsity); the first name that is
# part of torch.cuda.get_device_name() applies, so longer names come first.
GPU_PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),          # SXM
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)
PROBE_SECONDS = 0.2


def peak_flops(device: torch.device) -> tuple[float, str]:
    """The FLOP/s that MFU divides by, and where the figure comes from. A CPU has no data-sheet
    rate that its fp32 matmuls reach (it depends on the vector units, clock and threads), so
    there, as for an unlisted GPU, it is the matrix-multiply rate measured for 0.2 s at the start:
    the MFU of a CPU run says how close the model comes to the best matmul rate of the machine."""
    override = os.environ.get("TMT_PEAK_FLOPS")
    if override:
        try:
            value = float(override)
        except ValueError:
            value = 0.0
        if not value > 0:
            raise TmtError(f"TMT_PEAK_FLOPS={override!r} is not a positive number of FLOP/s "
                           f"(e.g. 989e12)")
        return value, "TMT_PEAK_FLOPS"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for part, flops in GPU_PEAK_FLOPS:
            if part in name:
                return flops, f"{name}, bf16 data sheet"
    size = 4096 if device.type == "cuda" else 1024     # large enough to reach the device's rate
    probe = MatmulProbe(device, size)
    probe.sample(PROBE_SECONDS)
    return probe.gflops * 1e9, f"{probe.dtype} {size}x{size} matmul measured on {device.type}"


class MatmulProbe:
    """The device's matrix-multiply rate, sampled in bursts: fp32 on CPU, bf16 on CUDA (what
    autocast runs the model's matmuls in there)."""

    def __init__(self, device: torch.device, size: int):
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.device = device
        # Its own generator: probing during training must not move the training's random state.
        generator = torch.Generator(device).manual_seed(0)
        self.a = torch.randn(size, size, device=device, dtype=self.dtype, generator=generator)
        self.b = torch.randn(size, size, device=device, dtype=self.dtype, generator=generator)
        self.flops_per_call = 2 * size ** 3
        self.flops = self.seconds = 0.0
        self.sample(0.0)                 # warm-up, not counted

    def sample(self, seconds: float) -> None:
        """Multiply for at least `seconds` (one call at least) and add it to the rate."""
        _sync(self.device)
        start = time.perf_counter()
        calls = 0
        while True:
            torch.mm(self.a, self.b)
            calls += 1
            _sync(self.device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        if seconds > 0:
            self.flops += calls * self.flops_per_call
            self.seconds += elapsed

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds else float("nan")
