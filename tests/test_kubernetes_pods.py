"""Pods named from the node alone: the kubelet's cgroup layouts, pod log directories, runtime
annotations and the CPU/memory manager checkpoints, parsed from real public samples (origin
beside each); pools matched by namespace and QoS class in the exporter and in a recorded
bundle; findings that name pods."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.bundle.read import open_bundle
from fleetscope.bundle.record import record
from fleetscope.collectors import pods as pods_module
from fleetscope.collectors.base import Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers import kubepods as kp
from fleetscope.collectors.processes import pool_processes
from fleetscope.collectors.source import RecordedSample, evidence_source
from fleetscope.core.config import ConfigError, parse_config
from fleetscope.exporter import Exporter
from tests.conftest import FIXTURES, samples
from tests.fuzzing import parser_fuzz_tests
from tests.test_pools import collect, write, write_process

# ---- real samples of each layout ---------------------------------------------------------

CGROUP_SAMPLES = [
    # coreos/fedora-coreos-tracker#682: kubelet and Docker with the cgroupfs driver, cgroup
    # v1, a Burstable coredns (cpu,cpuacct left at / by the runtime).
    ("cgroupfs-v1-burstable",
     "11:freezer:/kubepods/burstable/pod43b37e54-f9ee-4267-b992-2a516b0be3c8/"
     "f0a3a171f445d2d3253ddf693a1c662e617b691874e2416360baf6eb690db240\n"
     "10:cpu,cpuacct:/\n"
     "9:cpuset:/kubepods/burstable/pod43b37e54-f9ee-4267-b992-2a516b0be3c8/"
     "f0a3a171f445d2d3253ddf693a1c662e617b691874e2416360baf6eb690db240\n"
     "8:pids:/system.slice/docker.service\n",
     kp.PodCgroup("burstable", "43b37e54-f9ee-4267-b992-2a516b0be3c8",
               "f0a3a171f445d2d3253ddf693a1c662e617b691874e2416360baf6eb690db240", "")),
    # containerd/containerd#4857: a static pod's UID (32 hex digits), cgroupfs path.
    ("cgroupfs-static-pod",
     "4:cpu:/kubepods/burstable/pod89f4f2cb511c3b0b7e5272cff5ec37bf/"
     "823b5a6d9aaa8da5c0ecda3e7cbcd6729673437965dc600ffcb0a2651960f945\n",
     kp.PodCgroup("burstable", "89f4f2cb511c3b0b7e5272cff5ec37bf",
               "823b5a6d9aaa8da5c0ecda3e7cbcd6729673437965dc600ffcb0a2651960f945", "")),
    # adoptium/adoptium-support#638: cgroupfs v1 Burstable with containerd.
    ("cgroupfs-v1-containerd",
     "12:rdma:/kubepods/burstable/podd7874f44-eee0-423c-83c9-f246075bdde1/"
     "fbaa59723cd1f05d310e6f48b5d49a9d9e9552b7fde2205d0a2e2b5f60ec21ba\n",
     kp.PodCgroup("burstable", "d7874f44-eee0-423c-83c9-f246075bdde1",
               "fbaa59723cd1f05d310e6f48b5d49a9d9e9552b7fde2205d0a2e2b5f60ec21ba", "")),
    # opencontainers/runc#4620: systemd driver, CRI-O, cgroup v1 lines (calico-node).
    ("systemd-v1-crio",
     "13:freezer:/kubepods.slice/kubepods-burstable.slice/"
     "kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/"
     "crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope\n"
     "11:files:/\n",
     kp.PodCgroup("burstable", "a5c1f8d5-1919-434d-add7-4afaafdaef89",
               "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c", "cri-o")),
    # lxc/lxc#3890: systemd driver, Docker scopes, cgroup v1.
    ("systemd-v1-docker",
     "12:rdma:/\n11:freezer:/kubepods.slice/kubepods-burstable.slice/"
     "kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d.slice/"
     "docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope\n",
     kp.PodCgroup("burstable", "7d4424e6-bb13-42f4-a47a-45a4828bf54d",
               "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98", "docker")),
    # kubernetes/minikube#11280 (systemd-cgls of a node in Docker, CRI-O): the path from the
    # tree, under the outer container's cgroup, as a cgroup v2 line.
    ("systemd-v2-crio-nested",
     "0::/docker/d6701ec289c56e4391acb11d07474b3139466857a305490575508a8b7a9fcf22/"
     "kubepods.slice/kubepods-besteffort.slice/"
     "kubepods-besteffort-pod2ca4a155_3599_498d_bb9d_4446693fa3ea.slice/"
     "crio-358607a37e7ada357032e7f5729c9ae6a3efdb7962acbcbe47ff6a3c5506cb1c.scope\n",
     kp.PodCgroup("besteffort", "2ca4a155-3599-498d-bb9d-4446693fa3ea",
               "358607a37e7ada357032e7f5729c9ae6a3efdb7962acbcbe47ff6a3c5506cb1c", "cri-o")),
    # netdata/netdata#4868 (systemd-cgls, containerd): the tree's path as a v2 line.
    ("systemd-v2-containerd",
     "0::/kubepods.slice/kubepods-burstable.slice/"
     "kubepods-burstable-pod03f3f104_3215_44f2_9686_d4dd1f05a7ed.slice/"
     "cri-containerd-09d185410c4e25236cc24717f881589bb0978b24eafd101624e627a4dd8d3439.scope\n",
     kp.PodCgroup("burstable", "03f3f104-3215-44f2-9686-d4dd1f05a7ed",
               "09d185410c4e25236cc24717f881589bb0978b24eafd101624e627a4dd8d3439",
               "containerd")),
    # containerd/nri#227: kind with --cgroup-root=kubelet.slice (prefixed slice names).
    ("systemd-v2-kind-prefixed",
     "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     "kubelet-kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/"
     "cri-containerd-d7dfb4a21fe1703a8537e60d5af248af729315d187b24a538102d14874c8117d.scope\n",
     kp.PodCgroup("besteffort", "1e597579-417e-482f-bf65-5fe170c3aebd",
               "d7dfb4a21fe1703a8537e60d5af248af729315d187b24a538102d14874c8117d",
               "containerd")),
    # open-telemetry/opentelemetry-java#4507: containerd's "slice:prefix:name" form seen
    # from inside the container (cgroup v1).
    ("systemd-v1-slice-prefix-name",
     "9:cpuacct,cpu:/system.slice/containerd.service/"
     "kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:"
     "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n",
     kp.PodCgroup("besteffort", "0125ec2f-b64a-4868-8f5b-94b56cbab864",
               "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459",
               "containerd")),
    # kontena/pharos-cluster#440: the kubelet's own process, in no pod.
    ("not-a-pod", "11:cpuacct,cpu:/system.slice\n10:perf_event:/system.slice\n"
                  "1:name=systemd:/system.slice\n", None),
]


@pytest.mark.parametrize("name,text,expected", CGROUP_SAMPLES,
                         ids=[s[0] for s in CGROUP_SAMPLES])
def test_pod_cgroup_real_samples(name, text, expected):
    assert kp.parse_pod_cgroup(text) == expected


def test_guaranteed_pods_sit_directly_under_kubepods_in_both_drivers():
    # pkg/kubelet/cm/qos_container_manager_linux.go: Guaranteed pods get no QoS level; the
    # live test below builds this layout for real.
    uid = "b0e4cb0d-47b0-4ed3-b707-4baf7eb0875a"
    cid = "c269a18400e27b14085c57f8e36f5b4d5471c140eb27e8b0f632c056547555de"
    assert kp.parse_pod_path(f"/kubepods/pod{uid}/{cid}") == kp.PodCgroup(
        "guaranteed", uid, cid, "")
    systemd = (f"/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
               f"cri-containerd-{cid}.scope")
    assert kp.parse_pod_path(systemd) == kp.PodCgroup("guaranteed", uid, cid, "containerd")
    # the pod's own cgroup (no container), a CRI-O conmon scope, and look-alikes
    assert kp.parse_pod_path(f"/kubepods/besteffort/pod{uid}") == kp.PodCgroup(
        "besteffort", uid, "", "")
    assert kp.parse_pod_path(f"/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
                          f"crio-conmon-{cid}.scope").container_id == ""
    assert kp.parse_pod_path(f"/srv/pod{uid}/{cid}") is None
    assert kp.parse_pod_path(f"/besteffort/pod{uid}/{cid}") is None


def test_malformed_cgroup_file_is_a_parse_error():
    with pytest.raises(ParseError):
        kp.parse_pod_cgroup("not a cgroup line\n")


def test_pod_log_names_real_samples():
    # dec1/practical_devops (troubleshooting notes): `ls /var/log/pods` and
    # `ls /var/log/containers` on a kubeadm control-plane node.
    found = kp.parse_pod_log_dir("kube-system_kube-apiserver-controlplane_"
                              "33d556edd3ae8ef21980288cef77ae8b")
    assert found.namespace == "kube-system" and found.pod == "kube-apiserver-controlplane"
    assert found.uid == "33d556edd3ae8ef21980288cef77ae8b"
    link = kp.parse_container_log_link(
        "kube-apiserver-controlplane_kube-system_kube-apiserver-"
        "3959d7abfbd0221e5043fccbcb8040e9a1a4e6518dad483b7a33a131885e0283.log")
    assert link == ("kube-system", "kube-apiserver-controlplane", "kube-apiserver",
                    "3959d7abfbd0221e5043fccbcb8040e9a1a4e6518dad483b7a33a131885e0283")
    assert kp.parse_pod_log_dir("0.log") is None and kp.parse_pod_log_dir("a_b_notauid") is None
    # kuberuntime logSymlink cuts names past 255 characters, ID included: skipped
    assert kp.parse_container_log_link("p_ns_c-3959d7abfbd0221e5043.log") is None


def test_cpu_manager_state_real_sample():
    # kubernetes/kubernetes#118657: a v1.23 node with the static policy, full-pcpus-only.
    state = kp.parse_cpu_manager_state(
        '{"policyName":"static","defaultCpuSet":"0-7,16-55","entries":{"b0e4cb0d-47b0-4ed3-'
        'b707-4baf7eb0875a":{"nf-97cb00a04fbdc660b8193d6093288930":"8-15,56-63"}},'
        '"checksum":2824956018}')
    assert state.policy == "static"
    assert state.default_cpus == frozenset([*range(0, 8), *range(16, 56)])
    assert state.exclusive["b0e4cb0d-47b0-4ed3-b707-4baf7eb0875a"][
        "nf-97cb00a04fbdc660b8193d6093288930"] == frozenset([*range(8, 16), *range(56, 64)])
    # the none policy writes no entries (siderolabs/talos#7504 quotes its policy name)
    none = kp.parse_cpu_manager_state('{"policyName":"none","defaultCpuSet":"","checksum":1}')
    assert none.policy == "none" and not none.exclusive and not none.default_cpus
    for bad in ("", "[]", '{"defaultCpuSet":"0-3"}', '{"policyName":"static","entries":[]}',
                '{"policyName":"static","defaultCpuSet":"3-1"}'):
        with pytest.raises(ParseError):
            kp.parse_cpu_manager_state(bad)


def test_memory_manager_state():
    # The MemoryManagerCheckpoint of pkg/kubelet/cm/memorymanager/state/checkpoint.go
    # (v1.21-v1.35), field names from its json tags, with a hugepages block beside memory.
    state = kp.parse_memory_manager_state(json.dumps({
        "policyName": "Static",
        "machineState": {"0": {"numberOfAssignments": 1, "memoryMap": {}, "cells": [0]}},
        "entries": {"fb4f2c0e-1c37-4a4b-8d39-3a1c7f0b9e21": {"worker": [
            {"numaAffinity": [1], "type": "memory", "size": 2147483648},
            {"numaAffinity": [1, 2], "type": "hugepages-1Gi", "size": 1073741824}]}},
        "checksum": 3961423441}))
    assert state.policy == "Static"
    assert state.numa_nodes == {"fb4f2c0e-1c37-4a4b-8d39-3a1c7f0b9e21": {
        "worker": frozenset({1, 2})}}
    with pytest.raises(ParseError):
        kp.parse_memory_manager_state('{"policyName":"Static","entries":{"u":[1]}}')


def test_memory_manager_state_real_sample():
    # a 150Gi Guaranteed pod over two NUMA nodes (origin: tests/fixtures/kubelet/README.md)
    state = kp.parse_memory_manager_state(
        (FIXTURES / "kubelet" / "memory_manager_state.docs.json").read_text())
    assert state.policy == "Static"
    # the pod's one container ("guaranteed") pinned to both NUMA nodes
    assert state.numa_nodes == {"fa9bdd38-6df9-4cf9-aa67-8c4814da37a8": {
        "guaranteed": frozenset({0, 1})}}


def test_runtime_annotations():
    # kata-containers docs (a containerd CRI container's annotations, verbatim keys and
    # values) and CRI-O's keys (pkg/annotations: io.kubernetes.pod.*, container.name).
    containerd = kp.parse_oci_annotations(json.dumps({"ociVersion": "1.0.2", "annotations": {
        "io.kubernetes.cri.container-name": "coco-container",
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id":
            "7a0d058477e280604ae02de6a016959e8a05fcd3165c47af41eabcf205b55517",
        "io.kubernetes.cri.sandbox-name": "coco-pod",
        "io.kubernetes.cri.sandbox-namespace": "default",
        "io.kubernetes.cri.sandbox-uid": "de7c6a0c-79c0-44dc-a099-69bb39f180af"}}))
    assert containerd == ("default", "coco-pod", "de7c6a0c-79c0-44dc-a099-69bb39f180af",
                          "coco-container")
    crio = kp.parse_oci_annotations(json.dumps({"annotations": {
        "io.kubernetes.pod.namespace": "batch", "io.kubernetes.pod.name": "etl-7f9c",
        "io.kubernetes.pod.uid": "2ca4a155-3599-498d-bb9d-4446693fa3ea",
        "io.kubernetes.container.name": "POD"}}))
    assert crio == ("batch", "etl-7f9c", "2ca4a155-3599-498d-bb9d-4446693fa3ea", "")
    assert kp.parse_oci_annotations('{"process": {}}') is None
    with pytest.raises(ParseError):
        kp.parse_oci_annotations("{")


# ---- a node's tree: pools by namespace and QoS, in the exporter and in a bundle ------------

ONLINE_UID = "6f1a2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b"
BATCH_UID = "0125ec2f-b64a-4868-8f5b-94b56cbab864"
TENANT_UID = "d7874f44-eee0-423c-83c9-f246075bdde1"
ONLINE_CID = "a" * 64
BATCH_CID = "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459"
TENANT_CID = "fbaa59723cd1f05d310e6f48b5d49a9d9e9552b7fde2205d0a2e2b5f60ec21ba"
RUNTIME = "run/containerd/io.containerd.runtime.v2.task/k8s.io"
POD_POOLS = [
    {"name": "online", "class": "online", "match": {"qos": "guaranteed"}},
    {"name": "batch", "class": "offline", "match": {"namespace": "batch"}},
    {"name": "tenants", "class": "offline",
     "match": {"namespace": "tenant-*", "qos": "burstable", "container": "worker"}},
]


def kube_tree(tmp_path: Path) -> Path:
    """Three pods in the kubelet's layouts: a Guaranteed one (cgroupfs, v1, named by its log
    link), a BestEffort one (systemd, v2, named by containerd's annotations only) and a
    Burstable one of two containers; and sshd in no pod."""
    root = tmp_path / "node"
    write_process(root, 100, "python3\0-m\0agent.worker\0",
                  f"4:cpu,cpuacct:/kubepods/pod{ONLINE_UID}/{ONLINE_CID}\n0::/\n", utime=50)
    write_process(root, 200, "python3\0etl_job.py\0",
                  "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                  f"{BATCH_UID.replace('-', '_')}.slice/cri-containerd-{BATCH_CID}.scope\n",
                  utime=900)
    write_process(root, 300, "python3\0tenant_worker.py\0",
                  f"4:cpu,cpuacct:/kubepods/burstable/pod{TENANT_UID}/{TENANT_CID}\n0::/\n",
                  utime=20)
    write_process(root, 400, "/usr/sbin/sshd\0-D\0", "0::/system.slice/ssh.service\n")
    write(root / f"var/log/pods/chat_agent-7d9f-x2_{ONLINE_UID}/agent/0.log", "")
    write(root / f"var/log/pods/batch_etl-7f9c_{BATCH_UID}/etl/0.log", "")
    write(root / f"var/log/pods/tenant-42_report-5c_{TENANT_UID}/worker/0.log", "")
    write(root / f"var/log/pods/tenant-42_report-5c_{TENANT_UID}/sidecar/0.log", "")
    write(root / f"var/log/containers/agent-7d9f-x2_chat_agent-{ONLINE_CID}.log", "")
    write(root / f"var/log/containers/report-5c_tenant-42_worker-{TENANT_CID}.log", "")
    write(root / f"{RUNTIME}/{BATCH_CID}/config.json", json.dumps({
        "ociVersion": "1.1.0", "process": {"env": ["AWS_SECRET_ACCESS_KEY=sk-live-123"]},
        "annotations": {"io.kubernetes.cri.container-name": "etl",
                        "io.kubernetes.cri.sandbox-name": "etl-7f9c",
                        "io.kubernetes.cri.sandbox-namespace": "batch",
                        "io.kubernetes.cri.sandbox-uid": BATCH_UID}}))
    write(root / "var/lib/kubelet/cpu_manager_state", json.dumps({
        "policyName": "static", "defaultCpuSet": "0,2-3",
        "entries": {ONLINE_UID: {"agent": "1"}}, "checksum": 1}))
    return root


def pod_config(**extra):
    return parse_config({"pools": POD_POOLS, "collectors": ["pools"], **extra}, ("pools",))


def test_pools_by_namespace_and_qos_in_the_exporter(tmp_path):
    root = kube_tree(tmp_path)
    got = collect(Exporter(str(root), pod_config()), 1000.0)
    assert got['fleetscope_pool_processes{class="online",pool="online"}'] == 1
    assert got['fleetscope_pool_processes{class="offline",pool="batch"}'] == 1
    assert got['fleetscope_pool_processes{class="offline",pool="tenants"}'] == 1
    assert got['fleetscope_pool_cpu_seconds_total{class="offline",pool="batch"}'] == 9.0
    assert not [k for k in got if "pod=" in k or "namespace=" in k]  # pools aggregate


def test_membership_follows_every_term_and_names_each_pod(tmp_path):
    root = kube_tree(tmp_path)
    tree = RecordedSample(str(root))
    members = {p.pid: p for p in pool_processes(Scrape(tree), pod_config().pools)}
    assert sorted(members) == [100, 200, 300]  # sshd is in no pod
    assert members[200].pod.ref == "batch/etl-7f9c/etl"  # from containerd's annotations
    assert members[300].pod.title == "pod tenant-42/report-5c (Burstable)"
    # a term that does not hold keeps the process out: the sidecar container, another QoS
    narrower = parse_config({"pools": [
        {"name": "t", "class": "offline", "match": {"namespace": "tenant-*",
                                                   "container": "sidecar"}},
        {"name": "g", "class": "online", "match": {"namespace": "batch",
                                                  "qos": "guaranteed"}}]})
    assert pool_processes(Scrape(RecordedSample(str(root))), narrower.pools) == []


def test_a_pod_without_names_still_matches_its_qos_class(tmp_path):
    root = kube_tree(tmp_path)
    shutil.rmtree(root / "var/log")  # no pod log directory mounted
    config = parse_config({"pools": [{"name": "g", "class": "online",
                                      "match": {"qos": "guaranteed"}},
                                     {"name": "chat", "class": "online",
                                      "match": {"namespace": "chat"}}]})
    members = pool_processes(Scrape(RecordedSample(str(root))), config.pools)
    assert [(p.pid, p.pool.name, p.pod.name) for p in members] == [(100, "g", None)]


def test_pod_config_errors_are_one_line():
    for raw, says in (
            ({"pools": [{"name": "a", "class": "online", "match": {"qos": "gold"}}]},
             "pools[0].match.qos must be one of guaranteed, burstable, besteffort"),
            ({"pools": [{"name": "a", "class": "online", "match": {"nmspace": "x"}}]},
             "pools[0].match has unknown keys: nmspace"),
            ({"pools": [{"name": "a", "class": "online", "match": {"pod": ""}}]},
             "pools[0].match.pod must be a non-empty glob string"),
            ({"kubernetes": {"pod_logs": "var/log/pods"}},
             "kubernetes.pod_logs must be an absolute path"),
            ({"kubernetes": {"kubelet_dir": "/x"}}, "kubernetes has unknown keys: kubelet_dir")):
        with pytest.raises(ConfigError) as err:
            parse_config(raw)
        assert says in str(err.value) and "\n" not in str(err.value)


def test_a_recorded_bundle_keeps_the_pod_names_it_saw_redacted(tmp_path):
    root = kube_tree(tmp_path)
    config = parse_config({"pools": POD_POOLS, "redact": ["tenant-[0-9]+"]})
    out = tmp_path / "bundle"
    record(str(out), 0, 1.0, config, evidence_source(str(root)))
    sample = out / "samples" / "s0000"
    text = "\n".join(str(p.relative_to(sample)) for p in sample.rglob("*"))
    assert f"batch_etl-7f9c_{BATCH_UID}/etl" in text and "agent-7d9f-x2_chat_agent-" in text
    assert "tenant-42" not in text and "<redacted>" in text  # the config's redact: pattern
    assert not list(sample.rglob("0.log"))  # directories only, no log content
    spec = json.loads((sample / RUNTIME / BATCH_CID / "config.json").read_text())
    assert spec == {"annotations": {"io.kubernetes.cri.sandbox-namespace": "batch",
                                    "io.kubernetes.cri.sandbox-name": "etl-7f9c",
                                    "io.kubernetes.cri.sandbox-uid": BATCH_UID,
                                    "io.kubernetes.cri.container-name": "etl"}}
    assert "sk-live" not in "".join(p.read_text(errors="replace")
                                    for p in sample.rglob("*") if p.is_file())
    assert (sample / "var/lib/kubelet/cpu_manager_state").is_file()
    # `bundle show` counts the pod names redacted apart from command-line arguments
    meta = json.loads((out / "meta.json").read_text())
    assert meta["redacted"]["pod_names"] >= 1, meta["redacted"]
    shown = subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "show", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert f"{meta['redacted']['pod_names']} pod names" in shown.stdout, shown.stdout
    # Replayed: the pools by QoS and namespace hold; the redacted namespace no longer
    # matches its glob (the price of redaction), the Burstable pod is still known by class.
    with open_bundle(str(out)) as bundle:
        replay = bundle.config()
        scrape = Scrape(bundle.source(bundle.samples[0]))
        members = {p.pid: p for p in pool_processes(scrape, replay.pools)}
    assert {pid: p.pool.name for pid, p in members.items()} == {100: "online", 200: "batch"}
    assert members[100].pod.ref == "chat/agent-7d9f-x2/agent"


def test_bundle_replay_in_the_exporter_matches_pools_by_pod(tmp_path, exporter_factory):
    root = kube_tree(tmp_path)
    config = parse_config({"pools": POD_POOLS})
    out = tmp_path / "bundle"
    record(str(out), 0, 1.0, config, evidence_source(str(root)))
    exporter = exporter_factory(out / "samples" / "s0000",
                                {"pools": POD_POOLS, "collectors": ["pools"]})
    got = samples(exporter.text())
    for pool, workload_class in (("online", "online"), ("batch", "offline"),
                                 ("tenants", "offline")):
        key = f'fleetscope_pool_processes{{class="{workload_class}",pool="{pool}"}}'
        assert got[key] == 1, key


def test_findings_name_the_pods_of_their_pids_and_cgroups(tmp_path):
    from diagnose.engine import SUBJECT_KINDS, Finding
    from fleetscope.rules.catalog import CATALOG

    root = kube_tree(tmp_path)
    config = pod_config()
    rule = next(r for r in CATALOG if r.id == "offline-preemption")
    finding = Finding(rule, "node", {"pool": "online"}, 0.3, 0.8)
    finding.subjects["pids"] = [200, 400]
    finding.subjects["cgroups"] = [f"/kubepods/burstable/pod{TENANT_UID}"]
    scrape = Scrape(RecordedSample(str(root)))
    pods_module.add_pod_subjects((scrape, scrape), config, finding)
    assert "pods" in SUBJECT_KINDS
    assert finding.to_json()["subjects"]["pods"] == ["batch/etl-7f9c/etl",
                                                     "tenant-42/report-5c"]


def test_the_kubernetes_collector_reports_the_kubelets_decisions_per_pool(tmp_path):
    root = kube_tree(tmp_path)
    config = parse_config({"pools": POD_POOLS}, ())
    got = collect(Exporter(str(root), config), 1000.0)
    assert got["fleetscope_kubernetes_pods"] == 3
    assert got['fleetscope_kubernetes_cpu_manager_policy_info{policy="static"}'] == 1
    assert got["fleetscope_kubernetes_exclusive_cpus"] == 1
    assert got['fleetscope_pool_exclusive_cpus{class="online",pool="online"}'] == 1
    assert got['fleetscope_pool_exclusive_cpus{class="offline",pool="batch"}'] == 0
    source = 'fleetscope_scrape_source_available{{collector="kubernetes",source="{}"}}'
    assert got[source.format("pod_logs")] == 1 == got[source.format("cpu_manager_state")]
    assert got[source.format("memory_manager_state")] == 0  # this node's kubelet has none
    assert got['fleetscope_scrape_collector_success{collector="kubernetes"}'] == 1


def test_missing_kubelet_files_say_which_mount_is_needed(tmp_path, caplog):
    # diagnose and the console quieten the exporter's logger in-process; the exporter speaks
    caplog.set_level(logging.WARNING, logger="fleetscope.exporter")
    root = kube_tree(tmp_path)
    shutil.rmtree(root / "var")
    got = collect(Exporter(str(root), parse_config({"pools": POD_POOLS})), 1000.0)
    source = 'fleetscope_scrape_source_available{{collector="kubernetes",source="{}"}}'
    assert got[source.format("pod_logs")] == 0 == got[source.format("cpu_manager_state")]
    assert got['fleetscope_scrape_collector_success{collector="kubernetes"}'] == 1
    said = caplog.text
    for path in ("/var/log/pods", "/var/lib/kubelet/cpu_manager_state"):
        assert f"mount the node's {path} read-only" in said, path
    # the pools still match by QoS class without the names
    assert got['fleetscope_pool_processes{class="online",pool="online"}'] == 1


def test_a_node_without_kubernetes_runs_no_kubernetes_collector(tmp_path):
    root = kube_tree(tmp_path)
    plain = parse_config({"pools": [{"name": "etl", "class": "offline",
                                     "match": {"cmdline": "etl"}}]})
    got = collect(Exporter(str(root), plain), 1000.0)
    assert not [k for k in got if "kubernetes" in k or "exclusive" in k]
    configured = parse_config({"kubernetes": {"pod_logs": "/var/log/pods"}})
    assert "kubernetes" in [c.name for c in Exporter(str(root), configured).collectors]


def test_the_example_config_makes_guaranteed_pods_online_and_besteffort_offline(tmp_path):
    from fleetscope.core.config import load_config

    config = load_config(str(Path(__file__).resolve().parent.parent / "examples" /
                              "kubernetes-pools.yaml"))
    root = kube_tree(tmp_path)
    tree = RecordedSample(str(root))
    members = {p.pid: p.pool for p in pool_processes(Scrape(tree), config.pools)}
    assert (members[100].name, members[100].workload_class) == ("online-guaranteed", "online")
    assert (members[200].name, members[200].workload_class) == ("offline-besteffort",
                                                                "offline")
    assert 300 not in members and 400 not in members  # Burstable outside cs-*, and sshd


def test_pod_notes_say_what_the_kubelet_gave_each_pod(tmp_path):
    from diagnose.enrich import Enricher

    root = kube_tree(tmp_path)
    write(root / "var/lib/kubelet/memory_manager_state", json.dumps({
        "policyName": "Static", "machineState": {},
        "entries": {ONLINE_UID: {"agent": [{"numaAffinity": [0], "type": "memory",
                                            "size": 1 << 30}]}}, "checksum": 7}))
    ctx = Enricher(pod_config(), RecordedSample(str(root)), RecordedSample(str(root)))
    assert pods_module.pod_notes(ctx, [100, 200, 400], memory=True) == [
        "pod chat/agent-7d9f-x2 (Guaranteed): exclusive CPUs 1 (static CPU manager), memory "
        "on NUMA node 0 (memory manager)",
        "pod batch/etl-7f9c (BestEffort): no exclusive CPUs (static CPU manager; not a "
        "Guaranteed pod with an integer CPU request)"]
    assert ctx.describe(200).startswith("pod batch/etl-7f9c (BestEffort), pid 200 (")
    (root / "var/lib/kubelet/cpu_manager_state").write_text(
        '{"policyName":"none","defaultCpuSet":"","checksum":1}')
    ctx = Enricher(pod_config(), RecordedSample(str(root)), RecordedSample(str(root)))
    assert "no exclusive CPUs (CPU manager policy none" in pods_module.pod_notes(ctx, [100])[0]
    (root / "var/lib/kubelet/cpu_manager_state").unlink()
    ctx = Enricher(pod_config(), RecordedSample(str(root)), RecordedSample(str(root)))
    assert "exclusive CPUs unknown: /var/lib/kubelet/cpu_manager_state not available" in \
        pods_module.pod_notes(ctx, [100])[0]


FUZZED = {
    "pod_cgroup": (kp.parse_pod_cgroup, CGROUP_SAMPLES[3][1]),
    "cpu_manager_state": (kp.parse_cpu_manager_state,
                          '{"policyName":"static","defaultCpuSet":"0-7,16-55","entries":'
                          '{"b0e4cb0d-47b0-4ed3-b707-4baf7eb0875a":{"nf":"8-15,56-63"}},'
                          '"checksum":2824956018}'),
    "memory_manager_state": (kp.parse_memory_manager_state,
                             '{"policyName":"Static","entries":{"u":{"c":[{"numaAffinity":'
                             '[0],"type":"memory","size":1}]}},"checksum":1}'),
    "oci_annotations": (kp.parse_oci_annotations,
                        '{"annotations":{"io.kubernetes.pod.namespace":"batch",'
                        '"io.kubernetes.pod.name":"etl","io.kubernetes.container.name":"c"}}'),
}
test_parsers_fuzzed, test_real_samples_cut_and_corrupted = parser_fuzz_tests(
    FUZZED, st.sampled_from([s for _, s in FUZZED.values()]), examples=100)


def test_summaries_name_a_process_by_its_pod(tmp_path):
    from diagnose.enrich import Enricher

    root = kube_tree(tmp_path)
    ctx = Enricher(pod_config(), RecordedSample(str(root)), RecordedSample(str(root)))
    assert ctx.who(200) == "pod batch/etl-7f9c (BestEffort) pid 200"
    assert ctx.who(400) == "pid 400"  # sshd: in no pod, named as before
