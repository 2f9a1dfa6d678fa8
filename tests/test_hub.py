"""The hub layer against the on-disk caches that huggingface_hub and modelscope themselves read.

Every test is offline: each builds, in a temporary folder, the cache layout the library reads
(huggingface_hub: `models--org--name/{blobs,refs,snapshots,trees}`; modelscope:
`models/org--name/snapshots/<revision>/`, and the `.mv` file of its older layout) and resolves
through the library's own `snapshot_download`. Where a test goes "online", the only network is
a proxy on 127.0.0.1 that refuses every tunnel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from harness.hub import (
    DEFAULT_HUB,
    HubError,
    HubRef,
    check_trust_remote_code,
    repo_cache_folder,
    resolve,
)
from harness.hub_rows import iter_dataset_rows

ROOT = Path(__file__).resolve().parents[1]
HUBS = ("huggingface", "modelscope")
PREFIX = {"huggingface": "hf://", "modelscope": "ms://"}
COMMIT = "0123456789abcdef0123456789abcdef01234567"



def read_dataset_rows(resolved, split: str, config: str | None = None) -> list:
    """Every row of one split as a list (small test data sets)."""
    return list(iter_dataset_rows(resolved, split, config))

def repo_path(*candidates: str) -> Path:
    """A shipped file or folder (the repository's data folders have moved before)."""
    for candidate in candidates:
        if (ROOT / candidate).exists():
            return ROOT / candidate
    raise FileNotFoundError(candidates[0])


def tokenizer_files() -> dict[str, bytes]:
    folder = repo_path("harness/data/tokenizers/harness-bpe", "datasets/tokenizers/harness-bpe")
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def sample_lines(n: int = 10) -> list[bytes]:
    path = repo_path("harness/data/samples/openhands-sample.jsonl", "datasets/samples/openhands-sample.jsonl")
    return path.read_bytes().splitlines(keepends=True)[:n]


def tiny_model_files() -> dict[str, bytes]:
    from safetensors.numpy import save

    weights = {"embed.weight": np.arange(48, dtype=np.float32).reshape(12, 4),
               "lm_head.weight": np.ones((4, 12), dtype=np.float16)}
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4, "vocab_size": 12, "num_hidden_layers": 0}
    return {"config.json": json.dumps(config).encode(), "model.safetensors": save(weights)}


def make_hf_cache(cache: Path, repo_id: str, files: dict[str, bytes], *, repo_type: str = "model",
                  commit: str = COMMIT, branch: str = "main") -> Path:
    """huggingface_hub's layout: content in blobs/<etag>, snapshots/<commit>/<path> links to it,
    refs/<branch> holds the commit, trees/<commit>.json the listing it checks for completeness."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    entries = {}
    for rel, data in files.items():
        blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        lfs = rel.endswith((".safetensors", ".parquet"))
        etag = hashlib.sha256(data).hexdigest() if lfs else blob_id  # LFS files are named by sha256
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / etag).write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / etag, link.parent))
        entries[rel] = {"size": len(data), "blob_id": blob_id}
        if lfs:
            entries[rel].update(lfs_sha256=etag, lfs_size=len(data))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    (repo / "trees").mkdir(exist_ok=True)
    (repo / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": entries}))
    return repo


def make_ms_cache(cache: Path, repo_id: str, files: dict[str, bytes], *, repo_type: str = "model",
                  revision: str = "master") -> Path:
    """modelscope's layout (SDK 1.38+): plain files in <type>s/<org>--<name>/snapshots/<revision>/."""
    snapshot = cache / f"{repo_type}s" / repo_id.replace("/", "--") / "snapshots" / revision
    for rel, data in files.items():
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).write_bytes(data)
    return snapshot


def make_cache(hub: str, cache: Path, repo_id: str, files: dict[str, bytes], *, repo_type: str = "model",
               revision: str | None = None) -> None:
    if hub == "huggingface":
        make_hf_cache(cache, repo_id, files, repo_type=repo_type, commit=revision or COMMIT)
    else:
        make_ms_cache(cache, repo_id, files, repo_type=repo_type, revision=revision or "master")


