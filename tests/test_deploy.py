"""deploy/: the systemd unit (systemd-analyze), the Kubernetes manifests (the Kubernetes and
prometheus-operator schemas, offline), the PrometheusRule (equal to what `rules export`
prints), the Prometheus scrape config (promtool, and a real Prometheus attaching rack and
node_pool), and the Containerfile (the node extras of pyproject.toml, exec-form entrypoint)."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetscope.cli import build_parser
from fleetscope.core.config import load_config
from fleetscope.rules.catalog import CATALOG
from tests.conftest import BUNDLES, require_tool
from tests.test_prometheus_scrape import _free_port, _wait_for

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "fleetscope-exporter.service"
K8S = DEPLOY / "kubernetes"
INSTALLED_AT = "/opt/fleetscope/bin/fleetscope"  # docs/deploying.md's install prefix
# Kubernetes versions the manifests must be valid for: the oldest still common on
# openEuler 22.03 fleets, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.28.0", "latest")
CONSOLE_PACKAGES = {"streamlit", "plotly", "pandas", "numpy"}


def manifests() -> dict[str, dict]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(K8S.glob("*.yaml"))
            if path.name != "kustomization.yaml"}


def daemonset() -> dict:
    return manifests()["daemonset.yaml"]


def container() -> dict:
    return daemonset()["spec"]["template"]["spec"]["containers"][0]


def unit_directives() -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            directives.setdefault(key, []).append(value)
    return directives


# ---- systemd ----------------------------------------------------------------------------

def _verify(unit_text: str, tmp_path: Path, name: str) -> str:
    """systemd-analyze verify on the unit, installed where this test's fleetscope is."""
    analyze = require_tool("systemd-analyze")
    fleetscope = Path(sys.executable).with_name("fleetscope")
    assert fleetscope.exists(), "the project's console script is installed beside python"
    path = tmp_path / name
    path.write_text(unit_text.replace(INSTALLED_AT, str(fleetscope)))
    done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True,
                          timeout=120)
    # verify exits 0 on a misspelt directive and only says so: every line about the unit
    # counts as a failure.
    about = [line for line in (done.stdout + done.stderr).splitlines() if name in line]
    return f"exit {done.returncode}: " + "\n".join(about) if done.returncode or about else ""


def test_systemd_unit_verifies_and_a_broken_one_does_not(tmp_path):
    text = UNIT.read_text()
    assert INSTALLED_AT in text
    assert _verify(text, tmp_path, "fleetscope-exporter.service") == ""
    broken = text.replace("ProtectSystem=strict", "ProtectSistem=strict")
    assert "ProtectSistem" in _verify(broken, tmp_path, "broken.service")


def test_systemd_unit_runs_the_exporter_as_restricted_root(tmp_path):
    directives = unit_directives()
    assert "User" not in directives and "DynamicUser" not in directives  # root
    capabilities = set(directives["CapabilityBoundingSet"][0].split())
    assert capabilities == {"CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH",
                            "CAP_SYSLOG"}
    # the DaemonSet grants the same, no more
    added = container()["securityContext"]["capabilities"]["add"]
    assert {f"CAP_{name}" for name in added} == capabilities
    assert directives["ProtectSystem"] == ["strict"]
    assert directives["NoNewPrivileges"] == ["yes"]
    assert directives["Restart"] == ["on-failure"]
    assert "perf_event_open" in directives["SystemCallFilter"][0]  # perf inherits the filter
    argv = shlex.split(directives["ExecStart"][0])
    assert argv[0] == INSTALLED_AT
    args = build_parser().parse_args(argv[1:])
    assert args.config == "/etc/fleetscope/config.yaml" and args.listen == ":9105"
    # systemd's own review of the sandbox: exposure below "MEDIUM" (5.0 and up)
    analyze = require_tool("systemd-analyze")
    path = tmp_path / "fleetscope-exporter.service"
    path.write_text(UNIT.read_text().replace(INSTALLED_AT, sys.executable))
    done = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(path)],
                          capture_output=True, text=True, timeout=120)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert level, done.stdout[-500:] + done.stderr
    assert float(level.group(1)) < 5.0, done.stdout


