"""The run directory is the user's: hostile run-directory cases through the real `tmt train`.

Every case asserts: no traceback, one error line with the expected fragment (or success), the
expected exit code, and that every file that existed before (the corpus included) is
byte-identical afterwards unless the command is meant to change it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import needs_real_text, run_tmt, sample_pairs, tiny_config_text, write_tsv

STEPS = 3
# What a successful `tmt train` is meant to write (besides new files).
TRAINING_OUTPUTS = ("run/checkpoints/", "run/tensorboard/", "run/train.log", "run/config.yaml",
                    "run/.tmt-lock")
LOCK_MESSAGE = "is being trained by another tmt process (PID"


@dataclass
class Env:
    corpus: Path
    config: Path
    template: Path          # a finished run of `config`, made alone
    other: Path             # the same config trained on another corpus: other vocabularies


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    base = tmp_path_factory.mktemp("safety")
    corpus = base / "corpus.tsv"
    config = base / "tiny.yaml"
    config.write_text(tiny_config_text(corpus, max_steps=STEPS, threads=1), encoding="utf-8")
    made = {}
    # Same config and corpus path, other sentences: a run whose checkpoint and tokenizers fit
    # the config but not the template's data.
    for name, seed in (("other", 1), ("template", 0)):
        write_tsv(corpus, sample_pairs(600, seed=seed))
        made[name] = base / name
        result = run_tmt("train", "--config", str(config), "--run-dir", str(made[name]))
        assert result.returncode == 0, result.stderr
    return Env(corpus, config, made["template"], made["other"])


@dataclass
class Ctx:
    env: Env
    case: Path
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    holder: subprocess.Popen | None = None

    @property
    def run(self) -> Path:
        return self.case / "run"

    def copy_template(self, without: tuple[str, ...] = ()) -> None:
        shutil.copytree(self.env.template, self.run,
                        ignore=lambda d, names: [n for n in names if Path(d) == self.env.template
                                                 and n in without])

    def train(self, *extra: str) -> list[str]:
        return ["train", "--config", str(self.env.config), "--run-dir", str(self.run), *extra]

    def resume(self, *extra: str) -> list[str]:
        return self.train("--resume", "--max-steps", str(STEPS + 1), *extra)

    def touch_corpus(self) -> None:
        stat = self.env.corpus.stat()
        os.utime(self.env.corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        self.cleanups.append(lambda: os.utime(self.env.corpus,
                                              ns=(stat.st_atime_ns, stat.st_mtime_ns)))

    def hold_lock(self) -> None:
        """Another process holds the run's lock, as a training tmt does."""
        self.run.mkdir(exist_ok=True)
        self.holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(self.run / ".tmt-lock")],
                                       stdout=subprocess.PIPE, text=True)
        self.cleanups.append(self._stop_holder)
        assert self.holder.stdout.readline().strip() == "locked"

    def _stop_holder(self) -> None:
        self.holder.kill()
        self.holder.wait()
        self.holder.stdout.close()

    def undo(self) -> None:
        """Put back what the setup changed outside the case folder; stop helper processes."""
        for cleanup in reversed(self.cleanups):
            cleanup()


HOLDER = """import fcntl, os, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
handle.seek(0); handle.truncate(); handle.write(str(os.getpid())); handle.flush()
print("locked", flush=True)
time.sleep(300)
"""


# --------------------------------------------------------------------------- setups

def user_folder(name: str, file: str, content: bytes) -> Callable[[Ctx], list[str]]:
    def setup(ctx: Ctx) -> list[str]:
        (ctx.run / name).mkdir(parents=True)
        (ctx.run / name / file).write_bytes(content)
        return ctx.train()
    return setup


def random_files(ctx: Ctx) -> list[str]:
    ctx.run.mkdir()
    (ctx.run / "notes.txt").write_text("my thesis\n")
    (ctx.run / "photo.jpg").write_bytes(os.urandom(2048))
    return ctx.train()