def one_line_error(excinfo: pytest.ExceptionInfo, *parts: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, (part, message)
    return message


# ---- references ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("ms://ZhipuAI/GLM-5.3@abc123", HubRef("modelscope", "ZhipuAI/GLM-5.3", "abc123")),
    ("hf://zai-org/GLM-5.3", HubRef("huggingface", "zai-org/GLM-5.3", None)),
    ("zai-org/GLM-5.3@v1.0", HubRef(DEFAULT_HUB, "zai-org/GLM-5.3", "v1.0")),
    ("hf://datasets/nebius/SWE-rebench-openhands-trajectories@refs/convert/parquet",
     HubRef("huggingface", "nebius/SWE-rebench-openhands-trajectories", "refs/convert/parquet", "dataset")),
    ({"hub": "modelscope", "id": "a/b", "revision": "v2", "repo_type": "dataset"},
     HubRef("modelscope", "a/b", "v2", "dataset")),
])
def test_references_parse_and_print_back(text, expected):
    ref = HubRef.parse(text)
    assert ref == expected
    assert HubRef.parse(str(ref)) == ref


@pytest.mark.parametrize("value, says", [
    ("xx://a/b", "is not a hub repository id"),
    ("hf://justaname", "is not a hub repository id"),
    ("a/b@", "empty revision"),
    ("a/b@has space", "is not a revision"),
    ({"hub": "github", "repo_id": "a/b"}, "unknown hub 'github'"),
    ({"repo_id": "a/b", "branch": "x"}, "unknown hub reference field(s) ['branch']"),
    ({"repo_id": "a/b", "repo_type": "space"}, "unknown repo_type 'space'"),
])
def test_bad_references_fail_in_one_line_naming_where(value, says):
    with pytest.raises(HubError) as excinfo:
        HubRef.parse(value, where="launch/x.yaml: serve.model")
    one_line_error(excinfo, "launch/x.yaml: serve.model: ", says)


def test_trust_remote_code_needs_a_pinned_revision():
    check_trust_remote_code(HubRef.parse(f"hf://zai-org/GLM-5.3@{COMMIT}"))
    check_trust_remote_code(HubRef.parse("ms://ZhipuAI/GLM-5.3@v1.0"))
    for text, says in [("hf://zai-org/GLM-5.3", "no revision is pinned"),
                       ("ms://ZhipuAI/GLM-5.3@master", "'master' is a branch"),
                       ("hf://zai-org/GLM-5.3@v1.0", "must be a 40-hex commit sha")]:
        with pytest.raises(HubError) as excinfo:
            check_trust_remote_code(HubRef.parse(text))
        one_line_error(excinfo, "trust_remote_code refused", says, HubRef.parse(text).label)


# ---- resolving from each library's cache, offline ----------------------------------------------------

@pytest.mark.parametrize("hub", HUBS)
def test_tokenizer_resolves_offline_and_loads(hub, tmp_path):
    from harness.dataset.tokenizer import load_tokenizer

    files = tokenizer_files()
    make_cache(hub, tmp_path, "org/tok", files)
    resolved = resolve(f"{PREFIX[hub]}org/tok", cache_dir=tmp_path, offline=True)
    assert {p.name: p.read_bytes() for p in resolved.local_path.iterdir()} == files
    expected = (COMMIT, True) if hub == "huggingface" else ("master", False)
    assert (resolved.revision_sha, resolved.revision_is_commit) == expected
    tokenizer = load_tokenizer(resolved.local_path)
    assert tokenizer.count_bare("hello world, from a hub") > 0


