"""Model weights prefetched into a node-local cache on every node that will run a server.

One Ray task per node, pinned to it (NodeAffinitySchedulingStrategy, soft=False), all at once.
Each task resolves the reference through the hub client into the node's own cache
(`cache_root/<hub>/`, in the library's layout, so vLLM and the libraries read it as a normal
cache). The hub clients resume partial downloads and skip complete files, so a second call
transfers nothing. Where the nodes cannot reach the hub, `seed_cache` names a cache folder in the
library's layout that every node can read (a shared filesystem, or one made on the driver): the
snapshot is copied from it, resuming a partial copy, and then checked by the library offline.
Before any transfer the node's free disk is compared with what is still to come.

The cache root on a node: the `cache_root` argument, else $HISPARSE_WEIGHTS_CACHE on that node,
else ~/.cache/hisparse-harness/weights, expanded on that node. The seed likewise: the `seed_cache`
argument (a folder in the library's layout), else $HISPARSE_WEIGHTS_SEED on that node, a weights cache
root like the one above (its `<hub>/` folder is the seed; another node's cache root on a shared
filesystem will do). harness/weights.py decides which models go onto which nodes for a sweep.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.hub import (
    COMMIT_RE,
    HubError,
    HubRef,
    LineProgress,
    Progress,
    ResolvedRef,
    is_offline,
    repo_cache_folder,
    resolve,
    size_text,
)

DEFAULT_CACHE_ROOT = Path("~/.cache/hisparse-harness/weights")
CACHE_ROOT_ENV = "HISPARSE_WEIGHTS_CACHE"
SEED_CACHE_ENV = "HISPARSE_WEIGHTS_SEED"
LOCAL_NODE_ID = "local"  # the node id of a fetch without Ray
# left free after a download: a disk filled to the last byte breaks the server's logs and compiles
DISK_MARGIN_BYTES = 2 * 2**30
COPY_CHUNK_BYTES = 8 * 2**20


class FetchError(HubError):
    """A node could not get the weights; the message names the node(s)."""


@dataclass(frozen=True)
class NodeFetch:
    node_id: str
    hostname: str
    local_path: Path  # the snapshot folder on that node: what the server's --model takes
    revision_sha: str
    bytes_transferred: int  # bytes the node's cache grew by (downloads and copies, resumed parts excluded)
    seconds: float
    already_present: bool
    needed_bytes: int | None = None  # what the disk check found still to come (None: not checked or unknown)
    free_bytes: int | None = None  # free on the cache's disk at the check


@dataclass(frozen=True)
class _NodeFailure:
    node_id: str
    hostname: str
    reason: str


def node_cache_root(cache_root: Path | str | None = None) -> Path:
    """The weights cache root as seen on the node this runs on."""
    chosen = cache_root if cache_root is not None else os.environ.get(CACHE_ROOT_ENV) or DEFAULT_CACHE_ROOT
    return Path(os.path.expandvars(str(chosen))).expanduser()


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under path (links not followed, so a HF blob counts once)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(folder, name)):
                total += stat.st_size
    return total


def _download_size_bytes(ref: HubRef, hub_cache: Path) -> int | None:
    """Bytes the hub client would still download into hub_cache, as it reports them; None if it can't say."""
    try:
        if ref.hub == "huggingface":
            from huggingface_hub import snapshot_download

            infos = snapshot_download(ref.repo_id, repo_type=ref.repo_type, revision=ref.revision,
                                      cache_dir=hub_cache, dry_run=True)
            return sum(info.file_size or 0 for info in infos if info.will_download)
        from modelscope_hub import HubApi

        files = HubApi().list_repo_files(ref.repo_id, ref.repo_type, revision=ref.revision)
        snapshot = repo_cache_folder(ref, hub_cache) / "snapshots" / (ref.revision or "master")
        return sum(f.size for f in files
                   if not ((snapshot / f.path).is_file() and (snapshot / f.path).stat().st_size == f.size))
    except Exception:  # the size is advice for the disk check; the download itself reports real errors
        return None


def _free_bytes(path: Path) -> tuple[Path, int]:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe, shutil.disk_usage(probe).free


def _check_free_disk(label: str, hub_cache: Path, needed_bytes: int | None, emit: Progress) -> tuple[int | None, int]:
    """(needed, free) bytes; FetchError before any transfer when the disk is too small."""
    probe, free = _free_bytes(hub_cache)
    if needed_bytes is None:
        emit(f"{label}: warning: the hub does not say how large the download is; free disk not checked "
             f"({size_text(free)} free on {probe})")
    elif needed_bytes + DISK_MARGIN_BYTES > free:
        raise FetchError(f"{label}: needs {size_text(needed_bytes)} (+{size_text(DISK_MARGIN_BYTES)} margin) "
                         f"but {probe} has {size_text(free)} free")
    return needed_bytes, free


