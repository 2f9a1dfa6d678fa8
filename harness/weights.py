"""The model weights a sweep's servers load, fetched before any server starts.

Each hub model (a vLLM profile whose serve.model is a hub id) is fetched once per run onto every
node that can run a server loading it: under Ray the alive nodes with a CPU and the GPUs that
server reserves, in parallel (harness/fetch.py, one task per node); with the local launcher this
machine. The outcome per model says where it landed on each node (what the launcher fills the
model placeholder with), what each node's free-disk check found, or why the fetch failed; a
failure is data: the deployments that load the model fail their preflight with that reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.fetch import FetchError, NodeFetch, Progress, fetch_weights, fetch_weights_local, server_nodes
from harness.hub import COMMIT_RE, HubRef
from harness.records import WeightsRecord


@dataclass(frozen=True)
class WeightsNeed:
    """One hub model and the servers that load it (their names, and the GPUs each needs)."""

    ref: HubRef
    min_gpus: int  # the nodes fetched onto are those with at least this many GPUs
    users: tuple[str, ...]


@dataclass(frozen=True)
class WeightsOutcome:
    need: WeightsNeed
    nodes: tuple[NodeFetch, ...] = ()
    problem: str | None = None  # why the fetch failed (disk, offline, unknown revision), one line
    seconds: float = 0.0

    def model_paths(self) -> dict[str, str]:
        """node id -> the snapshot folder there (what the server's --model takes)."""
        return {n.node_id: str(n.local_path) for n in self.nodes}

    def paths_for(self, local_node: str | None = None) -> dict[str, str]:
        """model_paths keyed as the launcher knows its nodes: Ray node ids, or its one local node."""
        if self.problem is not None or not self.nodes:
            return {}
        return {local_node: str(self.nodes[0].local_path)} if local_node else self.model_paths()

    @property
    def bytes_transferred(self) -> int:
        return sum(n.bytes_transferred for n in self.nodes)

    def record(self) -> WeightsRecord:
        ref, first = self.need.ref, self.nodes[0] if self.nodes else None
        return WeightsRecord(hub=ref.hub, id=ref.repo_id, repo_type=ref.repo_type, revision=ref.revision,
                             revision_sha=first.revision_sha if first else None,
                             revision_is_commit=first is not None and bool(COMMIT_RE.fullmatch(first.revision_sha)),
                             nodes=self.model_paths(), bytes_transferred=self.bytes_transferred,
                             fetch_s=round(self.seconds, 3))

    def summary(self) -> str:
        """One progress line: where the model is now, or why not."""
        if self.problem:
            return f"weights {self.need.ref}: {self.problem}"
        moved = self.bytes_transferred
        return (f"weights {self.need.ref}: on {len(self.nodes)} node(s) at revision {self.nodes[0].revision_sha}; "
                + (f"{moved / 2**30:.2f} GiB moved in {self.seconds:.1f} s" if moved else "nothing to transfer"))


def group_needs(servers: Iterable[tuple[str, HubRef | None, int]]) -> list[WeightsNeed]:
    """(server name, its hub model or None, its GPUs) -> one need per model, in first-use order."""
    grouped: dict[HubRef, tuple[int, list[str]]] = {}
    for name, ref, gpus in servers:
        if ref is None:
            continue
        least, users = grouped.get(ref, (gpus, []))
        grouped[ref] = (min(least, gpus), [*users, name])
    return [WeightsNeed(ref, gpus, tuple(users)) for ref, (gpus, users) in grouped.items()]


def fetch_needs(needs: Sequence[WeightsNeed], *, use_ray: bool, cache_root: Path | str | None = None,
                offline: bool | None = None, seed_cache: Path | str | None = None,
                progress: Progress | None = None, timeout_s: float | None = None) -> list[WeightsOutcome]:
    """Each model onto every node that can run a server loading it (under Ray: in parallel across the
    nodes; without: this machine). A failure is an outcome with its one-line problem, not an exception."""
    emit = progress or (lambda line: print(line, flush=True))
    outcomes = []
    for need in needs:
        start = time.monotonic()
        try:
            if use_ray:
                nodes = server_nodes(need.min_gpus)
                if not nodes:
                    raise FetchError(f"{need.ref.label}: no alive Ray node has a CPU and {need.min_gpus} GPU(s)")
                got = fetch_weights(need.ref, nodes=nodes, cache_root=cache_root, offline=offline,
                                    seed_cache=seed_cache, progress=emit, timeout_s=timeout_s)
            else:
                got = [fetch_weights_local(need.ref, cache_root=cache_root, offline=offline, seed_cache=seed_cache,
                                           progress=emit)]
        except HarnessError as exc:
            outcomes.append(WeightsOutcome(need, problem=str(exc), seconds=time.monotonic() - start))
            continue
        except OSError as exc:
            outcomes.append(WeightsOutcome(need, problem=f"{need.ref.label}: {exc.strerror or exc}",
                                           seconds=time.monotonic() - start))
            continue
        outcomes.append(WeightsOutcome(need, tuple(got), seconds=time.monotonic() - start))
    return outcomes


def prefetch(servers: Sequence[tuple[str, HubRef | None, int]], *, use_ray: bool,
             progress: Progress | None = None) -> dict[str, WeightsOutcome]:
    """Every server's hub model onto its nodes (fetch_needs), with one summary line per model; by server."""
    emit = progress or (lambda line: print(line, flush=True))
    by_server: dict[str, WeightsOutcome] = {}
    for outcome in fetch_needs(group_needs(servers), use_ray=use_ray, progress=emit):
        emit(outcome.summary())
        by_server.update({name: outcome for name in outcome.need.users})
    return by_server
