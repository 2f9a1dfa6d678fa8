"""Secrets never reach a file: values of flags, env entries, `NAME=value` pairs and JSON or Python
mapping entries whose name says they are secret (API keys, tokens, passwords) are masked before
anything is written: commands, configs, log lines and the files EvalScope leaves behind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# "token" only as a whole word part (HF_TOKEN, --auth-token): --max-tokens, --tokenizer-path and
# --max-num-batched-tokens are settings, not secrets
_SECRET_NAME = re.compile(r"(api[_-]?key|secret|passw(or)?d|authorization|(^|[^a-z])token($|[^a-z]))",
                          re.IGNORECASE)
REDACTED = "***"


def _is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_argv(argv: list[str]) -> list[str]:
    """Mask the value after (or inside) a secret flag, and secret `NAME=value` arguments
    (e.g. EvalScope's `--headers Authorization=...`)."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(REDACTED)
            mask_next = False
        elif arg.startswith("-") and _is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                mask_next = True
        elif "=" in arg and _is_secret_name(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        elif "{" in arg:  # a JSON value: --extra-args '{"api_key": ...}', --kv-transfer-config '{...}'
            out.append(_QUOTED_ENTRY.sub(_mask_quoted, arg))
        else:
            out.append(arg)
    return out


_NAME = r"[A-Za-z0-9_.-]*"
# "key": "value" / 'key': 'value' / 'key': ['value'] (JSON, and Python reprs such as vLLM's
# "non-default args: {...}" start-up line)
_QUOTED_ENTRY = re.compile(r"""(?P<q>["'])(?P<name>""" + _NAME + r""")(?P=q)(?P<sep>\s*:\s*\[?\s*)"""
                           r"""(?P<vq>["'])(?P<value>(?:\\.|(?!(?P=vq)).)*)(?P=vq)""")
# --flag value / --flag=value / NAME=value / NAME: value inside free text
_FLAG_ENTRY = re.compile(r"(?P<name>--?" + _NAME + r")(?P<sep>[= ]+)(?P<value>[^\s'\",}\]]+)")
_ASSIGN_ENTRY = re.compile(r"(?<![-\w])(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<sep>=|:\s+)(?P<value>[^\s'\",}\]]+)")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


def _mask_quoted(m: re.Match) -> str:
    if not _is_secret_name(m["name"]):
        return m[0]
    return f"{m['q']}{m['name']}{m['q']}{m['sep']}{m['vq']}{REDACTED}{m['vq']}"


def redact_text(text: str) -> str:
    """A log line or file body with every secret value it shows masked."""
    def plain(m: re.Match) -> str:
        return m[0] if not _is_secret_name(m["name"]) else f"{m['name']}{m['sep']}{REDACTED}"

    text = _BEARER.sub(lambda m: m[1] + REDACTED, text)
    text = _QUOTED_ENTRY.sub(_mask_quoted, text)
    text = _FLAG_ENTRY.sub(plain, text)
    return _ASSIGN_ENTRY.sub(plain, text)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if _is_secret_name(k) else v) for k, v in env.items()}


def redact_config(obj: Any) -> Any:
    """A dumped config with secret-named mapping entries masked and argv-like lists redacted."""
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and _is_secret_name(k) and isinstance(v, str)
                    else redact_config(v)) for k, v in obj.items()}
    if isinstance(obj, list) and all(isinstance(x, str) for x in obj):
        return redact_argv(obj)
    if isinstance(obj, list):
        return [redact_config(x) for x in obj]
    return obj


TEXT_SUFFIXES = (".json", ".jsonl", ".log", ".txt", ".yaml", ".yml", ".md", ".csv", ".html")


def scrub_text_files(folder: Path) -> list[Path]:
    """Rewrite every text file under `folder` with its secrets masked; the files that changed."""
    changed = []
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or path.suffix.lower() not in TEXT_SUFFIXES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        clean = redact_text(text)
        if clean != text:
            path.write_text(clean, encoding="utf-8")
            changed.append(path)
    return changed
