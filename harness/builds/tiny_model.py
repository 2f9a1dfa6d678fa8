"""A tiny Llama with random weights, made from the shipped tokenizer, for a real vLLM on CPU.

Nothing is downloaded: the tokenizer is harness/data/tokenizers/harness-bpe (its vocabulary sets the
embedding size, its chat template comes along), the weights are numpy random numbers written
with safetensors. The folder lands in ~/.cache/hisparse-harness/models/<hash> on first use,
built in a temporary folder and renamed, so a half-written model is never served.

Shape: 2 layers, hidden 64, head size 32. vLLM's CPU attention only takes head sizes 32, 64,
80, ...; 16 passes /health and dies on the first request (docs/facts.md §8).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from harness.errors import HarnessError
from harness.io import data_path

TOKENIZER_DIR = data_path("tokenizers", "harness-bpe")
DEFAULT_MODELS_DIR = Path("~/.cache/hisparse-harness/models")
# The stable name launch profiles use: a link to the folder of the current generator and tokenizer.
TINY_MODEL_NAME = "tiny-llama-2l"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# bump when the generated files change, so a cached model of an older layout is not reused
GENERATOR_VERSION = 1

HIDDEN_SIZE = 64
INTERMEDIATE_SIZE = 128
NUM_LAYERS = 2
NUM_HEADS = 2
HEAD_DIM = 32
NUM_KV_HEADS = 2
MAX_POSITIONS = 4096
INIT_STD = 0.02
SEED = 0


def tokenizer_vocab_size(tokenizer_dir: Path = TOKENIZER_DIR) -> int:
    """Highest token id of the tokenizer (base vocabulary and added tokens) + 1."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1


def _eos_id(tokenizer_dir: Path) -> int:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos = config.get("eos_token")
    for token in data.get("added_tokens", []):
        if token["content"] == eos:
            return int(token["id"])
    return int(data["model"]["vocab"][eos])


def model_config(vocab_size: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "torch_dtype": "float32",
    }


def _weights(vocab_size: int, seed: int = SEED) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)

    def normal(*shape: int):
        return (rng.standard_normal(shape) * INIT_STD).astype(np.float32)

    q_out, kv_out = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    tensors = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN_SIZE),
               "model.norm.weight": np.ones(HIDDEN_SIZE, dtype=np.float32),
               "lm_head.weight": normal(vocab_size, HIDDEN_SIZE)}
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}"
        tensors |= {
            f"{p}.self_attn.q_proj.weight": normal(q_out, HIDDEN_SIZE),
            f"{p}.self_attn.k_proj.weight": normal(kv_out, HIDDEN_SIZE),
            f"{p}.self_attn.v_proj.weight": normal(kv_out, HIDDEN_SIZE),
            f"{p}.self_attn.o_proj.weight": normal(HIDDEN_SIZE, q_out),
            f"{p}.mlp.gate_proj.weight": normal(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{p}.mlp.up_proj.weight": normal(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{p}.mlp.down_proj.weight": normal(HIDDEN_SIZE, INTERMEDIATE_SIZE),
            f"{p}.input_layernorm.weight": np.ones(HIDDEN_SIZE, dtype=np.float32),
            f"{p}.post_attention_layernorm.weight": np.ones(HIDDEN_SIZE, dtype=np.float32),
        }
    return tensors


def _model_key(tokenizer_dir: Path = TOKENIZER_DIR) -> str:
    """Hash of everything the model folder is made from: the generator and the tokenizer files."""
    h = hashlib.sha256(f"tiny-llama-v{GENERATOR_VERSION}".encode())
    for name in TOKENIZER_FILES:
        h.update(name.encode() + b"\0" + (tokenizer_dir / name).read_bytes())
    return h.hexdigest()[:16]


def write_tiny_model(dest: Path, tokenizer_dir: Path = TOKENIZER_DIR) -> None:
    """Write config, generation config, tokenizer files and random weights into `dest` (exists)."""
    from safetensors.numpy import save_file

    vocab_size, eos_id = tokenizer_vocab_size(tokenizer_dir), _eos_id(tokenizer_dir)
    (dest / "config.json").write_text(json.dumps(model_config(vocab_size, eos_id), indent=2) + "\n")
    generation = {"eos_token_id": eos_id, "pad_token_id": eos_id}
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, dest / name)
    save_file(_weights(vocab_size), str(dest / "model.safetensors"), metadata={"format": "pt"})


def ensure_tiny_model(models_dir: Path | None = None, tokenizer_dir: Path = TOKENIZER_DIR) -> Path:
    """The stable path of the tiny model (models/tiny-llama-2l), generated on first use.

    The files live in models/tiny-llama-2l-<hash of generator and tokenizer>; the stable name is a
    symlink to it, switched atomically, so a profile can name one fixed path while a changed
    tokenizer or generator still gets a fresh model.
    """
    for name in TOKENIZER_FILES:
        if not (tokenizer_dir / name).is_file():
            raise HarnessError(f"tiny model: tokenizer file {tokenizer_dir / name} is missing")
    root = (models_dir or DEFAULT_MODELS_DIR).expanduser()
    final = root / f"tiny-llama-2l-{_model_key(tokenizer_dir)}"
    if not (final / "model.safetensors").is_file():
        _generate(final, root, tokenizer_dir)
    link = root / TINY_MODEL_NAME
    if not (link.is_symlink() and os.readlink(link) == final.name):
        tmp_link = root / f".tmp-link-{os.getpid()}"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(final.name)
        os.replace(tmp_link, link)
    return link


def tiny_model_path(models_dir: Path | None = None) -> Path:
    """Where ensure_tiny_model puts the stable name (expanded, not created)."""
    return (models_dir or DEFAULT_MODELS_DIR).expanduser() / TINY_MODEL_NAME


def _generate(final: Path, root: Path, tokenizer_dir: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-tiny-", dir=root))
    try:
        write_tiny_model(tmp, tokenizer_dir)
        os.chmod(tmp, 0o755)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "model.safetensors").is_file():  # not a concurrent maker's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
