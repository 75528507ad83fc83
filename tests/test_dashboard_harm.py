"""The console's harm frames (dashboard/harm_frames.py): what the Node page leads with and
what the Fleet page counts, from a diagnosis document's `harm` and `findings` as the report
reads them (diagnose/harm_lines.py)."""

from __future__ import annotations

from fleetscope.core import units
from fleetscope.dashboard import harm_frames
from fleetscope.diagnose.harm_lines import harm_count, pool_harms

SINCE = 1_764_660_000.0  # 07:20:00 UTC


def _finding(rule: str, node: str, severity: str = "critical", phase: str = "ongoing",
             explains: tuple[str, ...] = ()) -> dict:
    return {"rule": rule, "node": node, "severity": severity, "phase": phase,
            "summary": f"{rule} summary", "explains": list(explains)}


def _harm(node: str, pool: str, explained_by: tuple[str, ...] = (), value: float = 1.1,
          title: str = "online sessions' P99") -> dict:
    return {"pool": pool, "node": node, "signal": "online_session_p99_seconds",
            "title": title, "unit": "s", "value": value, "target": 1.0, "since": SINCE,
            "explained_by": list(explained_by)}


FINDINGS = [
    _finding("offline-preemption", "a", "warning", explains=("chat-online",)),
    _finding("crash-loop", "b", explains=("chat-online",)),
    _finding("unexplained-harm", "c", "warning"),
    _finding("oom-kill", "a", "warning", phase="ended"),
    _finding("cpu-throttling", "a", "info"),
]
HARM = [
    _harm("a", "chat-online", ("offline-preemption",)),
    _harm("a", "chat-online", ("offline-preemption",), 0.38, "online processes' wait for a CPU"),
    _harm("b", "chat-online", ("crash-loop",)),
    _harm("c", "codegen-online", value=12.0),
]


def test_a_nodes_harm_reads_as_the_report_leads_with_it(monkeypatch):
    monkeypatch.setenv(units.TIME_ZONE_ENV, "UTC")
    (harm,) = harm_frames.node_harm(FINDINGS, HARM, "a")
    assert harm.pool == "chat-online"
    assert harm.head == ("pool chat-online: online sessions' P99 1.1 s (target 1 s); online "
                         "processes' wait for a CPU 380 ms (target 1 s) since 07:20:00 UTC")
    assert harm.causes == [{"rule": "offline-preemption", "severity": "warning",
                            "summary": "offline-preemption summary"}]
    # the report's words for the same document
    (entry,) = [e for e in pool_harms({"findings": FINDINGS, "harm": HARM}) if e.node == "a"]
    assert harm.head == entry.head(with_node=False) and harm.cause == entry.cause()


def test_harm_no_rule_explains_says_so():
    (harm,) = harm_frames.node_harm(FINDINGS, HARM, "c")
    assert harm.causes == []
    assert harm.cause.startswith("no rule explains it")


def test_a_node_without_harm_or_a_source_without_it_has_none():
    assert harm_frames.node_harm(FINDINGS, HARM, "d") == []
    assert harm_frames.node_harm(FINDINGS, None, "a") == []
    assert harm_frames.fleet_count(FINDINGS, []) is None
    assert harm_frames.harm_table(FINDINGS, None).empty


def test_the_fleet_count_is_the_reports_count_over_the_nodes_shown():
    count = harm_frames.fleet_count(FINDINGS, HARM)
    assert count == harm_count(pool_harms({"findings": FINDINGS, "harm": HARM}))
    assert count.text() == ("3 pools on 3 nodes over their targets; explained: "
                            "offline-preemption 1, crash-loop 1; 1 unexplained")
    narrowed = harm_frames.fleet_count(FINDINGS, HARM, {"a", "b"})
    assert narrowed.text() == ("2 pools on 2 nodes over their targets; explained: "
                               "offline-preemption 1, crash-loop 1")
    assert narrowed.unexplained == 0


def test_the_harm_table_has_a_row_per_hurting_pool_explained_first():
    table = harm_frames.harm_table(FINDINGS, HARM)
    assert list(table.columns) == harm_frames.HARM_COLUMNS
    assert list(table["node"]) == ["a", "b", "c"]  # in the order of the findings explaining
    assert list(table["explained by"]) == ["offline-preemption", "crash-loop",
                                           harm_frames.UNEXPLAINED]
    assert table["harm"].iloc[2].startswith("online sessions' P99 12 s (target 1 s) since ")


def test_ongoing_findings_come_before_ended_events_and_info_last():
    mine = [FINDINGS[4], FINDINGS[3], FINDINGS[0]]
    ordered = harm_frames.ongoing_first(mine)
    assert [f["rule"] for f in ordered] == ["offline-preemption", "oom-kill", "cpu-throttling"]
    assert harm_frames.ended(FINDINGS[3]) and not harm_frames.ended(FINDINGS[0])
