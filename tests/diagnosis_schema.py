"""The diagnosis JSON schema (docs/diagnosis-json.md) with its rule-id enum filled from the rule
registry at call time, so a rule registered later (a new module, or a throwaway rule in a
test) is accepted and an unknown id is not, with no edit of schemas/diagnosis.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

from fleetscope.rules.catalog import RULE_IDS

SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "diagnosis.schema.json"


def diagnosis_schema() -> dict:
    schema = json.loads(SCHEMA_FILE.read_text())
    rule = schema["properties"]["findings"]["items"]["properties"]["rule"]
    rule.pop("$comment", None)
    rule["enum"] = list(RULE_IDS)
    return schema
