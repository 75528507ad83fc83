"""`fleetscope diagnose` and bundles: contract JSON, exit codes, bad input in one line."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile

import jsonschema
import pytest

from tests.conftest import BUNDLES, require_tool
from tests.diagnosis_schema import diagnosis_schema


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fleetscope", *args], capture_output=True,
                          text=True, timeout=timeout)


def _one_error_line(result, code=3):
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
def test_bundle_diagnosis_json_follows_the_contract(bundle):
    result = _run("diagnose", "--bundle", str(BUNDLES / bundle), "--json")
    document = json.loads(result.stdout)
    jsonschema.validate(document, diagnosis_schema())
    assert document["source"] == "bundle"
    assert document["window"]["start"] < document["window"]["end"]
    expected = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}[document["status"]]
    assert result.returncode == expected
    severities = [f["severity"] for f in document["findings"]]
    rank = {"critical": 0, "warning": 1, "info": 2}
    assert severities == sorted(severities, key=rank.get)  # most important first


def test_tar_gz_bundle_reads_like_the_directory(tmp_path):
    archive = tmp_path / "b.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(BUNDLES / "kunpeng-128", arcname="kunpeng-128")
    from_tar = json.loads(_run("diagnose", "--bundle", str(archive), "--json").stdout)
    from_dir = json.loads(_run("diagnose", "--bundle", str(BUNDLES / "kunpeng-128"),
                               "--json").stdout)
    assert from_tar == from_dir


def test_missing_bundle(tmp_path):
    line = _one_error_line(_run("diagnose", "--bundle", str(tmp_path / "nope")))
    assert "no such bundle" in line


def test_corrupt_and_truncated_archives(tmp_path):
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        tar.add(BUNDLES / "x86-256", arcname=".")
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip" * 50)
    for path in (truncated, garbage):
        assert "bundle" in _one_error_line(_run("diagnose", "--bundle", str(path)))


def test_foreign_archive_and_wrong_format_version(tmp_path):
    foreign = tmp_path / "foreign.tar.gz"
    with tarfile.open(foreign, "w:gz") as tar:
        data = b"hello"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert "no meta.json" in _one_error_line(_run("diagnose", "--bundle", str(foreign)))
    copy = tmp_path / "v2"
    shutil.copytree(BUNDLES / "kunpeng-128", copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["format"] = "fleetscope-bundle/2"
    (copy / "meta.json").write_text(json.dumps(meta))
    assert "fleetscope-bundle/2" in _one_error_line(_run("diagnose", "--bundle", str(copy)))


def test_archive_members_escaping_the_target_are_refused(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(BUNDLES / "kunpeng-128" / "meta.json", arcname="meta.json")
        data = b"owned"
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    line = _one_error_line(_run("diagnose", "--bundle", str(evil)))
    assert "refused" in line
    assert not (tmp_path.parent / "escaped.txt").exists()
    link = tmp_path / "link.tar.gz"
    with tarfile.open(link, "w:gz") as tar:
        info = tarfile.TarInfo("meta.json")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    assert "refused" in _one_error_line(_run("diagnose", "--bundle", str(link)))


def test_sample_directory_outside_the_bundle(tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(BUNDLES / "kunpeng-128", copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["samples"][0]["dir"] = "../../etc"
    (copy / "meta.json").write_text(json.dumps(meta))
    assert "outside the bundle" in _one_error_line(_run("diagnose", "--bundle", str(copy)))


def test_bad_config_yaml(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("pools: [unclosed\n")
    line = _one_error_line(_run("diagnose", "--bundle", str(BUNDLES / "kunpeng-128"),
                                "--config", str(config)))
    assert "not valid YAML" in line


def test_prometheus_unreachable_is_exit_3():
    line = _one_error_line(_run("diagnose", "--prometheus", "http://127.0.0.1:9", "--fleet"))
    assert "unreachable" in line


def test_record_show_diagnose_round_trip(tmp_path):
    bundle = tmp_path / "live.tar.gz"
    recorded = _run("bundle", "record", "--seconds", "2", "--interval", "1", "-o", str(bundle))
    assert recorded.returncode == 0, recorded.stderr
    shown = _run("bundle", "show", str(bundle))
    assert shown.returncode == 0 and "samples" in shown.stdout
    assert "3, one every 1 s asked; gaps " in shown.stdout
    result = _run("diagnose", "--bundle", str(bundle), "--json")
    document = json.loads(result.stdout)
    jsonschema.validate(document, diagnosis_schema())
    assert result.returncode in (0, 1, 2)


def test_exported_rules_pass_promtool(tmp_path):
    promtool = require_tool("promtool")
    path = tmp_path / "fleetscope.rules.yml"
    assert _run("rules", "export", "-o", str(path)).returncode == 0
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    import yaml

    for rule in yaml.safe_load(path.read_text())["groups"][0]["rules"]:
        assert rule["labels"]["fleetscope_rule"] and rule["labels"]["severity"]
        assert rule["annotations"]["runbook_url"].endswith(
            f"{rule['labels']['fleetscope_rule']}.md")