def lock_linked_to_user_file(ctx: Ctx) -> list[str]:
    ctx.run.mkdir()
    (ctx.case / "diary.txt").write_text("dear diary\n")
    (ctx.run / ".tmt-lock").symlink_to(ctx.case / "diary.txt")
    return ctx.train()


def run_dir_is_a_file(ctx: Ctx) -> list[str]:
    ctx.run.write_text("not a directory\n")
    return ctx.train()


def run_dir_under_a_file(ctx: Ctx) -> list[str]:
    (ctx.case / "file.txt").write_text("x\n")
    return ["train", "--config", str(ctx.env.config), "--run-dir",
            str(ctx.case / "file.txt" / "run")]


def name_set_to(value: str) -> Callable[[Ctx], list[str]]:
    def setup(ctx: Ctx) -> list[str]:
        return ["train", "--config", str(ctx.env.config), "--set", f"name={value}",
                "--set", f"runs_dir={ctx.case / 'runs'}"]
    return setup


def name_in_yaml(ctx: Ctx) -> list[str]:
    config = ctx.case / "escape.yaml"
    config.write_text(ctx.env.config.read_text().replace("name: test", "name: ../../escaped"))
    return ["train", "--config", str(config), "--set", f"runs_dir={ctx.case / 'runs'}"]


def interrupted_preparation(ctx: Ctx) -> list[str]:
    staging = ctx.run / ".tmt-staging" / "data" / "train"
    staging.mkdir(parents=True)
    (staging / "data-00000-of-00001.arrow").write_bytes(b"half written")
    (ctx.run / ".tmt-lock").write_text("12345\n")
    return ctx.train()


def interrupted_while_moving_into_place(ctx: Ctx) -> list[str]:
    """Preparation finished (run.json in the staging folder); data/ was moved, tokenizers not."""
    ctx.copy_template(without=("checkpoints", "tensorboard", "train.log", "config.yaml"))
    staging = ctx.run / ".tmt-staging"
    staging.mkdir()
    os.replace(ctx.run / "tokenizers", staging / "tokenizers")
    os.replace(ctx.run / "run.json", staging / "run.json")
    return ctx.train()


def prepared_without_checkpoint(*extra: str) -> Callable[[Ctx], list[str]]:
    def setup(ctx: Ctx) -> list[str]:
        ctx.copy_template(without=("checkpoints", "tensorboard"))
        return ctx.train(*extra)
    return setup


def prepared_then_corpus_changed(ctx: Ctx) -> list[str]:
    ctx.copy_template(without=("checkpoints", "tensorboard"))
    ctx.touch_corpus()
    return ctx.train()


def damaged_marker(ctx: Ctx) -> list[str]:
    ctx.copy_template(without=("checkpoints", "tensorboard"))
    (ctx.run / "run.json").write_text('{"tmt_version": "0.1.0", "finger')
    return ctx.train()


def finished_run(ctx: Ctx) -> list[str]:
    ctx.copy_template()
    return ctx.train()


def resume_after(change: Callable[[Ctx], None], *extra: str) -> Callable[[Ctx], list[str]]:
    def setup(ctx: Ctx) -> list[str]:
        ctx.copy_template()
        change(ctx)
        return ctx.resume(*extra)
    return setup


