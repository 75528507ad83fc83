"""Bundles whose every item is under its own cap but whose whole is not (issue #37): a tar
header that declares a huge GNU long name, hundreds of thousands of samples, expositions of
hundreds of thousands of series. Each ends in bounded time and memory: exit 3 with one line
naming the limit, or a diagnosis without what was over it.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile

from tests.hostile_corpus import FIXTURE, run

MIB = 1024 * 1024
RSS_CAP_MIB = 400  # as tests/test_hostile_inputs.py


def _refused(result, *words: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1, [line[:300] for line in lines]
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0][:600]
    return lines[0]


def _long_name_archive(path, name_size: int, prefix: bytes = b"") -> None:
    """A .tar.gz whose first member's name comes from a GNU long-name header (type L) of
    `name_size` bytes, streamed so the test never holds it."""
    header = tarfile.TarInfo("././@LongLink")
    header.type = tarfile.GNUTYPE_LONGNAME
    header.size = name_size
    member = tarfile.TarInfo("meta.json")
    member.size = 4
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(header.tobuf(tarfile.GNU_FORMAT))
        out.write(prefix)
        left = name_size - len(prefix)
        block = b"a" * MIB
        while left > 0:
            out.write(block[:min(left, MIB)])
            left -= min(left, MIB)
        out.write(b"\0" * (-name_size % 512))
        out.write(member.tobuf(tarfile.GNU_FORMAT))
        out.write(b"evil" + b"\0" * 508)
        out.write(b"\0" * 1024)


def test_a_huge_gnu_long_name_is_refused_before_it_is_read(tmp_path):
    archive = tmp_path / "long-name.tar.gz"
    _long_name_archive(archive, 512 * MIB)
    assert archive.stat().st_size < 8 * MIB
    for argv in (["diagnose", "--bundle", str(archive)], ["bundle", "show", str(archive)]):
        result = run(argv, timeout=120)
        line = _refused(result, "limit")
        assert len(line) < 600
        assert result.max_rss_mib < RSS_CAP_MIB, result.max_rss_mib


def test_long_member_names_are_cut_in_errors(tmp_path):
    archive = tmp_path / "long-traversal.tar.gz"
    _long_name_archive(archive, 100_000, prefix=b"../")
    line = _refused(run(["diagnose", "--bundle", str(archive)], timeout=60), "outside")
    assert len(line) < 600, len(line)


def _copy_fixture(tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(FIXTURE, bundle)
    return bundle, json.loads((bundle / "meta.json").read_text())


def test_hundreds_of_thousands_of_samples_are_refused(tmp_path):
    """300,000 samples naming one directory: 13 MB of meta.json."""
    bundle, meta = _copy_fixture(tmp_path)
    meta["samples"] = [{"dir": "samples/s0000", "time": 1764660000.0 + i}
                       for i in range(300_000)]
    (bundle / "meta.json").write_text(json.dumps(meta))
    result = run(["diagnose", "--bundle", str(bundle)], timeout=60)
    _refused(result, "samples", "limit")
    assert result.max_rss_mib < RSS_CAP_MIB, result.max_rss_mib


def test_samples_naming_one_directory_are_refused(tmp_path):
    bundle, meta = _copy_fixture(tmp_path)
    meta["samples"] = [{"dir": "samples/s0000", "time": 1764660000.0 + i} for i in range(3)]
    (bundle / "meta.json").write_text(json.dumps(meta))
    _refused(run(["diagnose", "--bundle", str(bundle)], timeout=60), "samples[1]", "samples[0]")


def _with_samples(bundle, meta, count: int):
    first = meta["samples"][-1]
    for index in range(len(meta["samples"]), count):
        directory = f"samples/s{index:04d}"
        shutil.copytree(bundle / first["dir"], bundle / directory, symlinks=True)
        meta["samples"].append({"dir": directory, "time": first["time"] + 15.0 * index})
    (bundle / "meta.json").write_text(json.dumps(meta))


def test_agent_expositions_of_hundreds_of_thousands_of_series(tmp_path):
    """8 samples with a 15 MB agent.prom each (260,000 series): each exposition is refused
    by its count of series before it is parsed, as a corrupt file is (the agent rules are
    not evaluated, saying why), and the rest of the bundle is diagnosed."""
    bundle, meta = _copy_fixture(tmp_path)
    _with_samples(bundle, meta, 8)
    text = "".join(f'agent_queue_depth{{pool="chat-online",queue="q{i:08d}"}} 1\n'
                   for i in range(260_000))
    first = bundle / meta["samples"][0]["dir"] / "agent.prom"
    first.write_text(text)
    assert 15 * 1000 * 1000 < first.stat().st_size < 16 * MIB
    for sample in meta["samples"][1:]:  # copies: one file's parse is not reused
        shutil.copyfile(first, bundle / sample["dir"] / "agent.prom")
    result = run(["diagnose", "--bundle", str(bundle), "--json"], timeout=60)
    assert result.returncode in (0, 1, 2), (result.returncode, result.stderr[-2000:])
    assert result.max_rss_mib < RSS_CAP_MIB, result.max_rss_mib
    reasons = " ".join(item["reason"] for item in json.loads(result.stdout)["not_evaluated"])
    assert "agent.prom that could be read" in reasons and "20000 series" in reasons, reasons


AGENT_RULES = ("queue-backlog", "session-affinity-loss", "quantization-tool-errors",
               "cold-start")


def test_agent_series_over_the_bundles_limit_cost_the_agent_rules_only(tmp_path):
    """Expositions each under their own cap, together over the bundle's: 8 samples of
    19,000 series each, every sample's series new. Only the agent rules depend on them: those
    are not evaluated, their reason naming the limit, and the rest is diagnosed as the same
    bundle without agent.prom is."""
    bundle, meta = _copy_fixture(tmp_path)
    _with_samples(bundle, meta, 8)
    plain = run(["diagnose", "--bundle", str(bundle), "--json"], timeout=120)
    assert plain.returncode in (0, 1, 2), (plain.returncode, plain.stderr[-2000:])
    for index, sample in enumerate(meta["samples"]):
        (bundle / sample["dir"] / "agent.prom").write_text("".join(
            f'agent_queue_depth{{pool="chat-online",queue="s{index}-{i}"}} 1\n'
            for i in range(19_000)))
    result = run(["diagnose", "--bundle", str(bundle), "--json"], timeout=120)
    assert result.returncode == plain.returncode, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert result.max_rss_mib < RSS_CAP_MIB, result.max_rss_mib
    document, expected = json.loads(result.stdout), json.loads(plain.stdout)
    assert [f["rule"] for f in document["findings"]] == \
        [f["rule"] for f in expected["findings"]]
    reasons = {item["rule"]: item["reason"] for item in document["not_evaluated"]}
    for rule in AGENT_RULES:
        assert "100000 series" in reasons.get(rule, ""), (rule, reasons.get(rule))
        assert "series limit of a bundle" in reasons[rule], reasons[rule]
    assert {item["rule"] for item in document["not_evaluated"]} == \
        {item["rule"] for item in expected["not_evaluated"]}


def test_record_refuses_to_make_a_bundle_over_the_samples_limit(tmp_path):
    """What `bundle record` writes, `diagnose --bundle` reads: a day at 1 s is refused."""
    output = tmp_path / "day.tar.gz"
    result = run(["bundle", "record", "--seconds", "86400", "--interval", "1", "-o",
                  str(output)], timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, lines)
    assert "86401 samples" in lines[0] and "10000" in lines[0]
    assert not output.exists()


def test_a_bundle_over_the_series_limit_without_agent_series_is_refused(monkeypatch):
    """The node's own series are bounded by the collectors' label caps, far under the
    limit; a bound lowered under what a scenario holds stands for a bundle that still has
    too many once the agent series are gone: refused, naming the limit, not diagnosed in
    part."""
    import pytest

    from fleetscope.bundle.read import BundleError, open_bundle
    from fleetscope.diagnose import evidence
    from tests.conftest import SCENARIOS

    monkeypatch.setattr(evidence, "MAX_SERIES", 50)
    with open_bundle(str(SCENARIOS / "healthy-idle")) as bundle, \
            pytest.raises(BundleError, match=r"series, over the 50 of a bundle \(the series "
                          r"limit of a bundle\)"):
        evidence.bundle_series(bundle, bundle.config())
