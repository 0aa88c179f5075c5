"""`make demo` keeps the previous demo's database unless asked to start fresh, and says which."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.demo import keep_or_clear


def previous_demo(root: Path) -> Path:
    demo = root / ".demo"
    (demo / "jobs" / "restart" / "logs").mkdir(parents=True)
    (demo / "jobs" / "restart" / "logs" / "rank0.jsonl").write_text("{}\n")
    (demo / "spool").mkdir()
    (demo / "goodput.db").write_bytes(b"runs of the last demo")
    return demo


def test_a_second_demo_keeps_the_database_and_says_how_to_start_fresh(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    demo = keep_or_clear(previous_demo(tmp_path), fresh=False)
    assert (demo / "goodput.db").read_bytes() == b"runs of the last demo"
    assert not (demo / "jobs").exists() and not (demo / "spool").exists()  # the old jobs' logs would be read again
    said = capsys.readouterr().out
    assert f"keeping the previous demo's runs in {demo / 'goodput.db'}" in said and "make demo FRESH=1" in said


def test_fresh_deletes_the_previous_demo_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = keep_or_clear(previous_demo(tmp_path), fresh=True)
    assert demo.is_dir() and list(demo.iterdir()) == []
    assert f"--fresh: deleting the previous demo in {demo}" in capsys.readouterr().out


def test_a_first_demo_says_nothing_of_a_previous_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert keep_or_clear(tmp_path / "new", fresh=False).is_dir()
    assert capsys.readouterr().out == ""
