"""`tmt translate` as a user meets it: a prompt per line at a terminal, decoding knobs checked
like config values, the model it uses named on stderr, and `tmt --version`."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_tmt

from transformer_mt import __version__
from transformer_mt.translator import Translator

SENTENCES = ["Tom is my friend.", "Where is the station?", "I don't know."]


def _read_line(fd: int, timeout: float) -> str:
    """One line from a pipe, waiting at most `timeout` seconds."""
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError(f"no line within {timeout} s (got {data!r})")
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.decode().rstrip("\n")


def test_at_a_terminal_each_line_is_translated_as_it_is_entered(varied_model: Path):
    expected = Translator.from_checkpoint(varied_model, "cpu").translate(SENTENCES[:2])
    terminal, terminal_side = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "transformer_mt", "translate",
                                "--checkpoint", str(varied_model), "--device", "cpu"],
                               stdin=terminal_side, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    os.close(terminal_side)
    try:
        for sentence, translation in zip(SENTENCES[:2], expected):
            # The next line is typed only after the previous translation came out.
            os.write(terminal, sentence.encode() + b"\n")
            assert _read_line(process.stdout.fileno(), 120) == translation
        os.write(terminal, b"\x04")                      # Ctrl-D at the start of a line: EOF
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(terminal)
    stderr = process.stderr.read().decode()
    assert stderr.count("> ") >= 3 and "Ctrl-D" in stderr


def test_decoding_knobs_apply_and_are_checked(varied_model: Path):
    model = ["--checkpoint", str(varied_model), "--device", "cpu"]
    capped = run_tmt("translate", *model, "--max-len-a", "0", "--max-len-b", "1", *SENTENCES)
    assert capped.returncode == 0, capped.stderr
    translator = Translator.from_checkpoint(varied_model, "cpu")
    lines = capped.stdout.splitlines()
    assert len(lines) == 3 and all(len(translator.tgt_codec.encode(t)) <= 1 for t in lines)
    sampled = [run_tmt("translate", *model, "--sample-topk", "10", "--temperature", "1.5",
                       "--seed", "4", *SENTENCES) for _ in range(2)]
    assert sampled[0].returncode == 0, sampled[0].stderr
    assert sampled[0].stdout == sampled[1].stdout
    assert sampled[0].stdout.splitlines() != translator.translate(SENTENCES)
    for bad, words in ((["--length-penalty", "-1"], "decode.length_penalty: must be >= 0"),
                       (["--temperature", "0"], "decode.temperature: must be > 0"),
                       (["--sample-topk", "3", "--beam", "4"], "cannot be combined")):
        refused = run_tmt("translate", *model, *bad, "hello")
        assert refused.returncode != 0 and words in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


def test_translate_and_evaluate_name_the_model_they_use(varied_model: Path):
    translated = run_tmt("translate", "--checkpoint", str(varied_model), "hello")
    assert translated.returncode == 0, translated.stderr
    evaluated = run_tmt("evaluate", "--checkpoint", str(varied_model), "--beam", "1")
    assert evaluated.returncode == 0, evaluated.stderr
    for result in (translated, evaluated):
        assert f"checkpoint {varied_model} (step 6)" in result.stderr
        assert f"run {varied_model.parent.parent}" in result.stderr


def test_version():
    result = run_tmt("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"tmt {__version__}"
