"""Where the runbooks are: `runbooks/<rule id>.md`, shipped inside the package.

    site-packages/fleetscope/runbooks/isa-mismatch.md    (a wheel install)
    <checkout>/runbooks/isa-mismatch.md                 (a checkout, or an editable install)

A finding's `runbook` field stays the repository-relative name; `runbook_path` beside it
is the file on this machine, and `fleetscope runbook RULE` prints it.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # the fleetscope package directory


def runbook_dir() -> Path:
    """The installed runbooks (the wheel puts them in the package), else the checkout's."""
    installed = _PACKAGE / "runbooks"
    return installed if installed.is_dir() else _PACKAGE.parent / "runbooks"


def runbook_path(rule_id: str) -> Path | None:
    """The runbook file of a rule on this machine, None when it is not here."""
    path = runbook_dir() / f"{rule_id}.md"
    return path if path.is_file() else None
