"""One hang threshold, stated the same in the code and the docs: the settings' default, the live rule's default and
every page that gives the figure (README, docs/ledger.md, docs/guides/act.md) agree."""

from __future__ import annotations

import re
from pathlib import Path

from services import presentation as fmt
from services.analysis.live import LiveConfig
from services.settings import LiveSettings

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/ledger.md", "docs/guides/act.md", "docs/guides/dashboard.md", "docs/index.md")


def test_the_hang_floor_is_one_figure_in_code_and_docs() -> None:
    floor = LiveSettings.model_fields["hang_floor_s"].default
    factor = LiveSettings.model_fields["hang_step_factor"].default
    assert (LiveConfig().floor_s, LiveConfig().step_factor) == (floor, factor)  # the rule's defaults are the settings'
    stated = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        stated += [(page, m) for m in re.findall(r"GOODPUT_HANG_FLOOR_S`?,? \(?(?:default )?(\d+ s)", text)]
        # a hang threshold said in minutes ("at least a minute") would contradict the 30 s floor
        assert not re.search(r"hung?\w* (?:after|needs|once)[^.]{0,40}(?:a|one) minute", text, re.I), page
    assert stated and all(said == fmt.duration(floor) for _, said in stated), stated
