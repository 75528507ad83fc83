"""`fleetscope demo` simulates its fleet before it serves: the first visitor's page takes that
snapshot, a Refresh simulates again, and no other source is made ahead."""

from __future__ import annotations

from fleetscope.dashboard import data


def test_the_first_load_takes_the_preloaded_demo_and_a_refresh_simulates_again(monkeypatch):
    made = []
    real = data.load_demo

    def counted(nodes: int):
        made.append(nodes)
        return real(nodes)

    monkeypatch.setattr(data, "load_demo", counted)
    monkeypatch.setattr(data, "_PRELOADED", {})
    data.preload("demo:64")
    assert made == [64]
    first = data.load("demo:64")
    assert made == [64] and len(first.findings) > 0  # no second simulation for the visitor
    again = data.load("demo:64")
    assert made == [64, 64] and again is not first
    data.preload("bundle:/no/such/bundle")  # read when asked, not ahead
    assert data._PRELOADED == {}
