"""Result rows, the Parquet schema, atomic writes and the cell runner."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from attnquery.errors import ConfigError
from attnquery.experiments import (
    Experiment,
    cell_id,
    cell_rng,
    expand_cells,
    n_shards,
    register,
    run_cells,
    shard_cells,
)
from attnquery.results import (
    RESULT_SCHEMA,
    SCHEMA_VERSION,
    make_row,
    read_results,
    write_rows,
)


def _boom(cell, rng):
    if cell["d"] == 2:
        raise RuntimeError("solver exploded")
    if cell["d"] == 3:
        from attnquery.errors import NotIdentifiableError

        raise NotIdentifiableError("v = 0")
    if cell["d"] == 4:
        import time

        time.sleep(5)
    return {"n_queries": cell["d"], "rel_err_W": float(rng.random()), "success": True}


register(Experiment("_test_faults", lambda cfg: [{"learner": "x", "d": d, "seed": 0}
                                                 for d in cfg["d"]], _boom))


def test_cell_id_is_stable_and_order_free():
    a = {"experiment": "e", "d": 3, "learner": "x", "seed": 1}
    b = {"seed": 1, "learner": "x", "d": 3, "experiment": "e"}
    assert cell_id(a) == cell_id(b) == cell_id({**a, "cell_id": "ignored"})
    assert cell_id(a) != cell_id({**a, "seed": 2})


def test_cell_rng_depends_only_on_the_cell_and_the_study_seed():
    c = expand_cells("_test_faults", {"d": [1, 5]})
    c_more = expand_cells("_test_faults", {"d": [7, 1, 9, 5]})
    same = [x for x in c_more if x["d"] == 5][0]
    assert cell_rng(c[1] if c[1]["d"] == 5 else c[0], 1).random() == cell_rng(same, 1).random()
    assert cell_rng(same, 1).random() != cell_rng(same, 2).random()


def test_every_cell_becomes_a_row_whatever_happens(tmp_path):
    cells = expand_cells("_test_faults", {"d": [1, 2, 3, 4]})
    rows, timings = run_cells(cells, 0, time_limit=0.5)
    status = {r["d"]: r["status"] for r in rows}
    assert status == {1: "ok", 2: "error", 3: "not_identifiable", 4: "timeout"}
    msg = {r["d"]: r["message"] for r in rows}
    assert "solver exploded" in msg[2] and "time limit" in msg[4]
    assert all(t["wall_time_s"] >= 0 for t in timings)
    write_rows(rows, timings, tmp_path / "r.parquet", tmp_path / "r.timing.parquet")
    table = pq.read_table(tmp_path / "r.parquet")
    assert table.schema.equals(RESULT_SCHEMA, check_metadata=True)
    assert table.num_rows == 4
    df = read_results(tmp_path / "r.parquet", with_timing=True)
    assert set(df["status"]) == {"ok", "error", "not_identifiable", "timeout"}
    assert df["wall_time_s"].notna().all()
    assert (df["schema_version"] == SCHEMA_VERSION).all()


def test_identical_rows_give_identical_bytes(tmp_path):
    cells = expand_cells("_test_faults", {"d": [1, 5, 6]})
    for k in range(2):
        rows, timings = run_cells(cells, 3)
        write_rows(rows, timings, tmp_path / f"{k}.parquet", tmp_path / f"{k}.timing.parquet")
    assert (tmp_path / "0.parquet").read_bytes() == (tmp_path / "1.parquet").read_bytes()


def test_unknown_columns_are_refused():
    cell = {"experiment": "e", "cell_id": "0", "learner": "x", "seed": 0}
    with pytest.raises(ConfigError, match="'colour' of experiment 'e' is not a result column"):
        make_row({**cell, "colour": "red"}, {}, "ok")
    with pytest.raises(ConfigError, match="'accuracy' of experiment 'e' is not a result column"):
        make_row(cell, {"accuracy": 1.0}, "ok")
    with pytest.raises(ConfigError, match="status"):
        make_row(cell, {}, "fine")


def test_shards_partition_the_cells():
    cells = expand_cells("_test_faults", {"d": list(range(1, 12))})
    k = n_shards(len(cells), 3)
    parts = [shard_cells(cells, i, k) for i in range(k)]
    ids = [c["cell_id"] for p in parts for c in p]
    assert k == 4 and sorted(ids) == sorted(c["cell_id"] for c in cells)
    assert len(ids) == len(set(ids))


def test_empty_grid_is_an_error():
    with pytest.raises(ConfigError, match="empty"):
        expand_cells("_test_faults", {"d": []})


def test_exact_cell_runs_and_measures(tmp_path):
    cells = [c for c in expand_cells("exact", {"d": [8], "probes": ["basis"], "seeds": 1,
                                               "W_spectral": [None], "zero_frac": [0.25]})]
    rows, _ = run_cells(cells, 0)
    (row,) = rows
    assert row["status"] == "ok" and row["n_queries"] == 72 and row["success"]
    assert row["rel_err_W"] <= 1e-10 and np.isfinite(row["func_err"])


def test_atomic_writes_flush_the_file_and_its_folder(tmp_path, monkeypatch):
    import os
    import stat

    from attnquery.results import atomic_write_bytes

    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    target = tmp_path / "sub" / "t.bin"
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert synced == [False, True]  # the temporary file, then the folder after the rename


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    import errno
    import os

    from attnquery.results import atomic_path

    target = tmp_path / "t.bin"
    target.write_bytes(b"old")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)  # the data cannot reach the disk
    with pytest.raises(OSError, match="No space"), atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_check_writable_names_the_problem(tmp_path):
    from attnquery.results import check_writable

    with pytest.raises(IsADirectoryError):
        check_writable(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a folder"):
        check_writable(tmp_path / "f" / "deeper" / "out.npz")
    (tmp_path / "nowhere").symlink_to(tmp_path / "missing")
    with pytest.raises(NotADirectoryError, match="nowhere is not a folder"):
        check_writable(tmp_path / "nowhere" / "out.npz")
    before = sorted(tmp_path.iterdir())
    assert check_writable(tmp_path / "new" / "a" / "out.npz") == tmp_path / "new" / "a" / "out.npz"
    assert check_writable(tmp_path / "out.npz") == tmp_path / "out.npz"
    assert sorted(tmp_path.iterdir()) == before  # nothing created: no folder, no probe left


def test_check_writable_names_the_folder_it_cannot_write(tmp_path, monkeypatch):
    import errno
    import tempfile

    from attnquery.results import check_writable

    def denied(prefix, suffix, dir):
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}x1y2{suffix}")

    for probe in ("mkstemp", "mkdtemp"):  # the folder itself; the folder above a new one
        monkeypatch.setattr(tempfile, probe, denied)
    for out in (tmp_path / "h.npz", tmp_path / "new" / "h.npz"):
        with pytest.raises(PermissionError) as info:
            check_writable(out)
        assert info.value.filename == str(tmp_path)
