"""The dashboard reads the names the contract and the API define (no browser needed)."""

from __future__ import annotations

import re
from typing import get_args

from api.models import EventType
from tests.conftest import ROOT
from trainer.contract.records import CONTROL_EVENT_TYPES, EVENT_TYPES, RECORD_KINDS

STATIC = ROOT / "web" / "static"
QUOTED = re.compile(r"'([a-z_]+)'")


def lines_of(name: str) -> list[str]:
    return (STATIC / name).read_text().splitlines()


def test_the_stream_types_the_page_listens_to_are_the_apis() -> None:
    declared = next(line for line in lines_of("job.js") if "const STREAM_TYPES" in line)
    assert set(QUOTED.findall(declared)) == set(get_args(EventType))


COMPARED_KIND = re.compile(r"data\.kind [!=]== '([a-z_]+)'")
COMPARED_TYPE = re.compile(r"(?:data\.type|tag) [!=]== '([a-z_]+)'")
LISTED_TYPES = re.compile(r"\[([^\]]*)\]\.includes\((?:tag|data\.type)\)")


def test_every_record_kind_and_event_type_the_page_compares_exists() -> None:
    kinds, types = set(), set()
    for name in ("job.js", "timeline.js", "charts.js", "pods.js"):
        lines = lines_of(name)
        for number, line in enumerate(lines):
            kinds |= set(COMPARED_KIND.findall(line))
            types |= set(COMPARED_TYPE.findall(line))
            for listed in LISTED_TYPES.findall(line):
                types |= set(QUOTED.findall(listed))
            if "function rejoinType" in line:  # the event that marks a rejoin, per mode
                types |= set(QUOTED.findall(lines[number + 1].split("?", 1)[1]))
    assert {"eval", "metric"} <= kinds and {"healed", "resumed", "quorum"} <= types
    # Membership changes: the pods' own (left, joined) and the control plane's (scaled, ...).
    assert {"scaled", "left", "joined", "migrated", "migration_failed"} <= types
    assert kinds <= set(RECORD_KINDS), kinds - set(RECORD_KINDS)
    known = set(EVENT_TYPES) | set(CONTROL_EVENT_TYPES)
    assert types <= known, types - known


def test_the_history_reads_every_stream_type_but_sample_ids() -> None:
    declared = next(line for line in lines_of("history.js") if "const HISTORY_TYPES" in line)
    assert set(QUOTED.findall(declared)) == set(get_args(EventType)) - {"samples"}
