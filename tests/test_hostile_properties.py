"""Property tests over the shapes hostile input takes: meta.json, config YAML and Prometheus
JSON answers. Whatever the shape, the only exceptions that leave the reader are its own
one-line errors (BundleError, ConfigError, PrometheusError). Plus the reading layer's own
refusals: paths climbing out of a root, links out, FIFOs, devices and oversized files.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleetscope.bundle.read import BundleError, open_bundle
from fleetscope.bundle.show import describe
from fleetscope.collectors.base import NotAvailable, RefusedPath, Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.source import LiveHost, RecordedSample
from fleetscope.core.bundle_format import BUNDLE_FORMAT
from fleetscope.core.config import _KNOWN_KEYS, ConfigError, load_config, parse_config
from fleetscope.diagnose.prometheus import PrometheusError, add_matrix, parse_answer
from fleetscope.rules.promql import Series

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                    st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20)


def _maybe(strategy):
    return st.one_of(strategy, json_values)


samples = st.lists(_maybe(st.fixed_dictionaries({
    "dir": _maybe(st.sampled_from(["samples/s0000", "samples/s0001", "../..", "/etc", ""])),
    "time": _maybe(st.floats(allow_nan=True, allow_infinity=True)),
})), max_size=3)
metas = st.fixed_dictionaries({}, optional={
    "format": _maybe(st.just(BUNDLE_FORMAT)),
    "hostname": json_values,
    "interval_s": _maybe(st.floats(allow_nan=True, allow_infinity=True)),
    "samples": _maybe(samples),
    "config": _maybe(st.fixed_dictionaries({}, optional={"pools": json_values,
                                                          "per_core": json_values})),
    "redacted": json_values,
})


def _one_sample_at(when: float) -> dict:
    return {"format": BUNDLE_FORMAT, "samples": [{"dir": "samples/s0000", "time": when}]}


@SETTINGS
@given(meta=st.one_of(metas, json_values))
# Found by this test: sample times past what a date can hold crashed `bundle show`'s window
# (OverflowError, OSError EOVERFLOW, "year 10000 is out of range").
@example(meta=_one_sample_at(9.223372036854776e+18))
@example(meta=_one_sample_at(1e17))
@example(meta=_one_sample_at(253402300800.0))
def test_meta_json_shapes_never_escape(meta):
    with tempfile.TemporaryDirectory() as directory:
        for sample in ("s0000", "s0001"):
            os.makedirs(os.path.join(directory, "samples", sample, "proc"))
        Path(directory, "meta.json").write_text(json.dumps(meta, allow_nan=True))
        try:
            with open_bundle(directory) as bundle:
                for what, value in describe(bundle):
                    assert "\n" not in what + value
                bundle.config()
        except BundleError as err:
            assert "\n" not in str(err)


config_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
              st.floats(allow_nan=True, allow_infinity=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from(
                                ["name", "class", "match", "cgroup", "cmdline", "key", "pool",
                                 "memory_peak_bytes_per_second"]), st.text(max_size=8)),
                                inner, max_size=4)),
    max_leaves=25)
configs = st.dictionaries(st.one_of(st.sampled_from(sorted(_KNOWN_KEYS)), st.text(max_size=8)),
                          config_values, max_size=6)


@SETTINGS
@given(raw=configs)
def test_config_shapes_never_escape(raw):
    try:
        parse_config(raw, ("cpu", "pools"))
    except ConfigError as err:
        assert "\n" not in str(err)


@SETTINGS
@given(text=st.text(max_size=200))
def test_config_text_never_escapes(text):
    _load_config_text(text)


def _load_config_text(text: str) -> None:
    """load_config on a file holding `text`: a ConfigError is fine, nothing else is."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(text)
    try:
        load_config(handle.name)
    except ConfigError:
        pass
    finally:
        os.unlink(handle.name)


@SETTINGS
@given(raw=configs)
def test_config_yaml_roundtrip_never_escapes(raw):
    try:
        text = yaml.safe_dump(raw)
    except (yaml.YAMLError, ValueError):
        return
    _load_config_text(text)


points = st.lists(_maybe(st.lists(_maybe(st.one_of(
    st.floats(min_value=1.7e9, max_value=1.8e9), st.sampled_from(["0.5", "NaN", "+Inf", "x"]))),
    min_size=0, max_size=3)), max_size=4)
rows = st.lists(_maybe(st.fixed_dictionaries({}, optional={
    "metric": _maybe(st.dictionaries(st.sampled_from(["__name__", "instance", "cpu", "pool"]),
                                     json_values, max_size=3)),
    "values": _maybe(points),
})), max_size=4)
answers = st.fixed_dictionaries({}, optional={
    "status": _maybe(st.sampled_from(["success", "error"])),
    "error": json_values,
    "data": _maybe(st.fixed_dictionaries({}, optional={"resultType": json_values,
                                                       "result": _maybe(rows)})),
})


