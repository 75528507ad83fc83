"""`fleetscope isa fleet --prometheus URL` and `fleetscope isa check BINARY --prometheus URL`:
the fleet's instruction sets, before a deploy.

Reads what every node's exporter reports (two instant queries, one series per node):

    fleetscope_cpu_features_info{instance, arch, fingerprint, features | isa_level}
    fleetscope_cpu_info{instance, model_name, variant, revision | family, model, stepping}

`isa fleet` lists each distinct feature set with its node count and CPU models/steppings,
their common baseline and the compiler target every node can run (`-march=x86-64-vN`, or
`-march=armv8-a+...` with the extensions all nodes have). `isa check BINARY --prometheus URL`
checks the binary against each feature set (fleetscope/tools/isa.py's own check) and names the
node groups that lack what it uses: exit 0 every node can run it, 1 some would crash
(SIGILL), 2 usage error, 3 input error or the query engine unreachable.

x86 nodes report their psABI level, not every flag: their group is checked against the
flags that level implies, so an extension beyond the level (AVX-512 VNNI, AMX) reads as
missing there — said in the output.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from fleetscope.collectors.parsers.cpuinfo import PSABI_LEVEL_FLAGS, parse_cpuinfo
from fleetscope.diagnose.fleet_findings import cpu_name
from fleetscope.diagnose.remote import QueryClient, RemoteError, labels_of

EXIT_OK, EXIT_MISSING, EXIT_USAGE, EXIT_INPUT = 0, 1, 2, 3
FORMAT = "fleetscope-isa-fleet/1"
# arm64 /proc/cpuinfo Features -> GCC -march extension (gcc/config/aarch64/
# aarch64-option-extensions.def); features without an extension of their own are implied
# by the architecture version or not selectable.
A64_MARCH = (
    ("crc32", "crc"), ("atomics", "lse"), ("asimdrdm", "rdma"), ("fphp", "fp16"),
    ("asimddp", "dotprod"), ("asimdfhm", "fp16fml"), ("aes", "aes"), ("sha2", "sha2"),
    ("sha3", "sha3"), ("sm4", "sm4"), ("lrcpc", "rcpc"), ("sve", "sve"), ("sve2", "sve2"),
    ("i8mm", "i8mm"), ("bf16", "bf16"), ("flagm", "flagm"), ("sb", "sb"), ("ssbs", "ssbs"),
    ("rng", "rng"), ("paca", "pauth"), ("mte", "memtag"),
)


@dataclass
class FeatureSet:
    arch: str
    fingerprint: str
    features: tuple[str, ...]  # arm64 Features, or the flags an x86 psABI level implies
    isa_level: str = ""  # x86 only
    nodes: list[str] = field(default_factory=list)
    cpus: dict[str, int] = field(default_factory=dict)  # model and stepping -> nodes

    def to_json(self) -> dict:
        out = {"arch": self.arch, "fingerprint": self.fingerprint, "nodes": len(self.nodes),
               "cpus": [{"cpu": cpu, "nodes": n} for cpu, n in sorted(self.cpus.items())],
               "features": list(self.features)}
        if self.isa_level:
            out["isa_level"] = self.isa_level
        return out


def _level_flags(name: str) -> tuple[str, ...]:
    flags: set[str] = set()
    for level, needed in PSABI_LEVEL_FLAGS:
        flags |= needed
        if level == name:
            return tuple(sorted(flags))
    return ()


def feature_sets(client: QueryClient, at: float) -> list[FeatureSet]:
    """The fleet's distinct feature sets, most nodes first."""
    cpus = {}
    for series in client.query("fleetscope_cpu_info", at):
        labels = dict(labels_of(series))
        if "instance" in labels:
            cpus[labels["instance"]] = cpu_name(labels)
    groups: dict[tuple[str, str], FeatureSet] = {}
    for series in client.query("fleetscope_cpu_features_info", at):
        labels = dict(labels_of(series))
        node = labels.get("instance")
        if not node:
            continue
        arch = labels.get("arch", "unknown")
        level = labels.get("isa_level", "")
        features = tuple(labels["features"].split()) if "features" in labels \
            else _level_flags(level)
        key = (arch, labels.get("fingerprint", "") or " ".join(features))
        group = groups.setdefault(key, FeatureSet(arch, key[1], features, level))
        group.nodes.append(node)
        cpu = cpus.get(node, "unknown CPU")
        group.cpus[cpu] = group.cpus.get(cpu, 0) + 1
    return sorted(groups.values(), key=lambda g: (-len(g.nodes), g.fingerprint))


