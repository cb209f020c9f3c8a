"""`tmt export`: safetensors and CTranslate2 folders decode as the checkpoint does (CTranslate2
float32 greedy gives PyTorch's tokens, pre-norm and post-norm, tied or not), int8 is smaller,
every `--model` command works on both formats, and what cannot be done is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import needs_real_text, run_tmt
from safetensors import safe_open
from server_process import TmtServer

from transformer_mt.checkpoint import atomic_save, load_checkpoint
from transformer_mt.config import config_from_dict
from transformer_mt.errors import TmtError
from transformer_mt.export import export_model
from transformer_mt.loading import load_model
from transformer_mt.model import build_model
from transformer_mt.pipeline import load_held_out_split
from transformer_mt.rundir import RunDir

pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def sources(varied_model: Path) -> list[str]:
    run = RunDir(varied_model.parent.parent)
    return list(load_held_out_split(run)["src"]) + ["", "Tom", "A much longer sentence, with "
                                                "commas, \"quotes\" and words it never saw."]


@pytest.fixture(scope="module")
def exports(varied_model: Path, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exports")
    return {name: export_model(varied_model, folder / name, fmt, quantization)
            for name, fmt, quantization in (("safetensors", "safetensors", None),
                                            ("float32", "ctranslate2", "float32"),
                                            ("int8", "ctranslate2", "int8"))}


def _variant(varied_model: Path, folder: Path, **model_changes) -> Path:
    """The varied model's run with another architecture (seeded random weights)."""
    state = load_checkpoint(varied_model)
    state["config"]["model"].update(model_changes)
    cfg = config_from_dict(state["config"])
    torch.manual_seed(1)
    state["model"] = build_model(cfg.model, state["vocab"]["src"],
                                 state["vocab"]["tgt"]).state_dict()
    path = folder / "variant.pt"
    atomic_save(state, path)
    return path


def _same_share(a: list, b: list) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


@needs_real_text
@pytest.mark.parametrize("changes", [{}, {"norm": "post"}, {"tie_embeddings": True}])
def test_ctranslate2_float32_greedy_gives_pytorch_tokens(varied_model, sources, tmp_path,
                                                         changes):
    checkpoint = _variant(varied_model, tmp_path, **changes) if changes else varied_model
    exported = export_model(checkpoint, tmp_path / "ct2", "ctranslate2", "float32")
    pytorch = load_model(str(checkpoint), None, "runs", None, "cpu").translator
    ct2 = load_model(None, None, "runs", str(exported), "cpu").translator
    expected = pytorch.translate_ids(sources)
    # A precondition, not the property: the outputs must differ enough that equal tokens mean
    # something (seeded random post-norm weights repeat themselves more than pre-norm ones).
    assert len({str(e) for e in expected}) > len(sources) // 3, "outputs should vary"
    # Random weights make near-ties that float rounding may break differently: allow 2%.
    assert _same_share(ct2.translate_ids(sources), expected) >= 0.98
    assert ct2.translate(sources[-3:]) == pytorch.translate(sources[-3:])


@needs_real_text
def test_ctranslate2_beam_and_nbest_rank_and_score_as_pytorch(varied_model, exports, sources):
    # One sentence per batch: CTranslate2 caps a whole batch's length at once, and the
    # random weights here run to the cap (a trained model mostly stops well before it).
    pytorch = load_model(str(varied_model), None, "runs", None, "cpu",
                         batch_size=1).translator
    ct2 = load_model(None, None, "runs", str(exports["float32"]), "cpu", batch_size=1
                     ).translator
    expected = pytorch.with_decoding(beam_size=4, length_penalty=1.0).translate_nbest(sources, 3)
    found = ct2.with_decoding(beam_size=4, length_penalty=1.0).translate_nbest(sources, 3)
    assert _same_share([[t for t, _ in h] for h in found],
                       [[t for t, _ in h] for h in expected]) >= 0.95
    same = [(f, e) for f, e in zip(found, expected) if [t for t, _ in f] == [t for t, _ in e]]
    for f, e in same:
        assert [s for _, s in f] == pytest.approx([s for _, s in e], abs=1e-3)


def test_ctranslate2_top1_sampling_is_greedy_and_a_seed_repeats_samples(exports, sources):
    ct2 = load_model(None, None, "runs", str(exports["float32"]), "cpu").translator
    greedy = ct2.translate(sources)
    assert ct2.with_decoding(sample_topk=1).translate(sources) == greedy
    # CTranslate2 seeds its generators once per process: compare two processes.
    sample = ["translate", "--model", str(exports["float32"]), "--sample-topk", "20",
              "--temperature", "2", "--seed", "3", *sources[:5]]
    first, again = run_tmt(*sample), run_tmt(*sample)
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout and first.stdout.splitlines() != greedy[:5]