def without_tokenizers_corpus_rewritten(ctx: Ctx) -> None:
    """Splitting and tokenizing the corpus again would now give other vocabularies."""
    shutil.rmtree(ctx.run / "tokenizers")
    original, stat = ctx.env.corpus.read_bytes(), ctx.env.corpus.stat()
    write_tsv(ctx.env.corpus, sample_pairs(600, seed=2))

    def restore() -> None:
        ctx.env.corpus.write_bytes(original)
        os.utime(ctx.env.corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    ctx.cleanups.append(restore)


def corrupt_tokenizer(ctx: Ctx) -> None:
    (ctx.run / "tokenizers" / "tgt.json").write_bytes(b"\xff\xfe{not json")


def foreign_checkpoint(ctx: Ctx) -> None:
    shutil.copyfile(ctx.env.other / "checkpoints" / "last.pt", ctx.run / "checkpoints" / "last.pt")


def misshapen_checkpoint(ctx: Ctx) -> None:
    path = ctx.run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(3, 3)
    torch.save(state, path)


def corpus_gone(ctx: Ctx) -> None:
    away = ctx.env.corpus.with_suffix(".away")
    os.replace(ctx.env.corpus, away)
    ctx.cleanups.append(lambda: os.replace(away, ctx.env.corpus))


def split_gone(ctx: Ctx) -> None:
    shutil.rmtree(ctx.run / "data")


def marker_of_other_settings(ctx: Ctx) -> None:
    path = ctx.run / "run.json"
    path.write_text(path.read_text().replace('"seed": 1234', '"seed": 99'))


def stale_lock(ctx: Ctx) -> None:
    (ctx.run / ".tmt-lock").write_text("999999\n")    # its process is gone: no flock is held


def nothing_to_resume(ctx: Ctx) -> list[str]:
    return ctx.resume()


def locked_empty_run(ctx: Ctx) -> list[str]:
    ctx.hold_lock()
    return ctx.train()


def locked_finished_run(ctx: Ctx) -> list[str]:
    ctx.copy_template()
    ctx.hold_lock()
    return ctx.resume()


# --------------------------------------------------------------------------- extra checks

def _template_file(ctx: Ctx, relative: str) -> bytes:
    return (ctx.env.template / relative).read_bytes()


def tokenizers_restored(ctx: Ctx) -> None:
    for side in ("src", "tgt"):
        relative = f"tokenizers/{side}.json"
        assert (ctx.run / relative).read_bytes() == _template_file(ctx, relative)


def prepared_and_marked(ctx: Ctx) -> None:
    assert not (ctx.run / ".tmt-staging").exists()
    assert (ctx.run / "run.json").is_file() and (ctx.run / "checkpoints" / "last.pt").is_file()


def same_split_as_template(ctx: Ctx) -> None:
    prepared_and_marked(ctx)
    for split in ("train", "valid", "test"):
        relative = f"data/{split}/data-00000-of-00001.arrow"
        assert (ctx.run / relative).read_bytes() == _template_file(ctx, relative)


def nothing_created(ctx: Ctx) -> None:
    for place in (ctx.case / "runs", ctx.case / "escaped", ctx.case.parent / "escaped",
                  Path("/tmp/tmt-escaped")):
        assert not place.exists(), place


def holder_named(ctx: Ctx, line: str) -> None:
    assert f"PID {ctx.holder.pid})" in line


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Ctx], list[str]]
    code: int
    fragment: str | None = None                 # in the one error line; None: success
    may_change: tuple[str, ...] = ()            # case-relative prefixes the command may change
    check: Callable[[Ctx], None] | None = None
    check_line: Callable[[Ctx, str], None] | None = None