@SETTINGS
@given(document=st.one_of(answers, json_values))
def test_prometheus_answer_shapes_never_escape(document):
    series = Series()
    nodes: set[str] = set()
    try:
        data = parse_answer("http://127.0.0.1:9090", json.dumps(document).encode())
        add_matrix(series, "fleetscope_load1", data, nodes)
    except PrometheusError as err:
        assert "\n" not in str(err)
        return
    for points_ in series.by_name.get("fleetscope_load1", {}).values():
        # values as PromQL has them ("NaN", "+Inf" included), at times a clock can have
        assert all(isinstance(value, float) and 0 <= at_ms < 1e14 for at_ms, value in points_)


@SETTINGS
@given(body=st.binary(max_size=200))
def test_prometheus_raw_bytes_never_escape(body):
    try:
        parse_answer("http://127.0.0.1:9090", body)
    except PrometheusError:
        pass


# -- the reading layer: collectors.base.Scrape ----------------------------------------------
@pytest.fixture
def bundle_root(tmp_path):
    sample = tmp_path / "bundle" / "samples" / "s0000"
    (sample / "cmd" / "isa-check-").mkdir(parents=True)
    (sample / "proc").mkdir()
    (tmp_path / "outside.json").write_text('{"missing": ["OUTSIDE"]}')
    (tmp_path / "bundle" / "meta.json").write_text(json.dumps({"format": BUNDLE_FORMAT}))
    return sample


def test_label_traversal_refused_at_the_reading_layer(bundle_root):
    scrape = Scrape(RecordedSample(str(bundle_root)))
    relative = "cmd/isa-check-" + "/../../../../../outside" + ".json"
    assert os.path.exists(os.path.join(bundle_root, relative))  # the kernel would open it
    with pytest.raises(RefusedPath):
        scrape.read_text(relative)
    with pytest.raises(RefusedPath):
        scrape.read_text("/etc/passwd")
    with pytest.raises(RefusedPath):
        scrape.listdir("proc/../..")


def test_links_out_fifos_and_devices_are_not_read(bundle_root, tmp_path):
    proc = bundle_root / "proc"
    (proc / "loadavg").symlink_to(tmp_path / "outside.json")
    (proc / "stat").symlink_to("/dev/zero")
    os.mkfifo(proc / "pressure")
    (bundle_root / "inside").write_text("0.00 0.01 0.05 1/100 42\n")
    (proc / "meminfo").symlink_to("../inside")  # a link that stays inside is fine
    scrape = Scrape(RecordedSample(str(bundle_root)))
    for name, says in (("loadavg", "a link out"), ("stat", "not a regular file"),
                       ("pressure", "not a regular file")):
        with pytest.raises(NotAvailable, match=says):
            scrape.read_text(f"proc/{name}")
    assert scrape.read_text("proc/meminfo").startswith("0.00")


@pytest.mark.parametrize("opened", ["beneath", "checked"])
def test_openat2_and_the_checked_open_read_and_refuse_alike(bundle_root, tmp_path, opened,
                                                           monkeypatch):
    """A recorded root's files open in one openat2(RESOLVE_BENEATH) call where the kernel
    has it, else through open + the resolved path's check: the same files are read and the
    same refused either way (links out, through a linked directory too, FIFOs, devices)."""
    from fleetscope.collectors import source

    if opened == "beneath":
        assert source._BENEATH is not None and source._BENEATH.call is not None, \
            "openat2 is missing here: the fast path goes untested"
    else:
        monkeypatch.setattr(source, "_BENEATH", None)
    proc = bundle_root / "proc"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stat").write_text("cpu  1 2 3 4\n")
    (proc / "loadavg").symlink_to(outside / "stat")
    (proc / "stat").symlink_to("/dev/zero")
    os.mkfifo(proc / "pressure")
    (proc / "linked").symlink_to(outside)
    (bundle_root / "inside").write_text("0.00 0.01 0.05 1/100 42\n")
    (proc / "meminfo").symlink_to("../inside")  # relative, stays inside
    (proc / "vmstat").symlink_to(bundle_root / "inside")  # absolute, still inside
    scrape = Scrape(RecordedSample(str(bundle_root)))
    for name, says in (("loadavg", "a link out"), ("linked/stat", "a link out"),
                       ("stat", "not a regular file"), ("pressure", "not a regular file")):
        with pytest.raises(NotAvailable, match=says):
            scrape.read_text(f"proc/{name}")
    assert scrape.read_text("proc/meminfo").startswith("0.00")
    assert scrape.read_text("proc/vmstat").startswith("0.00")
    with pytest.raises(NotAvailable, match="does not exist"):
        scrape.read_text("proc/no-such-file")
    with pytest.raises(NotAvailable, match="does not exist"):
        scrape.read_text("proc/meminfo/below-a-file")


def test_oversized_files_are_refused_with_the_limit(bundle_root):
    (bundle_root / "proc" / "loadavg").write_text("1 " * 4096)
    with pytest.raises(ParseError, match="larger than 4096 bytes"):
        Scrape(RecordedSample(str(bundle_root))).read_text("proc/loadavg")


def test_live_root_reads_as_before():
    scrape = Scrape(LiveHost())
    assert scrape.read_text("proc/loadavg").count(" ") >= 4
    assert "cpu" in scrape.read_text("proc/stat")