def test_example_config_loads_and_the_configmap_carries_it_verbatim():
    config = load_config(str(DEPLOY / "config.yaml"))
    assert [pool.name for pool in config.pools] == ["chat-online", "batch"]
    assert config.per_core == "summary"
    configmap = manifests()["configmap.yaml"]
    assert configmap["data"]["config.yaml"] == (DEPLOY / "config.yaml").read_text()
    volume = next(v for v in daemonset()["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "config")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]


# ---- Kubernetes -------------------------------------------------------------------------

def _unknown_fields(given, validated, path="") -> list[str]:
    """Paths present in the manifest but dropped by the model (pydantic ignores unknown keys;
    the API server's strict field validation rejects them)."""
    if isinstance(given, dict):
        if not isinstance(validated, dict):
            return [path or "/"]
        found = [f"{path}/{key}" for key in given if key not in validated]
        for key in given.keys() & validated.keys():
            found += _unknown_fields(given[key], validated[key], f"{path}/{key}")
        return found
    if isinstance(given, list) and isinstance(validated, list):
        return [p for i, (g, v) in enumerate(zip(given, validated, strict=False))
                for p in _unknown_fields(g, v, f"{path}/{i}")]
    return []


def _validate_operator(resource: dict) -> list[str]:
    """Against the prometheus-operator CRD schemas (cloudcoil's models of them)."""
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, resource["kind"])
    validated = model.model_validate(resource).model_dump(by_alias=True, exclude_unset=True,
                                                          mode="json")
    return _unknown_fields(resource, validated)


def _validate_core(resource: dict, version: str) -> None:
    import kubernetes_validate

    target = kubernetes_validate.latest_version() if version == "latest" else version
    kubernetes_validate.validate(resource, target, strict=True)


def test_manifests_validate_against_the_kubernetes_and_operator_schemas():
    pytest.importorskip("kubernetes_validate")
    pytest.importorskip("cloudcoil.models.prometheus_operator")
    kinds = {}
    for name, resource in manifests().items():
        kinds[resource["kind"]] = name
        if resource["apiVersion"].startswith("monitoring.coreos.com/"):
            assert _validate_operator(resource) == [], name
        else:
            for version in K8S_VERSIONS:
                _validate_core(resource, version)
    assert set(kinds) == {"ServiceAccount", "ConfigMap", "DaemonSet", "Service", "PodMonitor",
                          "PrometheusRule"}


def test_the_validators_reject_a_misspelt_field():
    import kubernetes_validate

    broken = copy.deepcopy(daemonset())
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_core(broken, "latest")
    monitor = copy.deepcopy(manifests()["podmonitor.yaml"])
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    assert _validate_operator(monitor) == ["/spec/podMetricsEndpoints/0/intervall"]
    monitor["spec"]["podMetricsEndpoints"][0]["port"] = 9105  # a name, not a number
    with pytest.raises(ValueError):
        _validate_operator(monitor)


def test_kustomization_builds_every_manifest():
    kubectl = require_tool("kubectl")
    done = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    built = [doc["kind"] for doc in yaml.safe_load_all(done.stdout) if doc]
    assert sorted(built) == sorted(r["kind"] for r in manifests().values())


def test_daemonset_runs_the_exporter_on_every_node_in_container_mode():
    pod = daemonset()["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["tolerations"] == [{"operator": "Exists"}]  # every taint, every effect
    main = container()
    args = build_parser().parse_args(main["args"])
    assert args.root == "/host" and args.config == "/etc/fleetscope/config.yaml"
    assert args.evidence == "live"  # perf and ethtool run on the node, not replayed
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for host_path in ("/proc", "/sys", "/dev/kmsg"):
        mount = mounts[f"/host{host_path}"]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["hostPath"]["path"] == host_path
    assert all(m.get("readOnly") for m in main["volumeMounts"])
    # what names the pods: every path the config's kubernetes block reads is mounted
    kubernetes = load_config(str(DEPLOY / "config.yaml")).kubernetes
    for host_path in (kubernetes.pod_logs, kubernetes.container_logs, kubernetes.kubelet_root,
                      *kubernetes.runtime_state):
        mount = mounts[f"/host{host_path}"]
        assert mount["readOnly"] is True, host_path
        assert volumes[mount["name"]]["hostPath"]["path"] == host_path
    # ...and nothing of the kubelet's directory fleetscope never reads: its keys, every pod's
    # secrets and tokens, plugin sockets and checkpoints sit under an empty directory.
    for secret in ("pki", "pods", "checkpoints", "plugins", "plugins_registry",
                   "device-plugins", "pod-resources"):
        mount = mounts[f"/host{kubernetes.kubelet_root}/{secret}"]
        assert "emptyDir" in volumes[mount["name"]] and mount["readOnly"] is True, secret
    probe = main["readinessProbe"]["httpGet"]
    assert probe["path"] == "/metrics"
    port = next(p for p in main["ports"] if p["name"] == probe["port"])
    assert args.listen.endswith(f":{port['containerPort']}")
    security = main["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["privileged"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    limits, requests = main["resources"]["limits"], main["resources"]["requests"]
    assert set(limits) == set(requests) == {"cpu", "memory"}
    # the pods the Service and PodMonitor select are the DaemonSet's
    labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    for name in ("service.yaml", "podmonitor.yaml"):
        spec = manifests()[name]["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), name
    endpoint = manifests()["podmonitor.yaml"]["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == port["name"]
    assert {r["targetLabel"] for r in endpoint["relabelings"]} >= {"rack", "node_pool"}


def test_daemonset_arguments_on_a_host_style_root_run_every_collector_live(
        exporter_factory, tmp_path, monkeypatch):
    """The DaemonSet's own arguments and config, the node's proc/sys/dev under a /host-style
    root (links here, hostPath mounts in the pod): every collector runs, perf and ethtool
    live on this machine (a VM's `<not supported>` hardware events still make a run)."""
    from fleetscope.collectors import COLLECTORS
    from tests.conftest import samples, scrape_until_perf_ran
    from tests.test_evidence_source import _interfaces, _linked_root, _recording_tool

    require_tool("perf")
    argv = list(container()["args"])
    given = {flag: argv[argv.index(flag) + 1] for flag in ("--listen", "--root", "--config")}
    assert given["--root"] == "/host" and argv[0] == "exporter"
    rest = [a for i, a in enumerate(argv[1:], 1)
            if a not in given and argv[i - 1] not in given]  # what the test keeps verbatim
    assert rest == ["--evidence", "live"]
    config = load_config(str(DEPLOY / "config.yaml"))  # what the ConfigMap mounts
    assert config.pools
    node_config = yaml.safe_load((DEPLOY / "config.yaml").read_text())
    interfaces = _interfaces()
    if interfaces:  # the port the PFC counters come from, as a RoCE node names it
        node_config["ethtool_interfaces"] = [interfaces[0]]
    node_config["perf_window_seconds"] = 0.2  # test speed: the config says 5
    calls = tmp_path / "ethtool-calls"
    _recording_tool(tmp_path / "bin", "ethtool", calls,
                    "NIC statistics:\\n     rx_prio3_pause: 7\\n")
    # a node with an inference module: npu-smi on PATH (printing a published table) makes
    # the accelerator collector run under the default accelerator_tools: auto
    npu_smi = tmp_path / "bin" / "npu-smi"
    npu_smi.write_text("#!/bin/sh\nexec cat '%s'\n" % (
        Path(__file__).parent / "fixtures" / "inference" / "npu-smi" / "910-8npu-info.txt"))
    npu_smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FLEETSCOPE_PERF", raising=False)
    exporter = exporter_factory(_linked_root(tmp_path), node_config, rest)
    got, runs = scrape_until_perf_ran(exporter)
    ran = {name for name in COLLECTORS
           if f'fleetscope_scrape_collector_success{{collector="{name}"}}' in got}
    assert ran == set(COLLECTORS), set(COLLECTORS) - ran
    assert runs >= 1 and got['fleetscope_scrape_collector_success{collector="perf"}'] == 1
    for name in ("cpu", "pressure", "irq", "pools", "tcp", "cpu_features", "accelerator"):
        assert got[f'fleetscope_scrape_collector_success{{collector="{name}"}}'] == 1, name
    if interfaces:
        assert f"-S {interfaces[0]}" in calls.read_text().splitlines()
    assert samples(exporter.text())  # and it keeps serving


def test_prometheusrule_is_what_rules_export_prints():
    done = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "--format",
                           "prometheusrule"], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    committed = (K8S / "prometheusrule.yaml").read_text()
    assert committed == done.stdout, ("deploy/kubernetes/prometheusrule.yaml is stale: "
                                      "fleetscope rules export --format prometheusrule -o "
                                      "deploy/kubernetes/prometheusrule.yaml")
    plain = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert yaml.safe_load(committed)["spec"] == yaml.safe_load(plain.stdout)


def test_prometheusrule_groups_pass_promtool(tmp_path):
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
                                    ["spec"]))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# ---- Prometheus -------------------------------------------------------------------------

def _scrape_config(tmp_path: Path, targets_dir: Path | None = None) -> Path:
    """The example config in a directory with the exported rule file beside it."""
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    if targets_dir is not None:
        text = text.replace("/etc/prometheus/fleetscope-nodes", str(targets_dir))
        text = text.replace("scrape_interval: 15s", "scrape_interval: 1s")
        text = text.replace("scrape_timeout: 10s", "scrape_timeout: 1s")
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    done = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "-o",
                           str(tmp_path / "fleetscope.rules.yml")], timeout=120, cwd=REPO)
    assert done.returncode == 0
    return config


