"""The embedded default: tiny random-weight models built locally, with no network.

With no configuration, fairagents serves a Llama-shaped text model of random weights
(hidden 128, 2 heads of 64, 2 layers) with a byte-level BPE tokenizer trained here on
synthetic text. Its output is gibberish; its serving, batching, token counts and
timings are real. Models are built once into ``$FAIRAGENTS_HOME/models`` (default:
``~/.cache/fairagents``), atomically, so concurrent first uses do not collide.

Building needs ``torch``, ``transformers`` and ``tokenizers`` (the ``cpu`` or ``gpu``
extra).

Examples:
    >>> from fairagents import models
    >>> models.home().name
    'fairagents'
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import structlog

__all__ = ["DEFAULT_TEXT_MODEL", "build_text_model", "ensure_default_models", "home", "model_path"]

log = structlog.get_logger("fairagents.models")

#: Name of the embedded text model; bump the suffix when the recipe changes.
DEFAULT_TEXT_MODEL = "tiny-llama-v1"

_SPECIALS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def home() -> Path:
    """Where fairagents keeps built models: ``$FAIRAGENTS_HOME`` or ``~/.cache/fairagents``."""
    configured = os.environ.get("FAIRAGENTS_HOME")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fairagents"


def model_path(name: str) -> Path:
    """Folder of the built model ``name`` (it may not exist yet)."""
    return home() / "models" / name


def ensure_default_models() -> dict[str, Path]:
    """Build the embedded models that are missing; their folders by name."""
    path = model_path(DEFAULT_TEXT_MODEL)
    if not (path / "config.json").exists():
        with _lock(path.parent / f".{DEFAULT_TEXT_MODEL}.lock"):
            if not (path / "config.json").exists():  # someone else may have built it meanwhile
                build_text_model(path)
    return {"text": path}


def build_text_model(out: Path, *, vocab_size: int = 1024, seed: int = 0) -> Path:
    """Build the tiny Llama and its locally trained tokenizer into ``out`` (replacing it)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=_SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_corpus(seed), trainer)
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            model_max_length=2048,
            additional_special_tokens=_SPECIALS[3:],
        )
        hf.chat_template = _CHAT_TEMPLATE
        hf.save_pretrained(staging)
        config = LlamaConfig(
            vocab_size=len(hf),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,  # head_dim 64: vLLM's CPU attention rejects 16
            num_key_value_heads=2,
            max_position_embeddings=2048,
            bos_token_id=hf.bos_token_id,
            eos_token_id=hf.eos_token_id,
            pad_token_id=hf.pad_token_id,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("fairagents.models.built", model=str(out))
    return out


def _corpus(seed: int, lines: int = 4000) -> Iterator[str]:
    """Deterministic pseudo-English: common words, syllable-built words, numbers, punctuation."""
    rng = random.Random(seed)
    base = (
        "the a an of to and in is it that for on with as was at by be this from or have not are but what all "
        "when we there can your which their if do will each about how up out them then many some so these would "
        "other into has more two like see time could no make than first been who now people made over did down "
        "only way find use may long little very after words called just where most know agent model request "
        "token stream fair share client queue schedule server latency answer question hello world please thanks "
        "yes user assistant system tool call result error retry image vision plan drive road car"
    ).split()
    syllables = ["ka", "lo", "mi", "ra", "te", "su", "no", "ve", "an", "or", "is", "ul", "pre", "con", "ing",
                 "tion", "er", "ed", "ly", "ment", "st", "tr", "bl", "qu", "ph", "sh", "ch", "th"]
    words = base + ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(1500)]
    for _ in range(lines):
        ws = [rng.choice(words) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            ws.insert(rng.randrange(len(ws)), str(rng.randint(0, 9999)))
        text = " ".join(ws)
        yield text[0].upper() + text[1:] + rng.choice(".,?!:;")


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
