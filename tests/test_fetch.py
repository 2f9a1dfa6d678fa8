"""Weights prefetched into node-local caches, offline, from a seed cache in each library's layout.

The local tests run on this machine only; the slow one starts a two-node Ray cluster whose nodes
have different cache roots (each raylet, and so each worker, gets its own HISPARSE_WEIGHTS_CACHE)
and fetches in parallel with one task pinned to each node.
"""

from __future__ import annotations

import hashlib
import socket
from collections import namedtuple
from pathlib import Path

import pytest
from test_hub import (
    COMMIT,
    FakeHfHub,
    hub_files,
    make_hf_cache,
    make_ms_cache,
    run_against,
    tiny_model_files,
)

from harness import fetch
from harness.fetch import CACHE_ROOT_ENV, FetchError, fetch_weights, fetch_weights_local, folder_bytes
from harness.hub import HubError, HubRef, repo_cache_folder, resolve

HUBS = ("huggingface", "modelscope")
REF = {"huggingface": f"hf://org/tiny@{COMMIT}", "modelscope": "ms://org/tiny@v1.0"}


def make_seed(hub: str, seed: Path) -> dict[str, bytes]:
    files = tiny_model_files()
    if hub == "huggingface":
        make_hf_cache(seed / hub, "org/tiny", files)
    else:
        make_ms_cache(seed / hub, "org/tiny", files, revision="v1.0")
    return files


def snapshot_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir()}


@pytest.mark.parametrize("hub", HUBS)
def test_local_fetch_copies_once_then_transfers_nothing(hub, tmp_path):
    files = make_seed(hub, tmp_path / "seed")
    lines: list[str] = []
    first = fetch_weights_local(REF[hub], cache_root=tmp_path / "node", offline=True,
                                seed_cache=tmp_path / "seed" / hub, progress=lines.append)
    assert first.local_path.is_relative_to(tmp_path / "node" / hub)
    assert snapshot_files(first.local_path) == files
    seed_bytes = folder_bytes(repo_cache_folder(HubRef.parse(REF[hub]), tmp_path / "seed" / hub))
    if hub == "huggingface":  # the blobs plus refs/main and trees/<commit>.json
        assert seed_bytes > sum(len(b) for b in files.values())
    assert first.bytes_transferred == seed_bytes and not first.already_present
    assert first.revision_sha == (COMMIT if hub == "huggingface" else "v1.0")
    assert any(line.endswith(" done") and "copying from" in line for line in lines), lines
    # the node's copy is a cache the library itself accepts, offline
    assert resolve(REF[hub], cache_dir=tmp_path / "node" / hub, offline=True).local_path == first.local_path
    lines.clear()
    second = fetch_weights_local(REF[hub], cache_root=tmp_path / "node", offline=True,
                                 seed_cache=tmp_path / "seed" / hub, progress=lines.append)
    assert (second.bytes_transferred, second.already_present, second.local_path) == (0, True, first.local_path)
    assert not any("copying" in line for line in lines)


def test_an_interrupted_copy_resumes_where_it_stopped(tmp_path):
    files = make_seed("huggingface", tmp_path / "seed")
    ref = HubRef.parse(REF["huggingface"])
    weights = files["model.safetensors"]
    blob = hashlib.sha256(weights).hexdigest()
    partial = repo_cache_folder(ref, tmp_path / "node" / "huggingface") / "blobs" / f"{blob}.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(weights[:100])
    done = fetch_weights_local(ref, cache_root=tmp_path / "node", offline=True,
                               seed_cache=tmp_path / "seed" / "huggingface", progress=lambda _line: None)
    assert (done.local_path / "model.safetensors").read_bytes() == weights and not partial.exists()
    assert done.bytes_transferred == folder_bytes(repo_cache_folder(ref, tmp_path / "seed" / "huggingface")) - 100


@pytest.mark.parametrize("hub", HUBS)
def test_offline_without_seed_or_cache_fails_in_one_line(hub, tmp_path):
    with pytest.raises(HubError) as excinfo:
        fetch_weights_local(REF[hub], cache_root=tmp_path / "node", offline=True, progress=lambda _line: None)
    message = str(excinfo.value)
    assert "\n" not in message and f"{HubRef.parse(REF[hub]).label}: not in the local cache" in message


def test_too_little_free_disk_is_refused_before_copying(tmp_path, monkeypatch):
    make_seed("modelscope", tmp_path / "seed")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(fetch.shutil, "disk_usage", lambda _path: usage(10 * 2**30, 9 * 2**30, 2**30))
    with pytest.raises(FetchError) as excinfo:
        fetch_weights_local(REF["modelscope"], cache_root=tmp_path / "node", offline=True,
                            seed_cache=tmp_path / "seed" / "modelscope", progress=lambda _line: None)
    message = str(excinfo.value)
    assert "\n" not in message and "modelscope: org/tiny@v1.0: needs 0.0 MiB (+2.00 GiB margin)" in message
    assert "has 1.00 GiB free" in message
    assert folder_bytes(tmp_path / "node") == 0


