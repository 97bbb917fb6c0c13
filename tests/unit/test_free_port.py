"""The suite's port picker: a port it hands out must not be one the kernel may give an outgoing connection, nor one
another xdist worker or a listener holds (CI lost the operator's health port to such a race)."""

from __future__ import annotations

import socket

import suite_helpers
from suite_helpers import _ephemeral_ports, free_port


def test_ports_lie_below_the_ephemeral_range_and_do_not_repeat(monkeypatch):
    monkeypatch.setattr(suite_helpers, "_next_port", {})
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50, ports
    assert all(1024 <= p < _ephemeral_ports().start for p in ports), ports


def test_each_worker_has_its_own_block(monkeypatch):
    seen = {}
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(suite_helpers, "_next_port", {})
        seen[worker] = {free_port() for _ in range(20)}
    for a, ports_a in seen.items():
        for b, ports_b in seen.items():
            assert a == b or not ports_a & ports_b, (a, b, ports_a & ports_b)


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    monkeypatch.setattr(suite_helpers, "_next_port", {})
    first = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", first + 1))
        listener.listen()
        monkeypatch.setattr(suite_helpers, "_next_port", {})
        assert free_port() == first  # the same start in a fresh process...
        assert free_port() != first + 1  # ...and the next one steps over the listener