def test_scrape_config_passes_promtool(tmp_path):
    promtool = require_tool("promtool")
    config = _scrape_config(tmp_path)
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    from fleetscope.rules.harm import POOL_HARMS
    from fleetscope.rules.recording import RECORDINGS
    from fleetscope.rules.terms import catalog_terms

    alerts = sum(len(rule.severities()) for rule in CATALOG)  # one alert per severity tier
    # and the conditions' terms recorded, with the record of since when they are
    terms = catalog_terms([level.condition for rule in CATALOG for level in rule.levels()]
                          + list(POOL_HARMS))
    assert f"{alerts + len(RECORDINGS) + len(terms) + 1} rules found" in \
        done.stdout + done.stderr


def test_real_prometheus_attaches_rack_and_node_pool(tmp_path, exporter_factory):
    binary = require_tool("prometheus")
    exporter = exporter_factory(BUNDLES / "x86-256" / "samples" / "s0000",
                                {"collectors": ["cpu_features"]})
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")
    targets = tmp_path / "nodes"
    targets.mkdir()
    (targets / "rack12.json").write_text(json.dumps(
        [{"targets": [target], "labels": {"__hostname__": "r12-chat-0042"}}]))
    config = _scrape_config(tmp_path, targets)
    port = _free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        found = _wait_for(f"http://127.0.0.1:{port}", "fleetscope_cpu_info")
    finally:
        process.terminate()
        process.wait(timeout=20)
    labels = found[0]["metric"]
    assert (labels["instance"], labels["rack"], labels["node_pool"]) == (
        "r12-chat-0042", "r12", "chat")
    assert not [name for name in labels if name.startswith("__") and name != "__name__"]