def test_same_tokenizer_bytes_from_both_hubs_count_the_same(tmp_path):
    from harness.dataset.tokenizer import load_tokenizer

    counts = {}
    for hub in HUBS:
        make_cache(hub, tmp_path / hub, "org/tok", tokenizer_files())
        tokenizer = load_tokenizer(resolve(f"{PREFIX[hub]}org/tok", cache_dir=tmp_path / hub, offline=True).local_path)
        counts[hub] = (tokenizer.fingerprint, tokenizer.encode_bare("def f(x):\n    return x * 2  # hub"))
    assert counts["huggingface"] == counts["modelscope"]


@pytest.mark.parametrize("hub", HUBS)
def test_model_folder_resolves_at_a_pinned_revision(hub, tmp_path):
    from safetensors.numpy import load_file

    files = tiny_model_files()
    revision = COMMIT if hub == "huggingface" else "v1.0"
    make_cache(hub, tmp_path, "org/tiny", files, revision=revision)
    resolved = resolve(f"{PREFIX[hub]}org/tiny@{revision}", cache_dir=tmp_path, offline=True)
    assert resolved.revision_sha == revision
    weights = load_file(str(resolved.local_path / "model.safetensors"))
    assert weights["embed.weight"][11, 3] == 47.0 and weights["lm_head.weight"].dtype == np.float16
    only_config = resolve(f"{PREFIX[hub]}org/tiny@{revision}", cache_dir=tmp_path, offline=True,
                          allow_patterns=["*.json"])
    assert (only_config.local_path / "config.json").is_file()


def test_dataset_rows_are_identical_from_both_hubs(tmp_path):
    lines = sample_lines(10)
    files = {"README.md": b"# sample\n", "data/train-00000-of-00001.jsonl": b"".join(lines)}
    rows = {}
    for hub in HUBS:
        make_cache(hub, tmp_path / hub, "org/trajectories", files, repo_type="dataset")
        resolved = resolve(f"{PREFIX[hub]}datasets/org/trajectories", cache_dir=tmp_path / hub, offline=True)
        rows[hub] = read_dataset_rows(resolved, "train")
    assert rows["huggingface"] == rows["modelscope"] == [json.loads(line) for line in lines]
    assert rows["huggingface"][0]["trajectory"][0]["role"] == "system"


def test_parquet_split_gives_the_same_trajectories_as_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from harness.dataset.sources import trajectory_from_row

    rows = [json.loads(line) for line in sample_lines(10)]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    files = {"data/train-00000-of-00001.parquet": sink.getvalue().to_pybytes()}
    got = {}
    for hub in HUBS:
        make_cache(hub, tmp_path / hub, "org/pq", files, repo_type="dataset")
        resolved = resolve(f"{PREFIX[hub]}datasets/org/pq", cache_dir=tmp_path / hub, offline=True)
        got[hub] = [trajectory_from_row(r, i, False) for i, r in enumerate(read_dataset_rows(resolved, "train"))]
    assert got["huggingface"] == got["modelscope"] == [trajectory_from_row(r, i, False) for i, r in enumerate(rows)]


def test_card_configs_choose_the_split_files(tmp_path):
    lines = sample_lines(10)
    card = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: shards/part-*.jsonl\n"
            "  - split: test\n    path: holdout.json\n---\n# card\n")
    holdout = json.dumps([json.loads(line) for line in lines[8:]]).encode()
    files = {"README.md": card.encode(), "shards/part-1.jsonl": b"".join(lines[4:8]),
             "shards/part-0.jsonl": b"".join(lines[:4]), "holdout.json": holdout, "train.jsonl": b"{}\n"}
    for hub in HUBS:
        make_cache(hub, tmp_path / hub, "org/card", files, repo_type="dataset")
        resolved = resolve(f"{PREFIX[hub]}datasets/org/card", cache_dir=tmp_path / hub, offline=True)
        assert read_dataset_rows(resolved, "train") == [json.loads(line) for line in lines[:8]]
        assert read_dataset_rows(resolved, "test") == [json.loads(line) for line in lines[8:]]
        with pytest.raises(HubError) as excinfo:
            read_dataset_rows(resolved, "validation")
        one_line_error(excinfo, f"{hub}: org/card@default branch", "no split 'validation' (splits: test, train)")