def test_safetensors_export_is_pickle_free_and_decodes_as_the_checkpoint(
        varied_model, exports, sources):
    folder = exports["safetensors"]
    with safe_open(folder / "model.safetensors", framework="pt") as weights:
        assert "projection.weight" in weights.keys()
    assert not list(folder.glob("*.pt"))
    manifest = json.loads((folder / "tmt-model.json").read_text())
    assert manifest["format"] == "safetensors" and manifest["step"] == 6
    assert manifest["run"] == "run" and "steps" in (folder / "README.md").read_text()
    checkpoint = load_model(str(varied_model), None, "runs", None, "cpu").translator
    exported = load_model(None, None, "runs", str(folder), "cpu").translator
    assert (exported.with_decoding(beam_size=3).translate(sources)
            == checkpoint.with_decoding(beam_size=3).translate(sources))


@needs_real_text
def test_int8_is_smaller_and_still_translates(exports, sources):
    float32 = (exports["float32"] / "model.bin").stat().st_size
    int8 = (exports["int8"] / "model.bin").stat().st_size
    assert int8 < 0.5 * float32
    translations = load_model(None, None, "runs", str(exports["int8"]), "cpu"
                              ).translator.translate(sources)
    assert len(translations) == len(sources) and any(translations)


@pytest.mark.parametrize("name", ["safetensors", "int8"])
def test_every_model_command_works_on_an_export(exports, name):
    folder = str(exports[name])
    translated = run_tmt("translate", "--model", folder, "--nbest", "2", "--beam", "2",
                         "Tom is here.")
    assert translated.returncode == 0, translated.stderr
    assert translated.stdout.startswith("0 ||| ") and f"export {folder}" in translated.stderr
    report_path = Path(folder) / "report.hyp"
    evaluated = run_tmt("evaluate", "--model", folder, "--json", "--output", str(report_path))
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["sentences"] > 0 and report["checkpoint"].startswith(folder)


def test_serve_runs_a_ctranslate2_export(exports, sources):
    folder = exports["float32"]
    expected = load_model(None, None, "runs", str(folder), "cpu").translator.translate(
        sources[:5])
    served = TmtServer("--model", str(folder), "--device", "cpu")
    try:
        status, health = served.request("/health")
        answer = served.translate(text=sources[:5])
        attention_status, attention = served.request("/attention", {"text": "Tom"})
    finally:
        assert served.terminate() == 0, served.stderr
    assert status == 200 and health["model"]["backend"] == "ctranslate2"
    assert answer["translations"] == expected
    assert attention_status == 501 and "CTranslate2" in attention["error"]


def test_export_refuses_what_it_cannot_do(varied_model, exports, tmp_path):
    with pytest.raises(TmtError, match="already exists"):
        export_model(varied_model, exports["float32"], "ctranslate2", None)
    with pytest.raises(TmtError, match="ctranslate2 only"):
        export_model(varied_model, tmp_path / "x", "safetensors", "int8")
    assert not (tmp_path / "x").exists()
    refused = run_tmt("translate", "--model", str(tmp_path), "hello")
    assert refused.returncode != 0 and "not a tmt export" in refused.stderr
    both = run_tmt("translate", "--model", str(exports["int8"]), "--checkpoint",
                   str(varied_model), "hello")
    assert both.returncode != 0 and "not both" in both.stderr
    for result in (refused, both):
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    (tmp_path / "tmt-model.json").write_text('{"format": "ctranslate2"}')
    with pytest.raises(TmtError, match="damaged"):
        load_model(None, None, "runs", str(tmp_path), "cpu")


class _WithoutCudaLibraries:
    """ctranslate2.Translator as on a GPU machine without the CUDA libraries its wheel links
    (seen on a CUDA 13 machine): on cuda, loading fails, or (`fail_at="translate"`) loading
    succeeds and the first translation fails."""

    def __init__(self, real, fail_at: str):
        self.real, self.fail_at = real, fail_at

    def __call__(self, model_dir, device="cpu", **options):
        if device == "cpu":
            return self.real(model_dir, device="cpu", **options)
        if self.fail_at == "load":
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")
        return self

    def translate_batch(self, *args, **options):
        raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")


@pytest.mark.parametrize("fail_at", ["load", "translate"])
def test_a_gpu_ctranslate2_cannot_use_falls_back_to_the_cpu_or_is_one_error(
        exports, sources, monkeypatch, fail_at):
    """Under device auto the export translates on the CPU, as it would have there; with
    --device cuda the error says why the GPU cannot be used."""
    import ctranslate2

    cpu = load_model(None, None, "runs", str(exports["float32"]), "cpu").translator
    expected = cpu.translate(sources[:8])
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    monkeypatch.setattr(ctranslate2, "Translator",
                        _WithoutCudaLibraries(ctranslate2.Translator, fail_at))
    auto = load_model(None, None, "runs", str(exports["float32"]), "auto").translator
    assert auto.translate(sources[:8]) == expected and auto.device.type == "cpu"
    with pytest.raises(TmtError, match=r"CTranslate2 cannot run on cuda here \(Library libcublas"):
        load_model(None, None, "runs", str(exports["float32"]), "cuda").translator.translate(
            sources[:8])