NOT_TMT = "is not a tmt run"
CASES = [
    Case("user-data-folder", user_folder("data", "corpus.tsv", b"mine\tmio\n"), 1, NOT_TMT),
    Case("user-tokenizers-folder", user_folder("tokenizers", "src.json", b"{}"), 1, NOT_TMT),
    Case("user-checkpoints-folder", user_folder("checkpoints", "model.pt", b"weights"), 1,
         NOT_TMT),
    Case("folder-named-like-staging", user_folder(".staging", "x", b"x"), 1, NOT_TMT),
    Case("random-files", random_files, 1, NOT_TMT),
    Case("lock-file-linked-to-a-user-file", lock_linked_to_user_file, 1, NOT_TMT),
    Case("run-dir-is-a-file", run_dir_is_a_file, 1, "is a file, not a run directory"),
    Case("run-dir-under-a-file", run_dir_under_a_file, 1, "is not writable"),
    Case("name-parent", name_set_to("../escaped"), 2, "name: must be a plain folder name",
         check=nothing_created),
    Case("name-absolute", name_set_to("/tmp/tmt-escaped"), 2, "name: must be a plain folder",
         check=nothing_created),
    Case("name-dotdot", name_set_to(".."), 2, "name: must be a plain folder name",
         check=nothing_created),
    Case("name-dot", name_set_to("."), 2, "name: must be a plain folder name",
         check=nothing_created),
    Case("name-nested", name_set_to("a/b"), 2, "name: must be a plain folder name",
         check=nothing_created),
    Case("name-blank", name_set_to("'  '"), 2, "name: must be a plain folder name",
         check=nothing_created),
    Case("name-empty", name_set_to(""), 2, "name: must be a string", check=nothing_created),
    Case("name-escaping-in-yaml", name_in_yaml, 2, "name: must be a plain folder name",
         check=nothing_created),
    Case("interrupted-preparation", interrupted_preparation, 0,
         may_change=("run/.tmt-staging/",), check=prepared_and_marked),
    Case("interrupted-while-moving", interrupted_while_moving_into_place, 0,
         may_change=("run/.tmt-staging/",), check=same_split_as_template),
    Case("prepared-same-settings", prepared_without_checkpoint(), 0,
         check=same_split_as_template),
    Case("prepared-other-data-setting", prepared_without_checkpoint("--set", "data.max_len=50"),
         1, "split made with other settings: data.max_len (100 -> 50)"),
    Case("prepared-other-tokenizer-setting",
         prepared_without_checkpoint("--set", "tokenizer.min_frequency=2"), 1,
         "tokenizer.min_frequency (1 -> 2)"),
    Case("prepared-corpus-changed", prepared_then_corpus_changed, 1, "the corpus changed"),
    Case("damaged-run-json", damaged_marker, 1, "run.json is damaged"),
    Case("fresh-start-over-a-run", finished_run, 1, "pass --resume"),
    Case("resume-tokenizers-missing", resume_after(without_tokenizers_corpus_rewritten), 0,
         check=tokenizers_restored),
    Case("resume-tokenizer-corrupt", resume_after(corrupt_tokenizer), 1,
         "tgt.json is damaged"),
    Case("resume-checkpoint-of-another-run", resume_after(foreign_checkpoint), 1,
         "come from different runs"),
    Case("resume-misshapen-checkpoint", resume_after(misshapen_checkpoint), 1,
         "does not fit this run's model"),
    Case("resume-corpus-gone", resume_after(corpus_gone), 0),
    Case("resume-split-missing", resume_after(split_gone), 1, "lacks its saved split"),
    Case("resume-marker-other-settings", resume_after(marker_of_other_settings), 1,
         "split made with other settings: data.seed (99 -> 1234)"),
    Case("resume-changes-data-setting", resume_after(lambda ctx: None, "--set",
                                                     "data.max_len=50"), 1,
         "split made with other settings: data.max_len"),
    Case("resume-nothing", nothing_to_resume, 1, "nothing to resume"),
    Case("resume-stale-lock", resume_after(stale_lock), 0),
    Case("fresh-start-while-locked", locked_empty_run, 1, LOCK_MESSAGE, check_line=holder_named),
    Case("resume-while-locked", locked_finished_run, 1, LOCK_MESSAGE, check_line=holder_named),
]


def tree_hashes(ctx: Ctx) -> dict[str, str]:
    hashes = {}
    for root, _, files in os.walk(ctx.case):
        for name in files:
            path = Path(root) / name
            hashes[str(path.relative_to(ctx.case))] = hashlib.sha256(path.read_bytes()).hexdigest()
    if ctx.env.corpus.is_file():
        hashes["<corpus>"] = hashlib.sha256(ctx.env.corpus.read_bytes()).hexdigest()
    return hashes


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("tmt: error: "), stderr
    return errors[0]


# "other vocabularies" need two different real corpora.
REAL_TEXT_CASES = {"resume-checkpoint-of-another-run"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=needs_real_text) if c.id in REAL_TEXT_CASES
                                  else c for c in CASES], ids=[c.id for c in CASES])