def _copy_resumable(src: Path, dest: Path, lines: LineProgress) -> None:
    """Copy through dest.incomplete, appending to what an interrupted copy left there."""
    size = src.stat().st_size
    if dest.is_file() and dest.stat().st_size == size:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".incomplete")
    offset = partial.stat().st_size if partial.is_file() else 0
    if offset > size:
        partial.unlink()
        offset = 0
    with open(src, "rb") as reader, open(partial, "ab") as writer:
        reader.seek(offset)
        while chunk := reader.read(COPY_CHUNK_BYTES):
            writer.write(chunk)
            lines.advance(len(chunk))
    os.replace(partial, dest)


def _seed_plan(ref: HubRef, seed: ResolvedRef, seed_cache: Path, hub_cache: Path
               ) -> tuple[list[tuple[Path, Path]], list[tuple[Path, str]]]:
    """(files to copy, links to make) that rebuild the seed's snapshot in hub_cache's layout."""
    seed_repo, dest_repo = repo_cache_folder(ref, seed_cache).resolve(), repo_cache_folder(ref, hub_cache)
    snapshot = seed.local_path.resolve()
    inside = snapshot.is_relative_to(seed_repo)
    dest_snapshot = (dest_repo / snapshot.relative_to(seed_repo) if inside
                     else dest_repo / "snapshots" / seed.revision_sha)  # modelscope's old layout moves to the new one
    files: list[tuple[Path, Path]] = []
    links: list[tuple[Path, str]] = []
    for folder, _, names in os.walk(snapshot):
        for name in names:
            if name.endswith((".incomplete", ".lock")):
                continue
            path = Path(folder) / name
            target = dest_snapshot / path.relative_to(snapshot)
            real = path.resolve()
            if path.is_symlink() and real.is_relative_to(seed_repo):  # huggingface_hub: a link to blobs/<etag>
                files.append((real, dest_repo / real.relative_to(seed_repo)))
                links.append((target, os.readlink(path)))
            else:
                files.append((real, target))
    if ref.hub == "huggingface":  # the branch the ref names, and the listing the library checks completeness by
        branch = ref.revision if ref.revision and not COMMIT_RE.fullmatch(ref.revision) else "main"
        for meta in (seed_repo / "refs" / branch, seed_repo / "trees" / f"{seed.revision_sha}.json"):
            if meta.is_file():
                files.append((meta, dest_repo / meta.relative_to(seed_repo)))
    return files, links


def _copy_from_seed(ref: HubRef, seed_cache: Path, hub_cache: Path, label: str,
                    emit: Progress) -> tuple[int | None, int]:
    seed = resolve(ref, cache_dir=seed_cache, offline=True, progress=emit)
    files, links = _seed_plan(ref, seed, seed_cache, hub_cache)
    needed = sum(src.stat().st_size - (dest.stat().st_size if dest.is_file() else 0) for src, dest in files)
    disk = _check_free_disk(label, hub_cache, needed, emit)
    lines = LineProgress(f"{label}: copying from {seed_cache}", emit)
    lines.add_total(needed)
    for src, dest in files:
        _copy_resumable(src, dest, lines)
    for link, text in links:
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(text)
    lines.finish()
    return disk


def _present(ref: HubRef, hub_cache: Path) -> bool:
    try:
        resolve(ref, cache_dir=hub_cache, offline=True, progress=lambda _line: None)
    except HubError:
        return False
    return True


def _fetch_here(ref: HubRef | str, *, node_id: str = LOCAL_NODE_ID, cache_root: Path | str | None = None,
               offline: bool | None = None, seed_cache: Path | str | None = None,
               progress: Progress | None = None) -> NodeFetch:
    """Put ref into this machine's weights cache; what was moved and how long it took."""
    ref = HubRef.parse(ref)
    host = socket.gethostname()
    label = f"{host}: {ref.label}"
    emit = progress or (lambda line: print(line, flush=True))
    hub_cache = node_cache_root(cache_root) / ref.hub
    if seed_cache is None and os.environ.get(SEED_CACHE_ENV):  # a weights cache root: <root>/<hub>/ inside
        seed_cache = Path(os.environ[SEED_CACHE_ENV]) / ref.hub
    repo = repo_cache_folder(ref, hub_cache)
    before, start = folder_bytes(repo), time.monotonic()
    disk: tuple[int | None, int | None] = (None, None)
    if seed_cache is not None and not _present(ref, hub_cache):
        disk = _copy_from_seed(ref, Path(os.path.expandvars(str(seed_cache))).expanduser(), hub_cache, label, emit)
    if not (is_offline(ref.hub) if offline is None else offline):  # a moved branch downloads again: check
        disk = _check_free_disk(label, hub_cache, _download_size_bytes(ref, hub_cache), emit)
    resolved = resolve(ref, cache_dir=hub_cache, offline=offline, progress=lambda line: emit(f"{host}: {line}"))
    moved = max(0, folder_bytes(repo) - before)
    return NodeFetch(node_id=node_id, hostname=host, local_path=resolved.local_path,
                     revision_sha=resolved.revision_sha, bytes_transferred=moved,
                     seconds=round(time.monotonic() - start, 3), already_present=moved == 0,
                     needed_bytes=disk[0], free_bytes=disk[1])


