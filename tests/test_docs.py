"""The documentation site: its reference pages say what the code does, and it builds with no broken link."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import docs_reference
from tests.test_cli import REPO


def test_the_reference_pages_are_the_code_s_settings_events_api_cli_and_metrics(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert docs_reference.main(["--check"]) == 0, capsys.readouterr().out


def test_every_goodput_variable_in_the_code_has_a_row_in_the_settings_reference() -> None:
    in_code = docs_reference.variables_in_code()
    page = (REPO / "docs" / "reference" / "settings.md").read_text()
    missing = {name: files for name, files in in_code.items() if f"`{name}`" not in page}
    assert "GOODPUT_URL" in in_code and "GOODPUT_DATABASE_URL" in in_code
    assert not missing, f"variables with no row in docs/reference/settings.md: {missing}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_snippet_that_torchrun_runs_is_the_readmes_own() -> None:
    """tests/torchrun/test_readme_snippet.py runs readme_snippet.py under torchrun; its marked part is the README's."""
    readme = (REPO / "README.md").read_text()
    snippet = (REPO / "tests" / "torchrun" / "readme_snippet.py").read_text()
    marked = snippet.split("# -- the snippet, as the README writes it", 1)[1].split("\n", 1)[1]
    marked = marked.split("# ----", 1)[0]
    blocks = [b for b in _python_blocks(readme) if "tracker = goodput.init()" in b]
    assert blocks, "the README has no torchrun snippet"
    assert blocks[0].split("import ingest_client as goodput\n\n", 1)[-1].strip() == marked.strip()
