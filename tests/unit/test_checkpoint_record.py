"""The record of a sandbox paused to disk (``agentnest.runtime.docker.checkpoint``), without an engine.

What another process needs to resume it (``Sandbox.from_checkpoint``):
its configuration survives JSON exactly (secrets stay ``Secret``), the file
is root-only and replaced atomically, and every way a record can be wrong
is refused with an error from the AgentNest tree, never a ``KeyError`` or
a path outside the record directory.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from agentnest import ConfigurationError, SandboxDestroyedError, Secret, SnapshotError
from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.policy import NetworkPolicy
from agentnest.runtime.docker import checkpoint

SID = "0123456789ab"


@pytest.fixture(autouse=True)
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Records beside a storage pool under ``tmp_path`` (``record_dir()`` follows ``$AGENTNEST_STORAGE``)."""
    monkeypatch.setenv("AGENTNEST_STORAGE", str(tmp_path / "storage"))
    assert checkpoint.record_dir() == tmp_path / "paused"
    return tmp_path / "paused"


def config(**overrides: Any) -> SandboxConfig:
    fields: dict[str, Any] = {
        "image": "agentnest/base:0.4",
        "lifetime": 600.0,
        "environment": {
            "PLAIN": "p",
            "TOKEN": Secret("s3cr3t-value"),
            "KEY": Secret("-----BEGIN KEY-----\nabc\n", as_file=True),
        },
        "workdir": "/work",
        "limits": ResourceLimits.build(
            memory="1g", cpus=0.5, pids=100, workspace="2g", scratch="32m", workspace_medium="disk"
        ),
        "read_only_root": False,
        "user": "1000:1000",
        "labels": {"team": "agents", "run": "42"},
    }
    fields.update(overrides)
    return SandboxConfig(**fields)


def record(sandbox_id: str = SID, **fields: Any) -> dict[str, Any]:
    return {"sandbox_id": sandbox_id, "paused": True, "owner": "host:1", **fields}


# -- the configuration ------------------------------------------------------------------------


def test_a_config_survives_json() -> None:
    original = config()
    doc = json.loads(json.dumps(checkpoint.config_record(original)))
    back = checkpoint.config_from_record(doc)
    assert back == original
    # Secrets come back as secrets (redacted, and as_file kept), plain values as str.
    assert back.environment["TOKEN"] == Secret("s3cr3t-value")
    assert isinstance(back.environment["KEY"], Secret) and back.environment["KEY"].as_file
    assert type(back.environment["PLAIN"]) is str
    assert back.limits.workspace_medium == "disk" and back.limits.workspace == 2 * 2**30
    assert back.secrets == original.secrets


def test_profiles_rootless_and_defaults_survive_json() -> None:
    for original in (
        SandboxConfig(image="python:3.12-slim"),
        config(
            seccomp_profile='{"defaultAction": "SCMP_ACT_ERRNO"}', apparmor_profile="agentnest", rootless=True
        ),
    ):
        doc = json.loads(json.dumps(checkpoint.config_record(original)))
        assert checkpoint.config_from_record(doc) == original


def test_only_network_denied_configs_are_read_back() -> None:
    doc = checkpoint.config_record(config())
    doc["network"] = NetworkPolicy.allowlist(domains=["example.com"]).mode.value
    with pytest.raises(SnapshotError, match="unusable") as info:
        checkpoint.config_from_record(doc)
    assert info.value.rule == "checkpoint"


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.pop("limits"),
        lambda d: d.pop("environment"),
        lambda d: d["environment"].update(X={"neither": "secret nor value"}),
        lambda d: d["environment"].update(X="not a dict"),
        lambda d: d["limits"].update(bogus=1),
        lambda d: d["limits"].update(memory="lots"),
        lambda d: d.update(user="0"),
        lambda d: d.update(lifetime="forever"),
    ],
    ids=[
        "no-limits",
        "no-environment",
        "env-entry-empty",
        "env-entry-str",
        "unknown-limit",
        "bad-limit",
        "root-user",
        "bad-lifetime",
    ],
)
def test_an_unusable_config_is_a_snapshot_error(damage: Any) -> None:
    doc = json.loads(json.dumps(checkpoint.config_record(config())))
    damage(doc)
    with pytest.raises(SnapshotError) as info:
        checkpoint.config_from_record(doc)
    assert info.value.rule == "checkpoint"