def fetch_weights_local(ref: HubRef | str, *, cache_root: Path | str | None = None, offline: bool | None = None,
                        seed_cache: Path | str | None = None, progress: Progress | None = None) -> NodeFetch:
    """The `--launcher local` variant: this machine only, no Ray."""
    return _fetch_here(ref, cache_root=cache_root, offline=offline, seed_cache=seed_cache, progress=progress)


def _fetch_task(ref: HubRef, cache_root: str | None, offline: bool | None, seed_cache: str | None,
                queue: Any) -> NodeFetch | _NodeFailure:
    import ray

    node_id = ray.get_runtime_context().get_node_id()

    def emit(line: str) -> None:
        try:
            queue.put_nowait(line)
        except Exception:  # progress is best effort; the fetch itself must not fail on it
            pass

    try:
        return _fetch_here(ref, node_id=node_id, cache_root=cache_root, offline=offline, seed_cache=seed_cache,
                          progress=emit)
    except HarnessError as exc:
        return _NodeFailure(node_id, socket.gethostname(), str(exc))
    except OSError as exc:
        return _NodeFailure(node_id, socket.gethostname(), f"{ref.label}: {exc.strerror or exc}")


def server_nodes(min_gpus: int | None = None) -> list[str]:
    """Alive nodes a server can run on. min_gpus None: the nodes that have GPUs (all alive nodes where
    none has any); else the nodes with a CPU and at least min_gpus GPUs, as the Ray launcher places."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if min_gpus is not None:
        return [n["NodeID"] for n in alive if n.get("Resources", {}).get("CPU", 0) >= 1
                and n.get("Resources", {}).get("GPU", 0) >= min_gpus]
    with_gpus = [n["NodeID"] for n in alive if n.get("Resources", {}).get("GPU", 0) > 0]
    return with_gpus or [n["NodeID"] for n in alive]


def fetch_weights(ref: HubRef | str, *, nodes: Sequence[str] | None = None, cache_root: Path | str | None = None,
                  offline: bool | None = None, seed_cache: Path | str | None = None,
                  progress: Progress | None = None, timeout_s: float | None = None) -> list[NodeFetch]:
    """ref into the cache of each node (default: server_nodes()) of the current Ray session, in parallel.

    cache_root, offline None and seed_cache are read on each node. Progress lines from every node
    come back to `progress` (default: stdout) while the tasks run."""
    import ray
    from ray.util.queue import Empty, Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ref = HubRef.parse(ref)
    if not ray.is_initialized():
        raise HarnessError("fetching weights needs a Ray session: start or join one first")
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    chosen = list(dict.fromkeys(nodes)) if nodes else server_nodes()
    unknown = [n for n in chosen if n not in alive]
    if unknown:
        raise FetchError(f"{ref.label}: no alive Ray node with id {', '.join(unknown)}")
    emit = progress or (lambda line: print(line, flush=True))
    queue = Queue(actor_options={"num_cpus": 0})
    task = ray.remote(num_cpus=0, max_retries=0)(_fetch_task)
    pending = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                            name=f"fetch-weights-{node[:8]}").remote(
        ref, None if cache_root is None else str(cache_root), offline,
        None if seed_cache is None else str(seed_cache), queue) for node in chosen]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    outcomes: list[NodeFetch | _NodeFailure] = []

    def drain() -> None:
        while True:
            try:
                emit(queue.get_nowait())
            except Empty:
                return

    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            outcomes += ray.get(ready)
            drain()
            if deadline is not None and time.monotonic() > deadline and pending:
                raise FetchError(f"{ref.label}: {len(pending)} node(s) still fetching after {timeout_s:.0f} s")
        drain()
    except BaseException:  # a timeout or an interrupt: no task goes on downloading on a joined cluster
        for stuck in pending:
            ray.cancel(stuck, force=True)
        raise
    finally:
        queue.shutdown()
    failed = [o for o in outcomes if isinstance(o, _NodeFailure)]
    if failed:
        raise FetchError("weights fetch failed on " + "; ".join(
            f"node {f.hostname} ({f.node_id[:8]}): {f.reason}" for f in failed))
    order = {node: i for i, node in enumerate(chosen)}
    return sorted((o for o in outcomes if isinstance(o, NodeFetch)), key=lambda o: order[o.node_id])
