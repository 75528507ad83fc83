"""Rules evaluated on a real Prometheus and a real VictoriaMetrics find exactly what the
in-process engine finds on the same data, for every rule.

A small simulated fleet (bench/fleet_prometheus.py: the exporter's collectors replaying the
scenario bundles, every rule's fault on known nodes, two CPU steppings) is loaded into both
engines on 127.0.0.1. `fleetscope diagnose --prometheus URL --fleet` (engine-side) is
compared with the old path (every series fetched, rules in Python) on each engine, and with
what the in-process engine finds on one node of each profile.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fleetscope.diagnose import engine, remote
from fleetscope.diagnose.prometheus import prometheus_series
from fleetscope.rules.catalog import CATALOG
from tests.conftest import ENGINE_FLEET_NODES, ENGINE_FLEET_SECONDS, until_alerts_held

REPO = Path(__file__).resolve().parent.parent
SECONDS = ENGINE_FLEET_SECONDS
NODES = ENGINE_FLEET_NODES


@pytest.fixture(scope="module")
def fleet(engine_fleet):
    return engine_fleet


def _diagnose(url: str) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--prometheus",
                             url, "--fleet", "--json"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    return result.returncode, json.loads(result.stdout)


def _keyed(findings: list[dict]) -> set[tuple[str, str, str]]:
    return {(f["rule"], f["node"], f["severity"]) for f in findings}


def _in_process(url: str, at: float, monkeypatch) -> list[dict]:
    """The old path (every series fetched, rules in Python) over the window ending at `at`."""
    from fleetscope.diagnose import prometheus

    class _Clock:  # the old path reads the window's end from the wall clock
        monotonic = staticmethod(time.monotonic)  # its deadline stays real

        @staticmethod
        def time() -> float:
            return at

    monkeypatch.setattr(prometheus, "time", _Clock)
    # The old path fetched the conditions' metrics only; evidence-only ones too here, so
    # both sides have the same evidence to show.
    metrics = set().union(*(rule.requires() for rule in CATALOG),
                          *(item.expr.metrics() for rule in CATALOG for item in rule.evidence))
    series, _ = prometheus_series(url, metrics, SECONDS, None, timeout=120)
    findings, _ = engine.evaluate(series, "?")
    return [f.to_json() for f in findings]


def _reads_before(expr, seconds: float) -> bool:
    """Whether a range in `expr` is longer than `seconds`."""
    from dataclasses import fields, is_dataclass

    from fleetscope.rules.promql import Rate

    if isinstance(expr, Rate):
        return expr.window_seconds > seconds
    return is_dataclass(expr) and any(_reads_before(getattr(expr, f.name), seconds)
                                      for f in fields(expr))


@pytest.mark.parametrize("name", ["prometheus", "victoriametrics"])
def test_engine_side_finds_what_the_in_process_engine_finds(fleet, name, monkeypatch):
    url = fleet["engines"][name].url
    code, document = _diagnose(url)
    # The same window on both sides, a minute back (VictoriaMetrics hides its newest 30 s).
    at = time.time() // 15 * 15 - 60
    answer = remote.diagnose_remote(url, SECONDS, now=at, settle_seconds=0, recorded=False)
    assert answer.stats.terms_recorded == 0 and answer.stats.terms_computed > 0
    # The in-process engine on the raw samples (read back from Prometheus: VictoriaMetrics
    # resamples a range query of a raw series onto its own step, the engine's input then
    # differs from the samples stored).
    in_process = _in_process(fleet["engines"]["prometheus"].url, at, monkeypatch)
    ours = [f.to_json() for f in answer.findings]
    assert _keyed(ours) == _keyed(in_process) == _keyed(document["findings"])
    # Fed through either engine's range queries, the old path finds the same nodes.
    assert _keyed(_in_process(url, at, monkeypatch)) == _keyed(in_process)
    # ...and that is each node's injected fault, nothing on the healthy nodes.
    assert fleet["bench"].check(document, fleet["nodes"]) == []
    assert {f["rule"] for f in document["findings"]} == {rule.id for rule in CATALOG}
    assert code == 2 and document["status"] == "critical"
    # The same evidence values: the engine computes what Python computed.
    ours = {(f["rule"], f["node"]): f["evidence"] for f in ours}
    theirs = {(f["rule"], f["node"]): f["evidence"] for f in in_process}
    rules = {rule.id: rule for rule in CATALOG}
    for key, evidence in ours.items():
        assert [e["signal"] for e in evidence] == [e["signal"] for e in theirs[key]], key
        items = {item.signal: item for item in rules[key[0]].evidence}
        for a, b in zip(evidence, theirs[key], strict=True):  # a row without a value is left out
            if _reads_before(items[a["signal"]].expr, SECONDS):
                continue  # an event look-back (15 min) reaches past the samples fetched here
            assert a["value"] == pytest.approx(b["value"], rel=1e-6, abs=1e-9), key
    assert document["query_engine"]["queries"] > 0


def test_the_diagnosis_reads_the_terms_the_engine_records(fleet):
    """Where `rules export` is loaded (the session's Prometheus evaluates it), the engine
    records the conditions' terms and the diagnosis reads them instead of computing them:
    each node's injected fault, nothing else, as when computed; only the bare selectors
    (and ALERTS) are still read as they are. VictoriaMetrics has no rules API of its own:
    everything computed there."""
    from fleetscope.diagnose import terms
    from fleetscope.rules.harm import POOL_HARMS
    from fleetscope.rules.terms import catalog_terms

    # The recorded terms must cover the window and its settling before they are read.
    remaining = fleet["started"] + SECONDS + remote.SETTLE_SECONDS + 30 - time.time()
    if remaining > 0:
        time.sleep(remaining)
    url = fleet["engines"]["prometheus"].url
    at = time.time()
    computed = remote.diagnose_remote(url, SECONDS, now=at, recorded=False)
    read = remote.diagnose_remote(url, SECONDS, now=at)
    conditions = [level.condition for rule in CATALOG for level in rule.levels()]
    every = {t.promql() for c in conditions + list(POOL_HARMS) for t in terms.terms(c)}
    recordable = len(catalog_terms(conditions + list(POOL_HARMS)))
    assert read.stats.terms_recorded == recordable
    assert read.stats.terms_computed == len(every) - recordable
    keyed = {(f.rule.id, f.node, f.severity) for f in read.findings}
    assert keyed == {(f.rule.id, f.node, f.severity) for f in computed.findings}
    document = {"findings": [f.to_json() for f in read.findings]}
    assert fleet["bench"].check(document, fleet["nodes"]) == []
    victoria = remote.diagnose_remote(fleet["engines"]["victoriametrics"].url, SECONDS)
    assert victoria.stats.terms_recorded == 0


def test_both_engines_agree_and_answer_with_the_findings_only(fleet):
    documents = {name: _diagnose(e.url)[1] for name, e in fleet["engines"].items()}
    prometheus, victoria = documents["prometheus"], documents["victoriametrics"]
    assert _keyed(prometheus["findings"]) == _keyed(victoria["findings"])
    assert prometheus["fleet_findings"] == victoria["fleet_findings"]
    assert len(prometheus["nodes"]) == NODES
    # Answer size follows what the terms keep, not the fleet's samples: a term that holds
    # on most nodes (an idle CPU beside a busy module) comes back whole, once for every rule.
    assert prometheus["query_engine"]["bytes_received"] < 400_000


def test_fleet_finding_names_the_older_stepping(fleet):
    document = _diagnose(fleet["engines"]["prometheus"].url)[1]
    old = [n for n in fleet["nodes"] if n.stepping == "r1p0"]
    isa = next(e for e in document["fleet_findings"] if e["rule"] == "isa-mismatch")
    assert isa["nodes"] == len(old)
    assert isa["factor"]["attribute"] == "cpu"
    assert isa["factor"]["value"] == "HiSilicon Kunpeng 920 stepping r1p0"
    assert isa["factor"]["firing_elsewhere"] == 0
    assert isa["summary"].startswith(f"isa-mismatch on {len(old)} nodes, all HiSilicon "
                                     "Kunpeng 920 stepping r1p0")
    # The report leads with it.
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--prometheus",
                             fleet["engines"]["prometheus"].url, "--fleet"],
                            capture_output=True, text=True, timeout=300)
    text = result.stdout
    first = text.index("fleet: isa-mismatch on")
    assert first < text.index("Primary diagnosis")
    header_end = text.index("\n", text.index("CRITICAL"))
    # under the status line: the harm (how many pools hurt, and why), then what the sick
    # nodes share, before any node's findings
    assert text[header_end:].lstrip().startswith("harm: ")
    assert text.index("Harm now") < first < text.index("  1  ")


def test_one_node_and_an_unknown_node(fleet):
    url = fleet["engines"]["prometheus"].url
    node = next(n for n in fleet["nodes"] if n.profile == "fd-exhaustion")
    answer = remote.diagnose_remote(url, SECONDS, node.instance)
    assert {f.rule.id for f in answer.findings} == fleet["expected"]["fd-exhaustion"]
    assert answer.nodes == [node.instance]
    # Every query of a one-node diagnosis is filtered to that node: a node the engine does
    # not know is refused, naming the instances it does know.
    with pytest.raises(remote.RemoteError, match='no series with instance="nowhere:9105"') \
            as refused:
        remote.diagnose_remote(url, SECONDS, "nowhere:9105")
    named = str(refused.value).split("exporters there nearest to it are: ")[1]
    known = {n.instance for n in fleet["nodes"]}
    assert set(named.split(" (+")[0].split(", ")) <= known, named
    # A host name alone (the instance without its port) is answered with its instance.
    host = node.instance.rpartition(":")[0]
    meant = re.escape(f"did you mean --node {node.instance}?")
    with pytest.raises(remote.RemoteError, match=meant):
        remote.diagnose_remote(url, SECONDS, host)


@pytest.mark.parametrize("name", ["prometheus", "victoriametrics"])
def test_each_rule_condition_is_the_same_on_both_engines(fleet, name):
    """Every rule tier's condition, as range-queried: the label sets per step match between
    PromQL and MetricsQL (the rules use no construct where the two differ on data scraped
    at the rules' step; see test_metricsql_rate_differs_off_the_step)."""
    client = remote.QueryClient(fleet["engines"]["prometheus"].url)
    other = remote.QueryClient(fleet["engines"][name].url)
    end = time.time() // 15 * 15
    for rule in CATALOG:
        if engine.reads_alerts(rule):
            continue  # it reads each evaluator's own ALERTS, which only Prometheus has here
        for _, condition, _ in rule.severities():
            promql = condition.promql()
            a = {remote.labels_of(s): len(s["values"])
                 for s in client.query_range(promql, end - SECONDS, end, 15)}
            b = {remote.labels_of(s): len(s["values"])
                 for s in other.query_range(promql, end - SECONDS, end, 15)}
            assert a == b, (rule.id, promql)


def test_metricsql_increase_differs_where_a_series_begins(fleet):
    """Where MetricsQL and PromQL differ on an expression we use: `increase()` (and `rate()`)
    over a window that reaches back past a series' first sample. Prometheus extrapolates
    from the samples inside the window (half an interval past the first one); VictoriaMetrics
    counts from the first sample without extrapolating. Away from a series' start both give
    the counter's slope times the window on these counters, which is what the rules compare
    with their thresholds; a node whose exporter just started reads differently on the two
    engines for the first rate window, and the rules' thresholds are far from both."""
    node = next(n for n in fleet["nodes"] if n.profile == "healthy-busy")
    selector = f'fleetscope_pressure_stall_seconds_total{{instance="{node.instance}",' \
               'resource="cpu",stall="some"}'
    start = fleet["start_s"]
    values = {}
    for name, process in fleet["engines"].items():
        client = remote.QueryClient(process.url)
        values[name] = [float(client.query(f"increase({selector}[1m])", at)[0]["value"][1])
                        for at in (start + 30, start + 300)]
    prometheus, victoria = values["prometheus"], values["victoriametrics"]
    assert prometheus[1] == pytest.approx(victoria[1], rel=1e-6)  # inside the data: same
    assert prometheus[0] != pytest.approx(victoria[0], rel=1e-3)  # at the start: not
    assert prometheus[0] == pytest.approx(prometheus[1] * 37.5 / 60, rel=1e-6)


def _isa(*args) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "isa", *args, "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_isa_fleet_lists_the_steppings_and_their_baseline(fleet):
    url = fleet["engines"]["prometheus"].url
    code, document = _isa("fleet", "--prometheus", url)
    assert code == 0
    old = sum(n.stepping == "r1p0" for n in fleet["nodes"])
    counts = {g["cpus"][0]["cpu"]: g["nodes"] for g in document["groups"]}
    assert counts == {"HiSilicon Kunpeng 920 stepping r1p1": NODES - old,
                      "HiSilicon Kunpeng 920 stepping r1p0": old}
    arm = document["baseline"]["aarch64"]
    assert arm["nodes"] == NODES
    assert "asimddp" not in arm["features"] and "atomics" in arm["features"]
    assert "+lse" in arm["march"] and "+dotprod" not in arm["march"]
    # VictoriaMetrics answers the same.
    assert _isa("fleet", "--prometheus", fleet["engines"]["victoriametrics"].url)[1] == document


def test_isa_check_names_the_groups_a_binary_would_crash_on(fleet, tmp_path):
    from tests.test_isa import EM_AARCH64, make_elf

    url = fleet["engines"]["prometheus"].url
    ldadd, sdot, ret = (struct.pack("<I", w) for w in (0xB8200041, 0x4E829420, 0xD65F03C0))
    dotprod = tmp_path / "agent-dotprod"
    dotprod.write_bytes(make_elf(EM_AARCH64, ldadd + sdot + ret))
    code, document = _isa("check", str(dotprod), "--prometheus", url)
    old = sum(n.stepping == "r1p0" for n in fleet["nodes"])
    assert code == 1
    assert document["check"]["nodes_that_would_crash"] == old
    lacking = [g for g in document["check"]["groups"] if not g["can_run"]]
    assert [(g["cpus"][0]["cpu"], g["missing"]) for g in lacking] == [
        ("HiSilicon Kunpeng 920 stepping r1p0", ["DotProd"])]
    # Built for the baseline (LSE only): every node runs it.
    baseline = tmp_path / "agent-baseline"
    baseline.write_bytes(make_elf(EM_AARCH64, ldadd + ret))
    code, document = _isa("check", str(baseline), "--prometheus", url)
    assert code == 0 and document["check"]["nodes_that_would_crash"] == 0


def _firing(url: str, manager: bool = False) -> set[tuple[str, str, str]]:
    """(rule, node, severity) of every firing alert an evaluator (Prometheus, vmalert: their
    /api/v1/alerts) or an Alertmanager (/api/v2/alerts: only what was sent, i.e. firing)
    holds."""
    with urllib.request.urlopen(url + ("/api/v2/alerts" if manager else "/api/v1/alerts"),
                                timeout=60) as response:
        body = json.load(response)
    alerts = body if manager else [a for a in body["data"]["alerts"] if a["state"] == "firing"]
    return {(a["labels"]["fleetscope_rule"], a["labels"]["instance"], a["labels"]["severity"])
            for a in alerts}


def test_the_exported_rules_fire_what_diagnose_finds_on_prometheus_and_vmalert(fleet):
    """The file `fleetscope rules export` writes, loaded as users load it (Prometheus's
    rule_files; vmalert on VictoriaMetrics, notifying a real Alertmanager), fires exactly the
    (rule, node, severity) that `diagnose --fleet` reports, once the `for:` has passed."""
    until_alerts_held(fleet)
    engines, evaluators = fleet["engines"], fleet["evaluators"]
    # vmalert reads ALERTS back only from its datasource; the bench writes them to a store
    # of its own, so there a rule reading ALERTS (unexplained-harm) cannot see the causes.
    reading = {rule.id for rule in CATALOG if engine.reads_alerts(rule)}

    def compared(name: str, found: set, expected: set) -> tuple[set, set]:
        if name == "prometheus":
            return found, expected
        return ({f for f in found if f[0] not in reading},
                {f for f in expected if f[0] not in reading})

    deadline = time.monotonic() + 60  # Alertmanager gets vmalert's alerts a round later
    while True:
        expected = _keyed(_diagnose(engines["prometheus"].url)[1]["findings"])
        fired = {"prometheus": _firing(engines["prometheus"].url),
                 "vmalert": _firing(evaluators["vmalert"].url),
                 "alertmanager": _firing(evaluators["alertmanager"].url, manager=True)}
        agreed = all(a == b for a, b in (compared(name, found, expected)
                                         for name, found in fired.items()))
        if agreed or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert {rule for rule, _, _ in expected} == {rule.id for rule in CATALOG}
    for name, found in fired.items():
        found, wanted = compared(name, found, expected)
        assert found == wanted, (name, sorted(found ^ wanted))
    assert _keyed(_diagnose(engines["victoriametrics"].url)[1]["findings"]) == expected


def test_vmalert_records_the_console_series_the_engine_computes(fleet):
    """vmalert's recording rules (written to their own VictoriaMetrics) hold, per node, what
    the same expressions give as instant queries on the fleet's data."""
    from fleetscope.rules.recording import RECORDINGS

    store = remote.QueryClient(fleet["evaluators"]["vmalert-store"].url, 60)
    asked = remote.QueryClient(fleet["engines"]["victoriametrics"].url, 60)
    at = time.time() // 5 * 5 - 10  # a round vmalert has written and flushed
    recorded = remote.recorded_vectors(store, RECORDINGS, at)
    assert store.stats.queries == 1  # every recording found in one query
    computed = remote.recorded_vectors(asked, RECORDINGS, at)
    for recording in RECORDINGS:
        mine, theirs = recorded[recording.record], computed[recording.record]
        assert mine and set(mine) == set(theirs), recording.record
        for labels, value in mine.items():
            if value == value:
                assert theirs[labels] == pytest.approx(value, rel=0.05, abs=1e-9), labels


def test_the_console_reads_the_alerts_prometheus_fires_for_the_exported_rules(fleet):
    """Where the exported rules are loaded (Prometheus here) the console takes the findings
    from the alerts the engine already fires, with their evidence: the same (rule, node,
    severity), evidence and fleet findings as the diagnosis, for a fraction of the engine's
    work. VictoriaMetrics has no rules API: None, the console evaluates the rules there."""
    until_alerts_held(fleet)
    url = fleet["engines"]["prometheus"].url
    code, document = _diagnose(url)
    answer = remote.alerts_diagnosis(url, SECONDS)
    assert answer is not None and answer.from_alerts
    ours = [f.to_json() for f in answer.findings]
    assert _keyed(ours) == _keyed(document["findings"])
    assert answer.fleet_findings == document["fleet_findings"]
    theirs = {(f["rule"], f["node"]): f for f in document["findings"]}
    for finding in ours:
        other = theirs[(finding["rule"], finding["node"])]
        # The same words; a growing queue's depth reads a few seconds apart.
        assert re.sub(r"[\d.]+", "#", finding["summary"]) == re.sub(r"[\d.]+", "#",
                                                                      other["summary"])
        assert [e["signal"] for e in finding["evidence"]] == [
            e["signal"] for e in other["evidence"]]
    assert answer.stats.queries < document["query_engine"]["queries"]
    assert remote.alerts_diagnosis(fleet["engines"]["victoriametrics"].url, SECONDS) is None


def test_alerts_are_trusted_only_from_exactly_the_exported_rules(fleet):
    """Another version of a rule, a missing tier, another `for:` or a rule failing to
    evaluate: the alerts are not the rules' findings, the console evaluates instead. A
    malformed alert costs that alert."""
    import copy

    until_alerts_held(fleet)  # evaluated (a rule not evaluated yet is not trusted either)
    client = remote.QueryClient(fleet["engines"]["prometheus"].url)
    loaded = client.request("/api/v1/rules", {"type": "alert"})
    assert remote.loaded_alerts(loaded) is not None

    def ours(data):
        return [r for g in data["groups"] for r in g["rules"]
                if "fleetscope_rule" in r.get("labels", {})]

    def changed(change):
        data = copy.deepcopy(loaded)
        change(ours(data))
        return remote.loaded_alerts(data)

    assert changed(lambda rules: rules[0].update(query=rules[0]["query"] + " > 1")) is None
    assert changed(lambda rules: rules[0].update(labels={})) is None  # a tier missing
    assert changed(lambda rules: rules[0].update(duration=999)) is None  # another for:
    assert changed(lambda rules: rules[-1].update(health="err")) is None
    assert changed(lambda rules: rules[0].update(duration="soon")) is None
    # Rules listed without their alerts (vmalert 1.79 answering through VictoriaMetrics's
    # -vmalert.proxyURL): no alert would read as a healthy fleet, so evaluate instead.
    assert changed(lambda rules: [rule.pop("alerts") for rule in rules]) is None
    data = copy.deepcopy(loaded)
    firing = [a for r in ours(data) for a in r.get("alerts", []) if a["state"] == "firing"]
    assert firing
    whole = remote.alert_candidates(firing, time.time())
    assert len(whole) == len(firing)
    firing[0]["value"] = "not a number"
    firing[-1]["labels"] = {**firing[-1]["labels"], "fleetscope_rule": "no-such-rule"}
    kept = remote.alert_candidates(firing, time.time())
    assert len(kept) == len(firing) - 2


def test_the_fleet_is_judged_against_the_faults_injected_not_an_engines_answer():
    """A false alarm on a healthy node and a fault left unnamed both count, whatever any
    engine would answer on the same data."""
    from tests.conftest import fleet_bench

    bench = fleet_bench()
    nodes = bench.plan(64)
    faulty = next(n for n in nodes if n.profile == "fd-exhaustion")
    healthy = next(n for n in nodes if n.profile in bench.HEALTHY)
    truth = [{"rule": rule, "node": n.instance} for n in nodes
             for rule in bench.injected(n.profile)]
    assert bench.check({"findings": truth}, nodes) == []
    assert {"thread-oversubscription", "cpu-saturation"} <= {
        f["rule"] for f in truth}  # a fault's own symptoms are part of what it injects
    wrong = [f for f in truth if f["node"] != faulty.instance] + [
        {"rule": "cpu-saturation", "node": healthy.instance}]
    problems = bench.check({"findings": wrong}, nodes)
    assert len(problems) == 2 and any(faulty.instance in p for p in problems)
    tally = bench.score({"findings": wrong}, nodes)
    assert tally["missed"] == [("fd-exhaustion", faulty.instance)]
    assert tally["extra"] == [("cpu-saturation", healthy.instance)]
    assert len(tally["found"]) == len(truth) - 1