# ---- failures: one line naming hub, id and revision ------------------------------------------------

@pytest.mark.parametrize("hub", HUBS)
@pytest.mark.parametrize("repo_type", ["model", "dataset"])
def test_empty_cache_offline_fails_in_one_line(hub, repo_type, tmp_path):
    kind = "datasets/" if repo_type == "dataset" else ""
    with pytest.raises(HubError) as excinfo:
        resolve(f"{PREFIX[hub]}{kind}ZhipuAI/GLM-5.3@abc123", cache_dir=tmp_path, offline=True)
    one_line_error(excinfo, f"{hub}: ZhipuAI/GLM-5.3@abc123: not in the local cache ({tmp_path}) and offline")


@pytest.mark.parametrize("hub", HUBS)
def test_wrong_revision_fails_in_one_line(hub, tmp_path):
    make_cache(hub, tmp_path, "org/tiny", tiny_model_files(), revision=COMMIT if hub == "huggingface" else "v1.0")
    for wrong in ("v9.9", "f" * 40):
        with pytest.raises(HubError) as excinfo:
            resolve(f"{PREFIX[hub]}org/tiny@{wrong}", cache_dir=tmp_path, offline=True)
        one_line_error(excinfo, f"{hub}: org/tiny@{wrong}: not in the local cache")


def test_incomplete_hf_snapshot_is_refused(tmp_path):
    repo = make_hf_cache(tmp_path, "org/tiny", tiny_model_files())
    (repo / "snapshots" / COMMIT / "model.safetensors").unlink()
    with pytest.raises(HubError) as excinfo:
        resolve("hf://org/tiny", cache_dir=tmp_path, offline=True)
    one_line_error(excinfo, "huggingface: org/tiny@default branch: the cached snapshot", "is incomplete",
                   "(1 file(s) are missing (model.safetensors))")


def test_old_modelscope_layout_is_read_and_its_revision_checked(tmp_path):
    legacy = tmp_path / "models" / "ZhipuAI" / "GLM-5___3"  # SDKs up to 1.37: dots became ___
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    (legacy / ".mv").write_text("Revision:v1.0,CreatedAt:1700000000")
    resolved = resolve("ms://ZhipuAI/GLM-5.3@v1.0", cache_dir=tmp_path, offline=True)
    assert (resolved.local_path, resolved.revision_sha) == (legacy, "v1.0")
    with pytest.raises(HubError) as excinfo:
        resolve("ms://ZhipuAI/GLM-5.3@v2.0", cache_dir=tmp_path, offline=True)
    one_line_error(excinfo, "modelscope: ZhipuAI/GLM-5.3@v2.0: the cache folder", "holds revision v1.0, not v2.0")


def test_repo_cache_folder_is_where_the_libraries_put_it(tmp_path):
    assert repo_cache_folder(HubRef.parse("hf://datasets/a/b"), tmp_path) == tmp_path / "datasets--a--b"
    assert repo_cache_folder(HubRef.parse("ms://a/b"), tmp_path) == tmp_path / "models" / "a--b"


# ---- the libraries' own environment, and reachability through a proxy ------------------------------