# ---- Container image --------------------------------------------------------------------

def _containerfile() -> str:
    # one logical line per instruction (backslash continuations joined)
    return (DEPLOY / "Containerfile").read_text().replace("\\\n", " ")


def _extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(REPO / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["optional-dependencies"]


def _requirement_names(requirements: list[str], extras: dict[str, list[str]]) -> set[str]:
    """Distribution names a list of requirements pulls in, self-references expanded."""
    names: set[str] = set()
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", requirement)
        name, wanted = match.group(1).lower(), match.group(2)
        if name == "fleetscope":
            for extra in (wanted or "").split(","):
                names |= _requirement_names(extras[extra.strip()], extras)
        else:
            names.add(name)
    return names


def test_containerfile_installs_the_node_extras_only():
    text = _containerfile()
    base = re.search(r"^FROM\s+(\S+)", text, re.M).group(1)
    assert re.search(r"python:[0-9.]+-slim", base), base
    installs = re.findall(r"pip install ([^&\n]+)", text)
    assert len(installs) == 1
    targets = [t.strip('"\'') for t in shlex.split(installs[0]) if not t.startswith("-")]
    assert len(targets) == 1 and targets[0].startswith("/src[")
    image_extras = set(targets[0][len("/src["):-1].split(","))
    extras = _extras()
    assert image_extras == {"node"}
    node = _requirement_names(extras["node"], extras)
    # the node extra is everything the node side uses, nothing of the console
    node_side = {"auth", "isa", "redis", "stacks"}
    assert node == _requirement_names([f"fleetscope[{','.join(sorted(node_side))}]"], extras)
    assert not node & CONSOLE_PACKAGES
    assert not node & _requirement_names(extras["console"], extras)
    # and the commands the collectors run, from the same Debian packages as CI installs
    apt = re.search(r"apt-get install ([^&\n]+)", text).group(1).split()
    ci = (REPO / ".ci" / "run").read_text()
    for tool in ("perf", "ethtool"):
        package = re.search(rf"\[{tool}\]=(\S+?)[ )\n]", ci).group(1)
        assert package in apt, tool


def test_containerfile_entrypoint_is_exec_form_and_runs_what_the_daemonset_runs():
    text = _containerfile()
    entrypoint = re.search(r"^ENTRYPOINT\s+(.+)$", text, re.M).group(1)
    cmd = re.search(r"^CMD\s+(.+)$", text, re.M).group(1)
    argv, default_args = json.loads(entrypoint), json.loads(cmd)  # exec form is JSON
    assert argv == ["fleetscope"]
    assert default_args == container()["args"]


def test_the_deploy_guide_says_images_are_not_built_here():
    section = (REPO / "docs" / "deploying.md").read_text()
    readme = (REPO / "README.md").read_text()
    assert "(docs/deploying.md)" in readme.split("## Deploying to a fleet", 1)[1]
    for topic in ("systemd", "Kubernetes", "scrape config", "Alertmanager", "Containerfile",
                  "Kunpeng", "perf_event_paranoid"):
        assert topic in section, topic
    assert "Images cannot\nbe built" in section or "Images cannot be built" in section


# ---- Alertmanager -----------------------------------------------------------------------

def test_alertmanager_example_passes_amtool_and_routes_on_labels_the_alerts_carry():
    amtool = require_tool("amtool")
    path = DEPLOY / "alertmanager" / "alertmanager.yml"
    done = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    exported = yaml.safe_load(subprocess.run(
        [sys.executable, "-m", "fleetscope", "rules", "export"], capture_output=True,
        text=True, timeout=120, cwd=REPO).stdout)
    alert_labels = [rule["labels"] for group in exported["groups"] for rule in group["rules"]
                    if "alert" in rule]
    severities = {labels["severity"] for labels in alert_labels}
    config = yaml.safe_load(path.read_text())
    routed = set()
    for route in config["route"]["routes"]:
        for matcher in route["matchers"]:
            name, value = re.fullmatch(r'(\w+)=~?"(.*)"', matcher).groups()
            assert all(name in labels for labels in alert_labels), name
            if name == "severity":
                routed.add(value)
    assert routed <= severities and "critical" in routed
    assert set(config["route"]["group_by"]) <= {"fleetscope_rule", "node_pool", "rack",
                                                 "instance", "alertname"}


def test_alertmanager_example_holds_the_generated_inhibit_rules_and_routes_ended_events():
    """deploy/alertmanager/alertmanager.yml's inhibit rules are `rules export --format
    alertmanager`'s (the relation of causes to the harm they explain, regenerated, never
    hand-copied), and an event that ended goes to chat even when critical."""
    from fleetscope.rules.export import inhibit_rules

    amtool = require_tool("amtool")
    path = DEPLOY / "alertmanager" / "alertmanager.yml"
    assert yaml.safe_load(path.read_text())["inhibit_rules"] == inhibit_rules()
    for labels, receiver in ((["severity=critical", "fleetscope_phase=ended"], "oncall-chat"),
                             (["severity=critical", "fleetscope_phase=ongoing"],
                              "oncall-pager")):
        routed = subprocess.run([amtool, "config", "routes", "test",
                                 f"--config.file={path}", "fleetscope_rule=oom-kill", *labels],
                                capture_output=True, text=True, timeout=120)
        assert routed.stdout.strip() == receiver, routed.stdout + routed.stderr
