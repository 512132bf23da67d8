"""An agent's default id is stable: from the host, the key and the cache dir, in id characters.

So a restarted agent re-registers the same device ids (the tracker replaces them) instead of adding
rows; agents of one key on one host differ by their cache dirs. No processes, no sockets: the null
backend spawns no executor child.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from device_agent.agent import MAX_AGENT_ID_CHARS, Agent, default_agent_id
from device_agent.config import DEFAULT_CACHE_DIR, AgentConfig
from protos.ids import ID_CHARS, identifier_problem


def agent_id_of(config: AgentConfig) -> tuple[str, tuple[str, ...]]:
    """The agent id and device ids an agent built from `config` has."""
    agent = Agent(config, "127.0.0.1:1")
    try:
        return agent.agent_id, tuple(d.device_id for d in agent.devices)
    finally:
        agent.close()


def host(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: name)


def test_same_host_key_and_cache_give_the_same_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host(monkeypatch, "board7")
    config = AgentConfig(key="arm-a53", backend="null", devices=2, cache_dir=str(tmp_path / "c"))
    first, again = agent_id_of(config), agent_id_of(config)
    assert first == again
    agent_id, devices = first
    assert agent_id.startswith("board7-arm-a53-")  # a non-default cache dir adds its hash
    assert devices == (f"{agent_id}/0", f"{agent_id}/1")
    other_key = agent_id_of(AgentConfig(key="x86", backend="null", cache_dir=config.cache_dir))[0]
    assert other_key.startswith("board7-x86-") and other_key != agent_id
    other_cache = agent_id_of(
        AgentConfig(key="arm-a53", backend="null", cache_dir=str(tmp_path / "d"))
    )[0]
    assert other_cache.startswith("board7-arm-a53-") and other_cache != agent_id


def test_default_cache_dir_gives_hostname_dash_key(monkeypatch: pytest.MonkeyPatch) -> None:
    host(monkeypatch, "board7")
    assert default_agent_id("arm-a53") == "board7-arm-a53"
    assert default_agent_id("arm-a53", DEFAULT_CACHE_DIR + os.sep) == "board7-arm-a53"
    assert default_agent_id("x86") == "board7-x86"


def test_an_explicit_agent_id_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host(monkeypatch, "board7")
    config = AgentConfig(key="k", backend="null", agent_id="mine", cache_dir=str(tmp_path))
    assert agent_id_of(config) == ("mine", ("mine/0",))


@pytest.mark.parametrize(
    ("hostname", "key", "expected"),
    [
        ("lab_box 3", "k", "lab_box-3-k"),
        ("Größe.local", "k", "Gr-e.local-k"),
        ("box", "arm/a53", "box-arm-a53"),  # "/" separates a device's index
        ("  ", "k", "host-k"),
        ("", "k", "host-k"),
        ("db1.example.com:22@x+y", "k", "db1.example.com:22@x+y-k"),
    ],
)
def test_odd_hostnames_and_keys_become_readable_ids(
    monkeypatch: pytest.MonkeyPatch, hostname: str, key: str, expected: str
) -> None:
    host(monkeypatch, hostname)
    assert default_agent_id(key) == expected
    assert set(expected) <= ID_CHARS - {"/"}


def test_long_hostnames_are_cut_and_stay_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = set()
    for last in "ab":
        host(monkeypatch, "n" * 300 + last)
        agent_id = default_agent_id("k", "/srv/kiln/cache")
        assert len(agent_id) <= MAX_AGENT_ID_CHARS
        assert agent_id == default_agent_id("k", "/srv/kiln/cache")
        assert identifier_problem("device id", f"{agent_id}/15") is None
        ids.add(agent_id)
    assert len(ids) == 2


def test_an_agent_on_an_odd_host_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The id the agent makes for itself passes the check the tracker applies at Register."""
    host(monkeypatch, "büro pc (2)" + "x" * 200)
    agent_id, devices = agent_id_of(
        AgentConfig(key="k", backend="null", devices=3, cache_dir=str(tmp_path))
    )
    for value in (agent_id, *devices):
        assert identifier_problem("id", value) is None