def baseline(groups: list[FeatureSet]) -> dict:
    """What every node has, and the compiler target that runs everywhere (per arch)."""
    out = {}
    for arch in sorted({g.arch for g in groups}):
        same = [g for g in groups if g.arch == arch]
        common = set(same[0].features).intersection(*(set(g.features) for g in same[1:]))
        entry = {"nodes": sum(len(g.nodes) for g in same),
                 "features": [f for f in same[0].features if f in common]}
        if arch == "x86_64":
            levels = [name for name, _ in PSABI_LEVEL_FLAGS]
            lowest = min((g.isa_level for g in same if g.isa_level in levels),
                         key=levels.index, default="x86-64")
            entry["march"] = f"-march={lowest}"
        elif arch == "aarch64":
            extensions = [ext for feature, ext in A64_MARCH if feature in common]
            entry["march"] = "-march=armv8-a" + "".join(f"+{e}" for e in extensions)
        out[arch] = entry
    return out


def cpuinfo_text(group: FeatureSet) -> str:
    """The group's CPU as /proc/cpuinfo text, for fleetscope/tools/isa.py's check."""
    if group.arch == "aarch64":
        return (f"processor\t: 0\nFeatures\t: {' '.join(group.features)}\n"
                "CPU implementer\t: 0x00\nCPU architecture: 8\nCPU variant\t: 0x0\n"
                "CPU part\t: 0x000\nCPU revision\t: 0\n\n")
    return (f"processor\t: 0\nvendor_id\t: unknown\nmodel name\t: {group.fingerprint}\n"
            f"flags\t\t: {' '.join(group.features)}\n\n")


def check_binary(path: str, groups: list[FeatureSet]) -> dict:
    """Which node groups lack what the binary uses."""
    from fleetscope.tools import isa

    scan = isa.scan_binary(path)
    out = []
    for group in groups:
        result = isa.to_json(isa.check(scan, parse_cpuinfo(cpuinfo_text(group)),
                                       f"fleet group {group.fingerprint}"))
        out.append({**group.to_json(), "missing": result["missing"],
                    "arch_mismatch": result["arch_mismatch"],
                    "isa_level_missing": result["isa_level_missing"],
                    "can_run": not (result["missing"] or result["arch_mismatch"]
                                    or result["isa_level_missing"])})
    return {"binary": path, "arch": scan.arch, "uses": sorted(scan.uses), "groups": out,
            "nodes_that_would_crash": sum(g["nodes"] for g in out if not g["can_run"])}


def _parser(check: bool) -> argparse.ArgumentParser:
    prog = "fleetscope isa check" if check else "fleetscope isa fleet"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    if check:
        parser.add_argument("binary", metavar="BINARY")
    parser.add_argument("--prometheus", metavar="URL", required=True,
                        help="the fleet's Prometheus (or a server speaking its query API)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="deadline for the queries (default 30)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _cpus_text(group: dict) -> str:
    return ", ".join(f"{c['cpu']} ({c['nodes']:,})" for c in group["cpus"])


def run(argv: list[str], check: bool) -> int:
    import time

    try:
        args = _parser(check).parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    name = "isa check" if check else "isa fleet"
    try:
        groups = feature_sets(QueryClient(args.prometheus, args.timeout), time.time())
        if not groups:
            raise RemoteError(f"no fleetscope_cpu_features_info series at {args.prometheus}")
        document = {"format": FORMAT, "groups": [g.to_json() for g in groups],
                    "baseline": baseline(groups)}
        if check:
            from fleetscope.tools.isa import InputError

            try:
                document["check"] = check_binary(args.binary, groups)
            except InputError as err:
                raise RemoteError(str(err)) from None
    except RemoteError as err:
        print(f"fleetscope {name}: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    if args.json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(_table(document))
    if check:
        return EXIT_MISSING if document["check"]["nodes_that_would_crash"] else EXIT_OK
    return EXIT_OK


def _table(document: dict) -> str:
    lines = []
    if "check" in document:
        result = document["check"]
        crash = result["nodes_that_would_crash"]
        lines.append(f"{result['binary']} ({result['arch']}) uses: "
                     f"{', '.join(result['uses']) or 'nothing beyond the baseline'}")
        for group in result["groups"]:
            verdict = "ok" if group["can_run"] else (
                "lacks " + (", ".join(group["missing"]) or "the architecture or ISA level"))
            lines.append(f"  {group['nodes']:>7,} nodes  {_cpus_text(group)}: {verdict}")
        lines.append(f"{crash:,} nodes would crash (SIGILL)" if crash
                     else "every node can run it")
    else:
        lines.append(f"{len(document['groups'])} feature sets:")
        for group in document["groups"]:
            level = f" {group['isa_level']}" if group.get("isa_level") else ""
            lines.append(f"  {group['nodes']:>7,} nodes  {group['arch']}{level} "
                         f"[{group['fingerprint']}]  {_cpus_text(group)}")
        for arch, entry in document["baseline"].items():
            lines.append(f"baseline {arch} ({entry['nodes']:,} nodes): {entry['march']}")
            lines.append(f"  features all nodes have: {' '.join(entry['features'])}")
    if any(g.get("isa_level") for g in document["groups"]):
        lines.append("(x86 groups judged by their psABI level's flags)")
    return "\n".join(lines) + "\n"
