"""Cross-attention heatmaps: which source tokens each output token attended to.

The weights are those of the last decoder layer, averaged over its heads (as JoeyNMT plots them),
recorded by re-running the decoder over the finished translation with teacher forcing: the search
itself stays on its fast path, and the picture shows exactly the translation that was printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from .errors import TmtError
from .model.masks import source_tensor, src_pad_mask
from .tokenizer import EOS, SOS
from .translator import Translator
from .unk import last_layer_cross_attention


@dataclass(frozen=True)
class Alignment:
    src_tokens: list[str]        # [SOS] source tokens [EOS], as the encoder saw them
    tgt_tokens: list[str]        # output tokens, then [EOS]
    weights: np.ndarray          # (len(tgt_tokens), len(src_tokens)); each row sums to 1


@torch.no_grad()
def cross_attention(translator: Translator, sentence: str) -> Alignment:
    """Translate `sentence` (with the translator's decoding settings) and return the last decoder
    layer's cross-attention over it."""
    model = translator.model
    src_ids = translator.encode_source(sentence)
    if not src_ids:
        raise TmtError("cannot draw the attention of an empty sentence")
    out_ids = translator.translate_ids([sentence])[0][0]
    codec = translator.tgt_codec
    src = source_tensor([src_ids], translator.src_codec).to(translator.device)
    tgt_in = torch.tensor([[codec.sos_id, *out_ids]], device=translator.device)
    weights = last_layer_cross_attention(model, src, src_pad_mask(src, translator.src_codec.pad_id),
                                         tgt_in)[0].float().cpu().numpy()
    return Alignment([SOS, *translator.src_codec.tokens(src_ids), EOS],
                     [*codec.tokens(out_ids), EOS], weights)


def attention_figure(alignment: Alignment, title: str | None = None) -> Figure:
    """A heatmap with the source tokens along the x axis and the output tokens down the y axis."""
    rows, cols = alignment.weights.shape
    # Grow with the sentence so that every token label stays readable.
    figure = Figure(figsize=(max(4.0, 0.45 * cols + 1.5), max(3.0, 0.4 * rows + 1.2)),
                    layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(alignment.weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(cols), alignment.src_tokens, rotation=60, ha="right",
                    rotation_mode="anchor")
    axes.set_yticks(range(rows), alignment.tgt_tokens)
    axes.set_xlabel("source")
    axes.set_ylabel("translation")
    if title:
        axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.05)
    return figure


def save_attention_plot(alignment: Alignment, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        attention_figure(alignment).savefig(path, dpi=120)
    except (OSError, ValueError) as exc:
        # ValueError: matplotlib cannot tell the image format from the file name.
        raise TmtError(f"could not write the attention plot {path}: {exc}") from None