@pytest.mark.parametrize("doc", [None, [], "config", 42])
def test_a_config_that_is_not_an_object_is_a_snapshot_error(doc: Any) -> None:
    with pytest.raises(SnapshotError) as info:
        checkpoint.config_from_record(doc)
    assert info.value.rule == "checkpoint"


# -- the file ------------------------------------------------------------------------------------


def test_the_record_is_root_only_and_reads_back(records: Path) -> None:
    doc = record(config=checkpoint.config_record(config()))
    checkpoint.write_record(SID, doc)
    path = records / f"{SID}.json"
    assert stat.S_IMODE(records.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert checkpoint.read_record(SID) == {"version": checkpoint.RECORD_VERSION, **doc}
    assert os.listdir(records) == [f"{SID}.json"]


def test_a_record_is_replaced_atomically(records: Path) -> None:
    checkpoint.write_record(SID, record(owner="host:1"))
    path = records / f"{SID}.json"
    with path.open() as old:
        checkpoint.write_record(SID, record(owner="host:2"))
        # A reader holding the old file sees it whole; the path names the new one.
        assert json.load(old)["owner"] == "host:1"
    assert checkpoint.read_record(SID)["owner"] == "host:2"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # A write that fails halfway leaves the previous record and no temporary file.
    with pytest.raises(TypeError):
        checkpoint.write_record(SID, record(owner="host:3", config=object()))
    assert checkpoint.read_record(SID)["owner"] == "host:2"
    assert os.listdir(records) == [f"{SID}.json"]


def test_a_missing_record_says_so_and_names_prune() -> None:
    with pytest.raises(SandboxDestroyedError, match="prune"):
        checkpoint.read_record(SID)


@pytest.mark.parametrize(
    "bad", ["../x", "ABC", "0123456789abc", "0123456789AB", "0123456789ab\n", "", "../../etc/passwd"]
)
def test_a_malformed_id_is_a_configuration_error(bad: str, records: Path) -> None:
    with pytest.raises(ConfigurationError, match="12 hex digits"):
        checkpoint.read_record(bad)
    with pytest.raises(ConfigurationError, match="12 hex digits"):
        checkpoint.write_record(bad, record(bad))
    checkpoint.remove_record(bad)  # nothing to remove, nothing raised
    assert checkpoint.recorded_owner(bad) is None
    assert not records.exists() or os.listdir(records) == []


@pytest.mark.parametrize(
    "content",
    [
        b"not json{",
        b"[1, 2]",
        b'"a string"',
        json.dumps({"version": checkpoint.RECORD_VERSION, "sandbox_id": "ba9876543210"}).encode(),
        json.dumps({"version": checkpoint.RECORD_VERSION}).encode(),
        # Valid JSON, but over the 1 MiB a record may take.
        json.dumps(
            {"version": checkpoint.RECORD_VERSION, "sandbox_id": SID, "pad": "x" * (1 << 20)}
        ).encode(),
    ],
    ids=["not-json", "a-list", "a-string", "another-id", "no-id", "oversize"],
)
def test_a_corrupt_record_is_a_snapshot_error(content: bytes, records: Path) -> None:
    records.mkdir(mode=0o700)
    (records / f"{SID}.json").write_bytes(content)
    with pytest.raises(SnapshotError, match="corrupt") as info:
        checkpoint.read_record(SID)
    assert info.value.rule == "checkpoint"
    assert checkpoint.recorded_owner(SID) is None


@pytest.mark.parametrize("version", [checkpoint.RECORD_VERSION + 1, 0, "1", None])
def test_a_record_of_another_version_names_both(version: Any, records: Path) -> None:
    checkpoint.write_record(SID, record())
    path = records / f"{SID}.json"
    doc = json.loads(path.read_text())
    doc["version"] = version
    path.write_text(json.dumps(doc))
    with pytest.raises(SnapshotError) as info:
        checkpoint.read_record(SID)
    message = str(info.value)
    assert f"record version {version!r}" in message
    assert f"this one reads {checkpoint.RECORD_VERSION}" in message
    assert info.value.rule == "checkpoint"


def test_recorded_owner() -> None:
    assert checkpoint.recorded_owner(SID) is None  # no record
    checkpoint.write_record(SID, record(owner="somehost:4242"))
    assert checkpoint.recorded_owner(SID) == "somehost:4242"
    checkpoint.write_record(SID, record(owner=None))
    assert checkpoint.recorded_owner(SID) is None
    checkpoint.write_record(SID, record(owner=4242))
    assert checkpoint.recorded_owner(SID) is None


def test_remove_record_is_idempotent(records: Path) -> None:
    checkpoint.remove_record(SID)  # none yet
    checkpoint.write_record(SID, record())
    checkpoint.write_record("ba9876543210", record("ba9876543210"))
    checkpoint.remove_record(SID)
    checkpoint.remove_record(SID)
    assert os.listdir(records) == ["ba9876543210.json"]
    with pytest.raises(SandboxDestroyedError):
        checkpoint.read_record(SID)


def test_concurrent_writers_never_collide(records: Path) -> None:
    """Two threads of one process (two from_checkpoint calls) each replace the record whole."""
    start = threading.Barrier(4)
    failures: list[BaseException] = []

    def write(owner: str) -> None:
        start.wait()
        try:
            for _ in range(50):
                checkpoint.write_record(SID, record(owner=owner))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(f"host:{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert checkpoint.read_record(SID)["owner"] in {f"host:{n}" for n in range(4)}
    assert os.listdir(records) == [f"{SID}.json"]


# -- prune and other engines on the host ------------------------------------------------------


class EmptyEngine:
    """The view of an engine with no AgentNest resources (its id: ``ID``)."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id

    def info(self) -> dict[str, Any]:
        return {"ID": self.engine_id}

    def containers(self, **_: Any) -> list[Any]:
        return []

    def networks(self, **_: Any) -> list[Any]:
        return []

    def volumes(self, **_: Any) -> dict[str, Any]:
        return {"Volumes": []}


def test_prune_leaves_another_engines_records_and_workspaces(records: Path, tmp_path: Path) -> None:
    """Records and the pool are the host's: a prune through one engine keeps another engine's."""
    from agentnest.runtime.docker.prune import prune
    from agentnest.runtime.storage import ORPHAN_AGE, StoragePool

    theirs, mine, legacy = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"
    checkpoint.write_record(theirs, record(theirs, engine="engine-B", workspace=theirs))
    checkpoint.write_record(mine, record(mine, engine="engine-A", workspace=mine))
    checkpoint.write_record(legacy, record(legacy, workspace=legacy))  # written before records named engines
    pool = StoragePool(tmp_path / "storage")
    for name in (theirs, mine, legacy):
        (pool.root / "ws" / name).mkdir(parents=True)

    seen = prune(EmptyEngine("engine-A"), everything=True, pool=pool, dry_run=True)
    assert sorted(r.id for r in seen.workspaces) == [f"ws/{mine}", f"ws/{legacy}"]
    assert {p.name for p in records.iterdir()} >= {f"{s}.json" for s in (theirs, mine, legacy)}

    prune(EmptyEngine("engine-A"), everything=True, now=ORPHAN_AGE, pool=None)
    assert sorted(p.name for p in records.iterdir() if p.suffix == ".json") == [f"{theirs}.json"]
    # Its own engine removes it.
    prune(EmptyEngine("engine-B"), everything=True, pool=None)
    assert [p.name for p in records.iterdir() if p.suffix == ".json"] == []
