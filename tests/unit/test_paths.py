"""The check that keeps an output from overwriting an input, on every way of naming one file."""

import os

import pytest

from transformer_mt.errors import TmtError
from transformer_mt.paths import refuse_overwriting_inputs, same_file


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("same bytes\n")
    (tmp_path / "twin.txt").write_text("same bytes\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to("in.txt")
    (tmp_path / "sub" / "hard").hardlink_to(tmp_path / "in.txt")
    return tmp_path


@pytest.mark.parametrize("name", ["in.txt", "./in.txt", "sub/../in.txt", "link", "sub/hard",
                                  "{tmp}/in.txt", "{tmp}/sub/../link"])
def test_every_name_of_one_file_is_the_same_file(files, name):
    assert same_file(name.format(tmp=files), "in.txt")
    with pytest.raises(TmtError, match="is the same file as --input in.txt"):
        refuse_overwriting_inputs(name.format(tmp=files), [("--input", "in.txt")])


@pytest.mark.parametrize("name", ["twin.txt", "new.txt", "sub", "sub/in.txt"])
def test_other_files_equal_bytes_and_new_files_are_not(files, name):
    assert not same_file(name, "in.txt")
    refuse_overwriting_inputs(name, [("--input", "in.txt")])


def test_standard_streams_and_missing_options_are_skipped(files):
    refuse_overwriting_inputs("-", [("--input", "-")])
    refuse_overwriting_inputs(None, [("--input", "in.txt")])
    refuse_overwriting_inputs("in.txt", [("--input", None), ("--input", "-")])


def test_the_first_matching_input_is_named(files):
    with pytest.raises(TmtError, match="--attention link is the same file as the checkpoint"):
        refuse_overwriting_inputs("link", [("--input", "twin.txt"), ("the checkpoint", "in.txt")],
                                  "--attention")
    assert os.path.isfile("in.txt") and (files / "in.txt").read_text() == "same bytes\n"