def test_cache_root_comes_from_the_node_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ROOT_ENV, str(tmp_path / "from-env"))
    assert fetch.node_cache_root() == tmp_path / "from-env"
    assert fetch.node_cache_root(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv(CACHE_ROOT_ENV)
    assert fetch.node_cache_root() == Path.home() / ".cache" / "hisparse-harness" / "weights"


@pytest.fixture
def fake_hf_hub():
    hub = FakeHfHub("org/tiny", hub_files())
    yield hub
    hub.close()


def test_online_fetch_counts_what_it_moved_checks_disk_and_then_transfers_nothing(fake_hf_hub, tmp_path):
    big = hub_files()["big.bin"]
    blobs = tmp_path / "node" / "huggingface" / "models--org--tiny" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{hashlib.sha256(big).hexdigest()}.incomplete").write_bytes(big[: 2**20])  # an interrupted download
    code = """
import collections, sys
from harness import fetch
node, tight = sys.argv[1], sys.argv[2]
for _ in range(2):
    done = fetch.fetch_weights_local("hf://org/tiny", cache_root=node, offline=False, progress=print)
    print("RESULT", done.bytes_transferred, done.already_present, done.local_path)
usage = collections.namedtuple("usage", "total used free")
fetch.shutil.disk_usage = lambda _path: usage(0, 0, fetch.DISK_MARGIN_BYTES + 2**20)
try:
    fetch.fetch_weights_local("hf://org/tiny", cache_root=tight, offline=False, progress=print)
except fetch.FetchError as exc:
    print("REFUSED", exc)
"""
    done = run_against(fake_hf_hub, code, str(tmp_path / "node"), str(tmp_path / "tight"))
    assert done.returncode == 0, done.stderr
    results = [line.split() for line in done.stdout.splitlines() if line.startswith("RESULT")]
    repo = tmp_path / "node" / "huggingface" / "models--org--tiny"
    metadata = folder_bytes(repo / "refs") + folder_bytes(repo / "trees")
    assert results[0][1:] == [str(fake_hf_hub.file_bytes_sent + metadata), "False", str(repo / "snapshots" / COMMIT)]
    assert results[1][1:3] == ["0", "True"]
    # huggingface_hub 1.x writes each download to a fresh per-process temp file: a part left by an
    # earlier process is fetched again in full, not resumed (modelscope's client resumes it)
    assert fake_hf_hub.file_bytes_sent == sum(len(b) for b in hub_files().values())
    # the size came from the hub client's dry run, before any byte of the tight cache was written
    refused = next(line for line in done.stdout.splitlines() if line.startswith("REFUSED"))
    assert "huggingface: org/tiny@default branch: needs 3.0 MiB (+2.00 GiB margin)" in refused
    assert "has 2.00 GiB free" in refused
    assert folder_bytes(tmp_path / "tight" / "huggingface" / "models--org--tiny" / "blobs") == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ray_nodes_each_get_the_weights_in_their_own_cache(tmp_path, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for hub in HUBS:
        make_seed(hub, tmp_path / "seed")
    roots = [tmp_path / "node-a", tmp_path / "node-b"]
    node_args = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 80 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={
        **node_args, "env_vars": {CACHE_ROOT_ENV: str(roots[0])}, "include_dashboard": False})
    try:
        cluster.add_node(**node_args, env_vars={CACHE_ROOT_ENV: str(roots[1])})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(node_ids) == 2
        for hub in HUBS:
            lines: list[str] = []
            first = fetch_weights(REF[hub], offline=True, seed_cache=tmp_path / "seed" / hub,
                                  progress=lines.append, timeout_s=120)
            assert {f.node_id for f in first} == node_ids
            assert sorted(f.local_path.parts[: len(roots[0].parts)][-1] for f in first) == ["node-a", "node-b"]
            seed_bytes = folder_bytes(repo_cache_folder(HubRef.parse(REF[hub]), tmp_path / "seed" / hub))
            for got in first:
                assert snapshot_files(got.local_path) == tiny_model_files()
                assert got.bytes_transferred == seed_bytes and not got.already_present
                assert got.hostname == socket.gethostname()
            assert sum(line.endswith(" done") for line in lines) == 2, lines  # one copy per node, reported here
            second = fetch_weights(REF[hub], offline=True, seed_cache=tmp_path / "seed" / hub,
                                   progress=lines.append, timeout_s=120)
            assert [(f.bytes_transferred, f.already_present) for f in second] == [(0, True), (0, True)]
            assert [f.local_path for f in second] == [f.local_path for f in first]
        with pytest.raises(FetchError) as excinfo:
            fetch_weights("hf://org/missing", offline=True, progress=lambda _line: None, timeout_s=120)
        message = str(excinfo.value)
        assert "\n" not in message and message.count("huggingface: org/missing@default branch: not in the local "
                                                     "cache") == 2
    finally:
        ray.shutdown()
        cluster.shutdown()
