"""One tokenizer interface for the builder, the verifier and the simulated engine.

"Bare" tokens are what the blog counts: a message's content encoded with no special
tokens and no chat template. `count_chat` is what vLLM counts for a chat request: the
chat template rendered with the generation prompt, then encoded without adding special
tokens (the template already holds them).

Three ways in:
- a local folder with tokenizer.json (+ tokenizer_config.json carrying a chat_template):
  transformers' AutoTokenizer;
- a bare tokenizer.json file: the `tokenizers` library, with SIMPLE_CHAT_TEMPLATE;
- a hub id (`org/name`, `ms://org/name@rev`, `hf://...`): the tokenizer's files are fetched through
  harness/hub.py (only those files, never the weights) and loaded as a local folder.

transformers is imported lazily: the simulated engine imports this module at start.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.hub import Hub, HubError, HubRef, ResolvedRef, check_trust_remote_code, resolve
from harness.io import data_path

DEFAULT_TOKENIZER_DIR = data_path("tokenizers", "harness-bpe")

# Files whose bytes decide how text becomes tokens and how chats are rendered.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt")
# What a hub tokenizer needs besides those: AutoTokenizer reads config.json for the model type, and
# remote code (*.py) only runs with trust_remote_code at a pinned revision.
HUB_EXTRA_FILES = ("config.json",)

# The template used when only a tokenizer.json is given (no tokenizer_config.json). It is
# GLM-shaped: a fixed prefix, then `<|role|>\n` + content per message, then the
# generation prompt. The shipped tokenizer's config carries the same template in Jinja,
# so both ways of loading it count chats identically.
SIMPLE_CHAT_PREFIX = "[gMASK]<sop>"
SIMPLE_CHAT_GENERATION_PROMPT = "<|assistant|>\n"
SIMPLE_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _render_simple_chat(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    parts = [SIMPLE_CHAT_PREFIX]
    for message in messages:
        parts.append(f"<|{message['role']}|>\n{message.get('content') or ''}")
    if add_generation_prompt:
        parts.append(SIMPLE_CHAT_GENERATION_PROMPT)
    return "".join(parts)


def _text_of(content: Any) -> str:
    """Message content as text: OpenAI list-of-blocks content keeps its text parts."""
    if isinstance(content, list):
        return "\n".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content
                         if isinstance(b, str) or (isinstance(b, dict) and b.get("type", "text") == "text"))
    return content if isinstance(content, str) else ("" if content is None else str(content))


def default_tokenizer_path() -> Path:
    """The small BPE tokenizer shipped with the repository (trained by tools/train_tokenizer.py)."""
    return DEFAULT_TOKENIZER_DIR


class Tokenizer:
    """A loaded tokenizer. `backend` is the `tokenizers.Tokenizer` doing the work."""

    def __init__(self, name: str, backend: Any, fingerprint: str, hf_tokenizer: Any = None,
                 chat_template: str | None = None):
        self.name = name
        self.backend = backend
        self.fingerprint = fingerprint
        self._hf = hf_tokenizer
        self.chat_template = chat_template
        self.origin: ResolvedRef | None = None  # the hub snapshot it came from, for a hub tokenizer

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, fingerprint={self.fingerprint[:12]})"

    def encode_bare(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        # No clean-up of spaces: the text must re-encode as closely as possible.
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def count_bare(self, text: str) -> int:
        return self.count_bare_batch([text])[0]

    def count_bare_batch(self, texts: Sequence[str]) -> list[int]:
        """Bare counts of many texts in one parallel call (without offsets: several times faster)."""
        texts = list(texts)
        if not texts:
            return []
        encode = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
        return [len(e) for e in encode(texts, add_special_tokens=False)]

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt text vLLM would build for these messages (with the generation prompt)."""
        plain = [{"role": m["role"], "content": _text_of(m.get("content"))} for m in messages]
        if self._hf is not None and getattr(self._hf, "chat_template", None):
            try:
                return self._hf.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
            except Exception as exc:  # a template that raises is the tokenizer's problem, say so in one line
                raise HarnessError(f"tokenizer {self.name}: chat template failed: "
                                   f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        return _render_simple_chat(plain, add_generation_prompt=True)

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        # vLLM encodes a rendered chat prompt with add_special_tokens=False (the template has them).
        return self.count_bare(self.render_chat(messages))


def _files_fingerprint(folder: Path, names: Sequence[str] = TOKENIZER_FILES) -> str:
    digest = hashlib.sha256()
    for name in sorted(names):
        path = folder / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _load_tokenizer_json(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as RawTokenizer

    try:
        backend = RawTokenizer.from_file(str(path))
    except Exception as exc:
        raise HarnessError(f"{path}: not a readable tokenizer.json ({str(exc).splitlines()[0][:200]})") from None
    return Tokenizer(name=str(path), backend=backend,
                     fingerprint=_files_fingerprint(path.parent, (path.name,)),
                     chat_template=SIMPLE_CHAT_TEMPLATE)


def _backend_of(hf: Any, name: str) -> Any:
    backend = getattr(hf, "backend_tokenizer", None) or getattr(hf, "_tokenizer", None)
    if backend is None:
        raise HarnessError(f"tokenizer {name}: only fast tokenizers (with a tokenizer.json) are supported")
    return backend


def _load_folder(folder: Path, trust_remote_code: bool) -> Tokenizer:
    if not (folder / "tokenizer_config.json").is_file():
        if (folder / "tokenizer.json").is_file():
            tok = _load_tokenizer_json(folder / "tokenizer.json")
            tok.name = str(folder)
            return tok
        raise HarnessError(f"{folder}: no tokenizer.json or tokenizer_config.json in this folder")
    hf = _auto_tokenizer(str(folder), trust_remote_code, local_only=True)
    return Tokenizer(name=str(folder), backend=_backend_of(hf, str(folder)),
                     fingerprint=_files_fingerprint(folder), hf_tokenizer=hf,
                     chat_template=getattr(hf, "chat_template", None) or None)


def _auto_tokenizer(name: str, trust_remote_code: bool, local_only: bool) -> Any:
    import logging
    import warnings

    # transformers prints advice about the missing torch at import; the harness never needs torch
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code,
                                                 local_files_only=local_only)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            hint = "" if trust_remote_code else " (does it need trust_remote_code: true?)"
            raise HarnessError(f"tokenizer {name}: cannot load: {first[:300]}{hint}") from None


def _load_hub(name: str, trust_remote_code: bool, revision: str | None, hub: Hub | None) -> Tokenizer:
    try:
        ref = HubRef.parse(name, default_hub=hub, revision=revision)
        if trust_remote_code:
            check_trust_remote_code(ref)
        patterns = [*TOKENIZER_FILES, *HUB_EXTRA_FILES, *(["*.py"] if trust_remote_code else [])]
        resolved = resolve(ref, allow_patterns=patterns)
    except HubError as exc:
        raise HarnessError(f"tokenizer {exc}") from None
    tokenizer = _load_folder(resolved.local_path, trust_remote_code)
    tokenizer.name, tokenizer.origin = str(ref), resolved
    return tokenizer


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(".json")


def load_tokenizer(name_or_path: str | Path, trust_remote_code: bool = False, *, revision: str | None = None,
                   hub: Hub | None = None) -> Tokenizer:
    """A tokenizer from a local folder, a tokenizer.json, or a hub id (at `revision`, from `hub` unless
    the id has its own ms:// or hf://); HarnessError when none loads."""
    text = str(name_or_path)
    path = Path(os.path.expanduser(text))
    if path.is_dir():
        return _load_folder(path.resolve(), trust_remote_code)
    if path.is_file():
        if path.name.endswith(".json"):
            return _load_tokenizer_json(path.resolve())
        raise HarnessError(f"{text}: a tokenizer file must be a tokenizer.json")
    if isinstance(name_or_path, Path) or _looks_local(text) or text.split("://")[-1].count("/") > 1:
        raise HarnessError(f"tokenizer {text}: no such file or folder")
    return _load_hub(text, trust_remote_code, revision, hub)


@lru_cache(maxsize=8)
def load_tokenizer_cached(name_or_path: str, trust_remote_code: bool = False, revision: str | None = None,
                          hub: Hub | None = None) -> Tokenizer:
    """load_tokenizer, memoised per process (loading a large tokenizer takes seconds)."""
    return load_tokenizer(name_or_path, trust_remote_code, revision=revision, hub=hub)
