"""Command lines an adversarial run found misreported (issue 20, items 4 to 6): each is refused
with the exit status the README documents, one line on stderr, and never a traceback; an --out
that is not a regular file is refused before any query and left as it is."""

import json
import os
import socket
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest

from attnquery.cli import main
from attnquery.errors import AnswerError, OracleFailure
from attnquery.oracles import ValueOracle
from attnquery.realheads import save_head, write_test_checkpoint
from tests.fixtures import HEAD8

BOX = ["extract", "--oracle", "tests.fixtures:head8", "--d", "8", "--no-progress"]


def run(argv, capsys):
    """``main(argv)``: the exit status and the one line on stderr (asserted to be one line,
    starting with the subcommand, with no traceback anywhere)."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit
        status = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"attnquery {argv[0]}"), out.err
    return status, lines[0]


class _Counting:
    """A black box that counts its calls and, if ever called, answers as HEAD8."""

    def __init__(self):
        self.calls = 0

    def __call__(self, X):
        self.calls += 1
        return HEAD8(X)


@pytest.fixture
def counting(monkeypatch, repo):
    monkeypatch.chdir(repo)
    box = _Counting()
    monkeypatch.setattr("tests.fixtures.HEAD8", box)
    return box


# -- item 4: --out never replaces what is not a regular file -----------------------------------


def test_out_refuses_a_fifo_before_any_query(tmp_path, capsys, counting):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    status, line = run(BOX + ["--out", str(fifo)], capsys)
    assert status == 2 and "not a regular file" in line and "FIFO" in line
    assert counting.calls == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO


def test_out_refuses_a_socket(capsys, counting):
    folder = Path(tempfile.mkdtemp(prefix="aq", dir="/tmp"))  # a short path: AF_UNIX limit
    sock_path = folder / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        status, line = run(BOX + ["--out", str(sock_path)], capsys)
        assert status == 2 and "not a regular file" in line and "socket" in line
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    sock_path.unlink()
    folder.rmdir()
    assert counting.calls == 0


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_out_refuses_a_device(device, capsys, counting):
    if not os.path.exists(device) or not stat.S_ISCHR(os.stat(device).st_mode):
        pytest.skip(f"{device} is not a character device here")
    before = os.stat(device)
    # the black box is never called: were the check missing, the run would stop at the first
    # query (exit 1) and nothing would be written over the device
    status, line = run(["extract", "--oracle", "tests.fixtures:failing_head", "--d", "4",
                        "--out", device], capsys)
    assert status == 2 and "not a regular file" in line and "character device" in line
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    status, line = run(["heads", "no_such.safetensors", "--layer", "0", "--head", "0",
                        "--out", device], capsys)
    assert status == 2 and "not a regular file" in line


def test_out_through_a_link_to_a_fifo_is_refused(tmp_path, capsys, counting):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "link.npz").symlink_to(fifo)
    status, line = run(BOX + ["--out", str(tmp_path / "link.npz")], capsys)
    assert status == 2 and "not a regular file" in line and counting.calls == 0


# -- item 5: a BaseException from the black box --------------------------------------------------


def test_a_cancelled_black_box_is_one_line(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    status, line = run(["extract", "--oracle", "tests.fixtures:cancelled_head", "--d", "8"],
                       capsys)
    assert status == 1
    assert "the black box raised CancelledError" in line and "OracleFailure" in line


def test_the_oracle_wraps_a_base_exception_but_not_ctrl_c():
    import asyncio

    def cancelled(X):
        raise asyncio.CancelledError("gone")

    def interrupted(X):
        raise KeyboardInterrupt

    with pytest.raises(OracleFailure, match="raised CancelledError"):
        ValueOracle(cancelled, 4)(np.zeros((1, 2, 4)))
    with pytest.raises(KeyboardInterrupt):
        ValueOracle(interrupted, 4)(np.zeros((1, 2, 4)))


# -- item 6: usage errors (exit 2), and answers that are not numbers (exit 1) ------------------


@pytest.fixture
def ckpt(tmp_path):
    """A small BERT-style checkpoint, with a config.json beside it, in its own folder."""
    return write_test_checkpoint(tmp_path / "m" / "model.safetensors", n_layers=2, n_heads=4,
                                 d=16, seed=2)


def test_module_that_does_not_exist(tmp_path, capsys):
    status, line = run(["extract", "--module", str(tmp_path / "none.safetensors"), "--layer",
                        "0"], capsys)
    assert status == 2 and "does not exist" in line


@pytest.mark.parametrize("config, message", [
    ("{not json", "is not valid JSON"),
    ('{"num_attention_heads": "abc"}', "num_attention_heads"),
    ('{"num_attention_heads": 2.5}', "num_attention_heads"),
    ("[4]", "is not a JSON object"),
])
def test_a_bad_config_json_beside_the_checkpoint(ckpt, config, message, tmp_path, capsys):
    (ckpt.parent / "config.json").write_text(config)
    for argv in (["extract", "--module", str(ckpt), "--layer", "0", "--head", "0"],
                 ["heads", str(ckpt), "--layer", "0", "--head", "0", "--out",
                  str(tmp_path / "h.npz")]):
        status, line = run(argv, capsys)
        assert status == 2 and message in line and "config.json" in line, line


def test_heads_and_extract_module_agree_on_usage_errors(ckpt, tmp_path, capsys):
    out = str(tmp_path / "h.npz")
    # a layer out of range
    for argv in (["extract", "--module", str(ckpt), "--layer", "5", "--head", "0"],
                 ["heads", str(ckpt), "--layer", "5", "--head", "0", "--out", out]):
        status, line = run(argv, capsys)
        assert status == 2 and "layer must be in [0, 2)" in line
    # a corrupt checkpoint
    bad = tmp_path / "m" / "bad.safetensors"
    bad.write_bytes(b"\x00" * 7 + os.urandom(100))
    for argv in (["extract", "--module", str(bad), "--layer", "0", "--head", "0"],
                 ["heads", str(bad), "--layer", "0", "--head", "0", "--out", out]):
        status, line = run(argv, capsys)
        assert status == 2 and "is not a readable safetensors file" in line
    # a checkpoint that does not exist, and a folder
    for path, message in ((tmp_path / "none.safetensors", "does not exist"),
                          (tmp_path, "is a folder")):
        status, line = run(["heads", str(path), "--layer", "0", "--head", "0", "--out", out],
                           capsys)
        assert status == 2 and message in line


@pytest.mark.parametrize("d", ["99999999999999999999", str(2 ** 63)])
def test_a_token_dimension_too_large(d, capsys, counting):
    status, line = run(["extract", "--oracle", "tests.fixtures:head8", "--d", d], capsys)
    assert status == 2 and "argument --d: must be <=" in line and counting.calls == 0


def test_a_complex_head_file_is_refused(tmp_path, capsys):
    import warnings

    path = tmp_path / "complex.npz"
    np.savez(path, v=HEAD8.v, W=HEAD8.W + 1j * np.eye(8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ComplexWarning meant the imaginary part was dropped
        status, line = run(["extract", "--model", str(path)], capsys)
    assert status == 2 and "complex" in line and "is not a head file" in line


def test_random_bytes_are_not_called_pickled(tmp_path, capsys):
    path = tmp_path / "random.npz"
    path.write_bytes(np.random.default_rng(0).bytes(512))
    status, line = run(["extract", "--model", str(path)], capsys)
    assert status == 2 and "is not a head file" in line
    assert "pickle" not in line and "neither an .npz archive nor an .npy array" in line


def test_info_with_a_config_that_does_not_exist(tmp_path, capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    status, line = run(["info", "--config", str(tmp_path / "missing.yaml")], capsys)
    assert status == 2 and "does not exist" in line
    # without --config, a missing default config/config.yaml is only noted
    monkeypatch.chdir(tmp_path)
    assert main(["info", "--json"]) == 0
    assert "not found" in json.loads(capsys.readouterr().out)["config"]


def test_a_folder_named_like_a_python_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").mkdir()
    status, line = run(["extract", "--oracle", "x.py:f", "--d", "4"], capsys)
    assert status == 2 and "is a folder" in line and "does not exist" not in line
    status, line = run(["extract", "--oracle", "y.py:f", "--d", "4"], capsys)
    assert status == 2 and "does not exist" in line


def test_boolean_answers_are_refused(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    status, line = run(["extract", "--oracle", "tests.fixtures:boolean_head8", "--d", "8"],
                       capsys)
    assert status == 1 and "boolean" in line and "(AnswerError)" in line
    X = np.random.default_rng(0).standard_normal((3, 2, 4))
    for answer in (np.array([True, False, True]), [True, False, True],
                   np.array([True, 0.5, 1.0], dtype=object)):
        with pytest.raises(AnswerError, match="boolean"):
            ValueOracle(lambda X, a=answer: a, 4)(X)
    # integers and floats stay answers
    assert ValueOracle(lambda X: np.array([1, 0, 2]), 4)(X).tolist() == [1.0, 0.0, 2.0]


def test_a_head_file_saved_right_still_loads(tmp_path, capsys):
    save_head(tmp_path / "h.npz", HEAD8)
    assert main(["extract", "--model", str(tmp_path / "h.npz"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rel_err_W"] < 1e-10


def test_out_of_memory_is_one_line(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)

    def no_memory(spec):
        raise MemoryError("Unable to allocate 74.5 GiB for an array with shape (100000, 100000)")

    monkeypatch.setattr("attnquery.cli.extract.run_extraction", no_memory)
    status, line = run(BOX, capsys)
    assert status == 1 and "out of memory (Unable to allocate 74.5 GiB" in line
    assert line.endswith("(MemoryError)")


def _zip_of_text(path):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "not an array")


@pytest.mark.parametrize("make, message", [
    (lambda p: np.savez(p, v=np.float64(3.0), W=np.eye(1)), "'v' must be a vector"),
    (lambda p: np.savez(p, v=np.ones((2, 2, 2)), W=np.eye(2)), "'v' must be a vector"),
    (lambda p: np.savez(p, v=np.ones(4), W=np.eye(4), meta_x=np.ones(3)),
     "metadata 'x' is not a single value"),
    (_zip_of_text, "member 'hello.txt' is not an .npy array"),
], ids=["scalar v", "3-d v", "array metadata", "zip of text"])
def test_head_files_of_the_wrong_make(make, message, tmp_path, capsys):
    path = tmp_path / "bad.npz"
    make(path)
    status, line = run(["extract", "--model", str(path)], capsys)
    assert status == 2 and message in line, line


def test_a_box_module_cancelled_at_import(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cancelled.py").write_text("import asyncio\nraise asyncio.CancelledError('x')\n")
    status, line = run(["extract", "--oracle", "cancelled.py:f", "--d", "4"], capsys)
    assert status == 2 and "importing cancelled.py failed: CancelledError" in line


def test_save_head_never_replaces_what_is_not_a_regular_file(tmp_path):
    from attnquery.errors import ModelError

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match="exists and is not a regular file"):
        save_head(fifo, HEAD8)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    save_head(tmp_path / "h.npz", HEAD8)  # a new file, then a regular file, are written
    save_head(tmp_path / "h.npz", HEAD8)


def test_an_exception_without_a_printable_message(capsys, monkeypatch, repo):
    monkeypatch.chdir(repo)
    status, line = run(["extract", "--oracle", "tests.fixtures:unprintable_head", "--d", "8"],
                       capsys)
    assert status == 1 and "the black box raised _Unprintable" in line
    assert "(message unprintable: ValueError)" in line and "(OracleFailure)" in line


def test_out_never_replaces_an_input(ckpt, tmp_path, capsys, monkeypatch, repo):
    before = ckpt.read_bytes()
    status, line = run(["heads", str(ckpt), "--layer", "0", "--head", "0", "--out", str(ckpt)],
                       capsys)
    assert status == 2 and "is the input" in line
    status, line = run(["extract", "--module", str(ckpt), "--layer", "0", "--head", "0",
                        "--out", str(ckpt)], capsys)
    assert status == 2 and "is the input" in line
    assert ckpt.read_bytes() == before
    head = tmp_path / "h.npz"
    save_head(head, HEAD8)
    (tmp_path / "link.npz").symlink_to(head)
    status, line = run(["extract", "--model", str(head), "--out", str(tmp_path / "link.npz")],
                       capsys)
    assert status == 2 and "is the input" in line
    box = tmp_path / "box.py"
    box.write_text("from tests.fixtures import head8\n")
    monkeypatch.chdir(repo)
    status, line = run(["extract", "--oracle", f"{box}:head8", "--d", "8", "--out", str(box)],
                       capsys)
    assert status == 2 and "is the input" in line and box.read_text().startswith("from")


class _Unblocker:
    """Opens a FIFO for writing and closes it, again and again, for a few seconds, so that a
    reader stuck on it (the bug: reading an input that is a FIFO blocks forever) gets an end of
    file instead of hanging the test."""

    def __init__(self, fifo, seconds=4.0):
        import threading

        self.fifo, self.seconds = fifo, seconds
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import errno
        import time

        end = time.monotonic() + self.seconds
        while time.monotonic() < end and not self.done.is_set():
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
                time.sleep(0.05)
                continue
            os.close(fd)
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def test_inputs_that_are_fifos_are_refused_not_read(ckpt, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    cases = [(["extract", "--model", str(fifo)], "not a regular file"),
             (["extract", "--module", str(fifo), "--layer", "0"], "not a regular file"),
             (["heads", str(fifo), "--layer", "0", "--head", "0", "--out",
               str(tmp_path / "h.npz")], "not a regular file"),
             (["info", "--config", str(fifo)], "not a regular file"),
             (["validate", str(tmp_path), "--config", str(fifo)], "not a regular file")]
    with _Unblocker(fifo):
        for argv, message in cases:
            status, line = run(argv, capsys)
            assert status == 2 and message in line and "FIFO" in line, line
    (ckpt.parent / "config.json").unlink()
    os.mkfifo(ckpt.parent / "config.json")
    with _Unblocker(ckpt.parent / "config.json"):
        status, line = run(["extract", "--module", str(ckpt), "--layer", "0"], capsys)
    assert status == 2 and "config.json is not a regular file" in line
