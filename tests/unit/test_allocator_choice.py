"""When `tmt train` runs itself again with tcmalloc preloaded: only where it is found, on Linux,
once, and never over the user's own choice."""

from transformer_mt.allocator import _DONE, ENV, find_tcmalloc, preload_environment

TC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def test_tcmalloc_is_preloaded_once_in_front_of_the_users_preloads():
    env = preload_environment({"PATH": "/bin", "LD_PRELOAD": "/opt/libfoo.so"}, "linux", TC)
    assert env["LD_PRELOAD"] == f"{TC}:/opt/libfoo.so" and env["PATH"] == "/bin"
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40
    assert preload_environment(env, "linux", TC) is None          # the re-executed process
    assert preload_environment({}, "linux", TC)["LD_PRELOAD"] == TC


def test_no_preload_when_absent_declined_already_chosen_or_not_linux():
    assert preload_environment({}, "linux", None) is None
    assert preload_environment({ENV: "system"}, "linux", TC) is None
    assert preload_environment({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "linux", TC) is None
    assert preload_environment({_DONE: "1"}, "linux", TC) is None
    assert preload_environment({}, "darwin", TC) is None


def test_find_tcmalloc_looks_in_the_given_directories(tmp_path):
    assert find_tcmalloc((str(tmp_path),)) is None
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_tcmalloc((str(tmp_path / "absent"), str(tmp_path))) == \
        str(tmp_path / "libtcmalloc_minimal.so.4")