def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("HF_", "MODELSCOPE_", "HTTP", "NO_PROXY", "no_proxy", "http", "TRANSFORMERS_"))}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_cache_folders_and_offline_switches_come_from_the_environment(tmp_path):
    make_hf_cache(tmp_path / "hf", "org/tok", tokenizer_files())
    make_ms_cache(tmp_path / "ms", "org/tok", tokenizer_files())
    code = ("from harness.hub import resolve\n"
            "for h in ('hf', 'ms'):\n"
            "    print(resolve(h + '://org/tok', progress=print).local_path)\n")
    done = _run(code, {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
                       "MODELSCOPE_CACHE": str(tmp_path / "ms"), "MODELSCOPE_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "hf" / "models--org--tok" / "snapshots" / COMMIT),
                                   str(tmp_path / "ms" / "models" / "org--tok" / "snapshots" / "master")]
    done = _run("from harness.hub import resolve\nresolve('hf://org/other')\n",
                {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 1
    assert f"HubError: huggingface: org/other@default branch: not in the local cache ({tmp_path / 'hf'}) and " \
           "offline (HF_HUB_OFFLINE=1)" in done.stderr


class RefusingProxy:
    """An HTTP proxy on 127.0.0.1 that records each request line and refuses it (403)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.requests.append(conn.recv(4096).decode(errors="replace").split("\r\n")[0])
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self.server.close()


@pytest.fixture
def proxy():
    refusing = RefusingProxy()
    yield refusing
    refusing.close()


@pytest.mark.parametrize("hub, host", [("huggingface", "huggingface.co"), ("modelscope", "modelscope")])
def test_reachability_is_the_clients_through_the_proxy(hub, host, tmp_path, proxy):
    url = f"http://127.0.0.1:{proxy.port}"
    env = {"HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
           "MODELSCOPE_API_MAX_RETRIES": "1", "MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS": "1"}
    make_cache(hub, tmp_path / "cached", "org/tok", tokenizer_files(), revision=COMMIT)
    code = ("import sys\nfrom harness.hub import resolve, HubError\n"
            "for cache in sys.argv[2:]:\n"
            "    try:\n        print('OK', resolve(sys.argv[1], cache_dir=cache, progress=print).local_path)\n"
            "    except HubError as exc:\n        print('ERR', exc)\n")
    done = subprocess.run([sys.executable, "-c", code, f"{PREFIX[hub]}org/tok@{COMMIT}", str(tmp_path / "empty"),
                           str(tmp_path / "cached")],
                          env={**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_"))},
                               **env, "NO_PROXY": "", "no_proxy": ""},
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith(f"ERR {hub}: org/tok@{COMMIT}: the hub cannot be reached ("), out
    assert f"not in the local cache ({tmp_path / 'empty'})" in out[0]
    assert out[-1].startswith("OK ") and str(tmp_path / "cached") in out[-1], out  # falls back to the cache
    assert proxy.requests and all(r.startswith("CONNECT ") for r in proxy.requests), proxy.requests
    assert any(host in r for r in proxy.requests), proxy.requests


# ---- online, against a hub on 127.0.0.1 ------------------------------------------------------------

class FakeHfHub:
    """The few Hugging Face hub routes snapshot_download uses, for one model repo, on 127.0.0.1:
    revision info, the tree listing, and files by commit (HEAD, GET, Range for resumed downloads)."""

    def __init__(self, repo_id: str, files: dict[str, bytes], commit: str = COMMIT):
        self.requests: list[tuple[str, str, str | None]] = []
        self.file_bytes_sent = 0
        hub, api = self, f"/api/models/{repo_id}"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(with_body=False)

            def do_GET(self):
                self.answer(with_body=True)

            def send(self, code: int, data: bytes, headers: dict[str, str], with_body: bool, length: int):
                self.send_response(code)
                for key, value in {**headers, "Content-Length": str(length)}.items():
                    self.send_header(key, value)
                self.end_headers()
                if with_body:
                    self.wfile.write(data)

            def answer(self, with_body: bool):
                path, byte_range = self.path.split("?")[0], self.headers.get("Range")
                hub.requests.append((self.command, path, byte_range))
                json_type = {"Content-Type": "application/json"}
                if path in (f"{api}/revision/main", f"{api}/revision/{commit}"):
                    body = json.dumps({"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in files]})
                    return self.send(200, body.encode(), json_type, with_body, len(body))
                if path == f"{api}/tree/{commit}":
                    body = json.dumps([{"type": "file", "path": name, "size": len(data),
                                        "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
                                       for name, data in files.items()])
                    return self.send(200, body.encode(), json_type, with_body, len(body))
                found = re.fullmatch(rf"/{repo_id}/resolve/{commit}/(.+)", path)
                if found and found.group(1) in files:
                    data = files[found.group(1)]
                    headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": commit,
                               "Accept-Ranges": "bytes"}
                    start = int(re.match(r"bytes=(\d+)-", byte_range).group(1)) if byte_range else 0
                    if start:
                        headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    hub.file_bytes_sent += (len(data) - start) if with_body else 0
                    return self.send(206 if start else 200, data[start:], headers, with_body, len(data) - start)
                code = "RevisionNotFound" if path.startswith(f"{api}/revision/") else "RepoNotFound"
                self.send(404, b"{}", {"X-Error-Code": code, **json_type}, with_body, 2)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def hub_files() -> dict[str, bytes]:
    return {**tiny_model_files(), "big.bin": np.random.default_rng(0).bytes(3 * 2**20)}


@pytest.fixture
def fake_hf_hub():
    hub = FakeHfHub("org/tiny", hub_files())
    yield hub
    hub.close()


def run_against(hub: FakeHfHub, code: str, *args: str) -> subprocess.CompletedProcess:
    """Python code in a child whose huggingface_hub talks to the loopback hub (it reads HF_ENDPOINT at import)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HTTP", "http", "TRANSFORMERS_"))}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**clean, "HF_ENDPOINT": hub.url, "NO_PROXY": "127.0.0.1",
                                         "PYTHONPATH": str(ROOT / "tests")})


def test_online_download_reports_progress_lines_and_errors_name_the_ref(fake_hf_hub, tmp_path):
    code = """
import sys
from harness.hub import HubError, resolve
cache = sys.argv[1]
print(resolve("hf://org/tiny", cache_dir=cache, offline=False).local_path)
print(resolve("hf://org/tiny", cache_dir=cache, offline=True).revision_sha)
for bad in ("hf://org/tiny@v9", "hf://org/none"):
    try:
        resolve(bad, cache_dir=cache, offline=False)
    except HubError as exc:
        print(exc)
"""
    done = run_against(fake_hf_hub, code, str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[:2] == [str(tmp_path / "models--org--tiny" / "snapshots" / COMMIT), COMMIT]
    assert {p.name: p.read_bytes() for p in Path(out[0]).iterdir()} == hub_files()
    assert out[2] == "huggingface: org/tiny@v9: the hub has no such revision"
    assert out[3].startswith("huggingface: org/none@default branch: no such repository on the hub")
    # stderr is no terminal here: progress comes as lines, the last one with the whole size
    assert re.search(r"huggingface: org/tiny@default branch: 3\.0 MiB of 3\.0 MiB \([\d.]+ MiB/s\) done",
                     done.stderr), done.stderr
    assert ("GET", f"/org/tiny/resolve/{COMMIT}/big.bin", None) in fake_hf_hub.requests


def test_modelscope_per_file_callbacks_sum_into_progress_lines():
    from modelscope.hub.callback import ProgressCallback

    from harness.hub import LineProgress, _ms_callback_class

    lines: list[str] = []
    progress = LineProgress("modelscope: org/tiny@v1.0", lines.append, interval_s=3600)
    callback = _ms_callback_class(progress)
    # modelscope makes one instance per file with (path, size), then calls update(n) and end()
    assert {"update", "end"} <= set(dir(ProgressCallback))
    for name, size in (("a.safetensors", 3 * 2**20), ("config.json", 2**20)):
        each = callback(name, size)
        each.update(size // 2)
        each.update(size - size // 2)
        each.end()
    progress.finish()
    # the first update, when only the first file has started (modelscope announces each file as it starts)
    assert lines[0].startswith("modelscope: org/tiny@v1.0: 1.5 MiB of 3.0 MiB (")
    assert lines[-1].startswith("modelscope: org/tiny@v1.0: 4.0 MiB of 4.0 MiB (") and lines[-1].endswith(" done")
