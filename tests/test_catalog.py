"""The catalog keeps the contract: every rule id, a runbook per rule and a rule per runbook."""

from __future__ import annotations

import re
from pathlib import Path

from fleetscope.rules.catalog import CATALOG, RULE_IDS

RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"
SECTIONS = ("## What it means", "## Confirm by hand", "## Fix", "## Verify the fix")


def test_every_contract_rule_is_in_the_catalog_once():
    ids = [rule.id for rule in CATALOG]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(RULE_IDS)


def test_every_rule_has_a_runbook_and_every_runbook_a_rule():
    runbooks = {path.stem for path in RUNBOOKS.glob("*.md") if path.stem != "README"}
    assert runbooks == set(RULE_IDS)
    for rule_id in RULE_IDS:
        text = (RUNBOOKS / f"{rule_id}.md").read_text()
        assert text.startswith(f"# {rule_id}\n")
        for section in SECTIONS:
            assert section in text, (rule_id, section)
        for link in re.findall(r"\]\(([a-z-]+\.md)\)", text):
            assert (RUNBOOKS / link).exists(), (rule_id, link)


def test_rules_have_what_an_on_call_engineer_needs():
    for rule in CATALOG:
        assert rule.severity in ("critical", "warning", "info")
        assert rule.symptom and rule.cause and rule.action and rule.summary
        assert rule.evidence, rule.id
        assert 0 < rule.confidence < 1
        assert rule.condition.metrics(), rule.id