def test_hostile_run_directory(case: Case, env: Env, tmp_path: Path):
    ctx = Ctx(env, tmp_path)
    try:
        args = case.setup(ctx)
        before = tree_hashes(ctx)
        result = run_tmt(*args, cwd=tmp_path)
        after = tree_hashes(ctx)
    finally:
        ctx.undo()
    assert result.returncode == case.code, result.stderr
    may_change = case.may_change + (TRAINING_OUTPUTS if case.code == 0 else ("run/.tmt-lock",))
    changed = sorted(path for path, digest in before.items() if after.get(path) != digest
                     and not path.startswith(may_change))
    assert not changed, changed
    if case.fragment is None:
        assert "Traceback" not in result.stderr and "error" not in result.stderr, result.stderr
    else:
        line = one_error_line(result.stderr)
        assert case.fragment in line, line
        assert set(after) - set(before) <= {"run/.tmt-lock"}, set(after) - set(before)
        if case.check_line:
            case.check_line(ctx, line)
    if case.check:
        case.check(ctx)


# --------------------------------------------------------------------------- two writers

def _model(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


def _assert_same_model(a: Path, b: Path) -> None:
    model_a, model_b = _model(a), _model(b)
    assert model_a.keys() == model_b.keys()
    for name, tensor in model_a.items():
        assert torch.equal(tensor, model_b[name]), name


@dataclass(frozen=True)
class Outcome:
    pid: int
    returncode: int
    stderr: str


def _race(args: list[str], cwd: Path) -> tuple[Outcome, Outcome]:
    """Start two identical `tmt` commands at once; (the one that succeeded, the other)."""
    processes = [subprocess.Popen([sys.executable, "-m", "transformer_mt", *args], cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    done = [Outcome(p.pid, p.returncode, p.communicate(timeout=300)[1]) for p in processes]
    done = [Outcome(o.pid, p.returncode, o.stderr) for o, p in zip(done, processes)]
    winners = [o for o in done if o.returncode == 0]
    assert len(winners) == 1, done
    return winners[0], done[1 - done.index(winners[0])]


def _assert_stopped_by(loser: Outcome, winner: Outcome, run: Path) -> None:
    assert loser.returncode == 1
    line = one_error_line(loser.stderr)
    assert f"{run} {LOCK_MESSAGE} {winner.pid})" in line, line


def test_two_fresh_starts_on_one_run_one_trains_as_if_alone(env: Env, tmp_path: Path):
    run = tmp_path / "run"
    winner, loser = _race(["train", "--config", str(env.config), "--run-dir", str(run)],
                          tmp_path)
    _assert_stopped_by(loser, winner, run)
    _assert_same_model(run, env.template)


def test_two_resumes_of_one_run_one_continues_as_if_alone(env: Env, tmp_path: Path):
    alone, run = tmp_path / "alone", tmp_path / "run"
    shutil.copytree(env.template, alone)
    shutil.copytree(env.template, run)
    resume = ["train", "--config", str(env.config), "--resume", "--max-steps", str(STEPS + 2)]
    winner, loser = _race([*resume, "--run-dir", str(run)], tmp_path)
    _assert_stopped_by(loser, winner, run)
    result = run_tmt(*resume, "--run-dir", str(alone))
    assert result.returncode == 0, result.stderr
    _assert_same_model(run, alone)


def test_a_run_being_trained_stays_readable(env: Env, tmp_path: Path):
    """translate and info take no lock: they work while a writer holds the run."""
    ctx = Ctx(env, tmp_path)
    ctx.copy_template()
    ctx.hold_lock()
    try:
        info = run_tmt("info", "--run", str(ctx.run))
        translated = run_tmt("translate", "--run", str(ctx.run), "--checkpoint", "last", "Hello.")
    finally:
        ctx.undo()
    assert info.returncode == 0 and "trained: 3 steps" in info.stdout, info.stderr
    assert translated.returncode == 0 and translated.stdout.count("\n") == 1, translated.stderr
