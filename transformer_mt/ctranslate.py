"""tmt's Transformer in CTranslate2: the model spec written from a checkpoint (`tmt export
--format ctranslate2`), and a Translator that decodes with `ctranslate2.Translator`.

The spec is filled as CTranslate2's own OpenNMT-py and fairseq converters fill theirs: fused
query/key/value projections, one layer norm per sub-layer (applied before it in pre-norm, after
the residual in post-norm), embeddings scaled by √d_model, and tmt's sinusoidal table given
explicitly (CTranslate2's built-in one orders sin and cos differently). Tokenization,
batching, length caps and detokenization stay tmt's own (inherited from `Translator`), so the
two backends read and write text identically.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from .config import Config, DecodeConfig
from .errors import TmtError
from .model.embeddings import sinusoidal_table
from .model.masks import source_tensor, src_pad_mask
from .search import Hypothesis, length_penalty
from .tokenizer import EOS, SOS, UNK, TextCodec
from .translator import Translator

log = logging.getLogger(__name__)

QUANTIZATIONS = ("float32", "int8", "int8_float32")
# Longer than any input tmt decodes (decode.max_input_tokens + [SOS]/[EOS]) and any output
# (max_len_a * that + max_len_b with the defaults).
POSITIONS = 1024


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise TmtError("the ctranslate2 package is not installed: pip install ctranslate2") \
            from None
    return ctranslate2


def _vocabulary(codec: TextCodec) -> list[str]:
    return codec.tokens(range(codec.vocab_size))


def build_spec(cfg: Config, weights: dict[str, torch.Tensor], src_codec: TextCodec,
               tgt_codec: TextCodec):
    """A `ctranslate2.specs.TransformerSpec` holding the checkpoint's weights."""
    _ctranslate2()                     # a clear error when the package is missing
    from ctranslate2.converters.utils import fuse_linear
    from ctranslate2.specs import common_spec, transformer_spec

    m = cfg.model
    spec = transformer_spec.TransformerSpec.from_config(
        m.layers, m.heads, pre_norm=m.norm == "pre", activation=common_spec.Activation.RELU)
    spec.config.layer_norm_epsilon = 1e-5            # torch.nn.LayerNorm's default
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = UNK, SOS, EOS
    spec.config.decoder_start_token = SOS

    def tensor(name: str) -> torch.Tensor:
        # On the CPU: CTranslate2 compares and saves them there (weights of a model on a GPU
        # failed its comparison of tied matrices).
        return weights[name].detach().float().cpu().contiguous()

    def linear(target, name: str) -> None:
        target.weight, target.bias = tensor(f"{name}.weight"), tensor(f"{name}.bias")

    def norm(target, name: str) -> None:
        target.gamma, target.beta = tensor(f"{name}.weight"), tensor(f"{name}.bias")

    def fused(target, prefix: str, parts: tuple[str, ...]) -> None:
        layers = []
        for part in parts:
            layer = common_spec.LinearSpec()
            linear(layer, f"{prefix}.{part}")
            layers.append(layer)
        fuse_linear(target, layers)

    positions = sinusoidal_table(POSITIONS, m.d_model)
    for side, stack in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        embed = "src_embed" if side == "encoder" else "tgt_embed"
        embeddings = stack.embeddings[0] if side == "encoder" else stack.embeddings
        embeddings.weight = tensor(f"{embed}.embedding.weight")
        stack.position_encodings.encodings = positions
        if m.norm == "pre":
            norm(stack.layer_norm, f"{side}.final_norm")
        for i, layer in enumerate(stack.layer):
            block = f"{side}.blocks.{i}"
            fused(layer.self_attention.linear[0], f"{block}.self_attention", ("w_q", "w_k", "w_v"))
            linear(layer.self_attention.linear[1], f"{block}.self_attention.w_o")
            norm(layer.self_attention.layer_norm, f"{block}.residuals.0.norm")
            if side == "decoder":
                linear(layer.attention.linear[0], f"{block}.cross_attention.w_q")
                fused(layer.attention.linear[1], f"{block}.cross_attention", ("w_k", "w_v"))
                linear(layer.attention.linear[2], f"{block}.cross_attention.w_o")
                norm(layer.attention.layer_norm, f"{block}.residuals.1.norm")
            ffn_norm = 2 if side == "decoder" else 1
            norm(layer.ffn.layer_norm, f"{block}.residuals.{ffn_norm}.norm")
            linear(layer.ffn.linear_0, f"{block}.feed_forward.linear_1")
            linear(layer.ffn.linear_1, f"{block}.feed_forward.linear_2")
    linear(spec.decoder.projection, "projection")
    spec.register_source_vocabulary(_vocabulary(src_codec))
    spec.register_target_vocabulary(_vocabulary(tgt_codec))
    return spec


def save_spec(spec, output: Path, quantization: str) -> None:
    """Validate, quantize and write the spec into the (new) folder `output`."""
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
    except (ValueError, TypeError) as exc:
        raise TmtError(f"CTranslate2 cannot convert this model: {exc}") from None
    output.mkdir(parents=True)
    spec.save(str(output))


