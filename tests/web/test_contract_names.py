"""The dashboard's contract names: generated from the Python contract (api/web_contract.py) into
web/static/contract.js, and never spelled by the page's modules themselves (no browser needed).
That the checked-in module is what the contract generates is tests/api/test_docs.py's."""

from __future__ import annotations

from typing import get_args

import pytest

from api import docs, web_contract
from api.models import EventType, JobStatus
from tests.conftest import ROOT
from trainer.contract.records import CONTROL_EVENT_TYPES, EVENT_TYPES, RECORD_KINDS

STATIC = ROOT / "web" / "static"
# The spec's choices are left out: the page has words of its own that are theirs too (its
# stream's `live` state, a pod's `restart` tag).
SPEC_CHOICES = ("FAULT_TOLERANCE", "PARALLELISM")


def test_the_module_holds_every_name_the_api_and_the_pods_send() -> None:
    groups = {name: set(values) for name, (_, values) in web_contract.GROUPS.items()}
    assert groups["STREAM"] == set(get_args(EventType))
    assert groups["KIND"] == set(RECORD_KINDS)
    assert groups["EVENT"] == {*EVENT_TYPES, *CONTROL_EVENT_TYPES}
    assert groups["JOB_STATUS"] == set(JobStatus)
    assert {"Running", "Failed", "Removed"} <= groups["POD_PHASE"]
    module = web_contract.render(docs.COMMAND)
    assert "export const EVENT = names('EVENT', ['started', " in module
    assert ("export const FINISHED = Object.freeze([JOB_STATUS.succeeded, JOB_STATUS.failed, "
            "JOB_STATUS.cancelled]);") in module


def test_a_name_the_page_could_not_read_as_a_property_is_refused() -> None:
    with pytest.raises(ValueError, match="migration-failed"):
        web_contract.render(docs.COMMAND, {"EVENT": ("A job event's type.",
                                                     ("migrated", "migration-failed"))})


def test_the_page_spells_no_contract_name_as_a_string_of_its_own() -> None:
    """`EVENT.healed`, never `'healed'`: a misspelled import or property fails where it is
    read (the tables throw on unknown names), a misspelled string would never match."""
    names = {str(value) for group, (_, values) in web_contract.GROUPS.items()
             if group not in SPEC_CHOICES for value in values}
    modules = [path for path in sorted(STATIC.glob("*.js")) if path.name != "contract.js"]
    assert len(modules) >= 10
    spelled = [f"{path.name}:{number}: {name}" for path in modules
               for number, line in enumerate(path.read_text().splitlines(), 1)
               for name in sorted(names) if f"'{name}'" in line or f'"{name}"' in line]
    assert spelled == [], "import these names from contract.js"