class CT2Translator(Translator):
    """A Translator whose search runs in `ctranslate2.Translator` (greedy, beam, n-best,
    top-k sampling) instead of tmt's PyTorch search; everything around it is inherited."""

    replace_unk = False          # there is no attention to read [UNK]'s source word from

    def __init__(self, model_dir: Path, src_codec: TextCodec, tgt_codec: TextCodec,
                 decode_cfg: DecodeConfig, device: str = "auto"):
        ct2 = _ctranslate2()
        if decode_cfg.replace_unk:
            raise TmtError("--replace-unk needs the PyTorch model's attention: use the run's "
                           "checkpoint or a safetensors export, not a ctranslate2 one")
        if device not in ("auto", "cpu", "cuda"):
            raise TmtError(f"CTranslate2 runs on cpu or cuda, not {device}")
        # Deliberately not Translator.__init__: there is no torch model to move or evaluate.
        self.model_dir, self.requested_device = model_dir, device
        self.ct2 = None
        if device == "cuda" or (device == "auto" and ct2.get_cuda_device_count()):
            try:
                self.ct2 = ct2.Translator(str(model_dir), device="cuda")
                self.device = torch.device("cuda")
            except RuntimeError as exc:
                self._gpu_failed(exc)
        if self.ct2 is None:
            self._use_cpu()
        self.model = None
        self.src_codec, self.tgt_codec = src_codec, tgt_codec
        self.decode_cfg = decode_cfg
        self.generator = None

    def _use_cpu(self) -> None:
        self.ct2 = _ctranslate2().Translator(str(self.model_dir), device="cpu",
                                             intra_threads=torch.get_num_threads())
        self.device = torch.device("cpu")

    def _gpu_failed(self, exc: RuntimeError) -> None:
        """CTranslate2's wheel links the CUDA libraries of one version: where they are missing
        (seen on a CUDA 13 machine), loading can succeed and the first translation fail. A GPU
        asked for is then an error; under device auto the caller goes on on the CPU."""
        if self.requested_device == "cuda":
            raise TmtError(f"CTranslate2 cannot run on cuda here ({exc}); use --device cpu, or "
                           "install the CUDA libraries its wheel was built for") from None
        log.warning("CTranslate2 cannot run on cuda here (%s): translating on the CPU", exc)

    def _translate_batch(self, tokens: list[list[str]], **options):
        try:
            return self.ct2.translate_batch(tokens, **options)
        except RuntimeError as exc:
            if self.device.type != "cuda":
                raise
            self._gpu_failed(exc)
            self._use_cpu()
            return self.ct2.translate_batch(tokens, **options)

    def search(self, sentences: list[str], nbest: int = 1) -> list[list[Hypothesis]]:
        """As `Translator.search`, with the same scores. CTranslate2 searches with raw
        log-probabilities (length_penalty 0) and returns all `beam_size` finished hypotheses;
        they are ranked here with tmt's GNMT penalty ((5 + length) / 6) ** alpha, since
        CTranslate2's own (length ** alpha) would rank them differently."""
        encoded = [self.encode_source(s) for s in sentences]
        results = [[Hypothesis([], 0.0)] for _ in sentences]
        decode = self.decode_cfg
        beam_size, alpha = max(decode.beam_size, nbest), decode.length_penalty
        searching = beam_size > 1
        # min_decoding_length 0: [EOS] may come first, as in tmt's search. The [EOS] is
        # returned so that the penalty counts it, as tmt's search does.
        options = dict(beam_size=beam_size, num_hypotheses=beam_size if searching else 1,
                       length_penalty=0.0, return_scores=searching, return_end_token=True,
                       max_input_length=0, min_decoding_length=0)
        if decode.sample_topk and not searching:
            options.update(sampling_topk=decode.sample_topk,
                           sampling_temperature=decode.temperature)
            if self.generator is not None:
                # CTranslate2 seeds each of its threads' generators once, when it first samples:
                # so a seed makes a process's samples repeatable, not each call's.
                _ctranslate2().set_random_seed(
                    int(torch.randint(2 ** 31, (1,), generator=self.generator)))
        token_id = self.tgt_codec.tokenizer.token_to_id
        for chunk in self._batches(encoded):
            src = source_tensor([encoded[i] for i in chunk], self.src_codec)
            caps = self.limits.max_lengths(src_pad_mask(src, self.src_codec.pad_id)).tolist()
            tokens = [[SOS, *self.src_codec.tokens(encoded[i]), EOS] for i in chunk]
            outputs = self._translate_batch(tokens, max_decoding_length=max(caps), **options)
            for i, cap, output in zip(chunk, caps, outputs):
                hyps = []
                scores = output.scores if searching else [math.nan] * len(output.hypotheses)
                for hyp, score in zip(output.hypotheses, scores):
                    ids = [token_id(t) for t in hyp]
                    # One cap for the whole batch in CTranslate2: each sentence's own applies.
                    steps = min(len(ids), cap)
                    ids = [t for t in ids[:cap] if t != self.tgt_codec.eos_id]
                    hyps.append(Hypothesis(ids, score / length_penalty(steps, alpha)))
                results[i] = sorted(hyps, key=lambda h: -h.score)[:nbest] if searching else hyps
        return results
