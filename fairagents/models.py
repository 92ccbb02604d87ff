"""The embedded default: tiny random-weight models built locally, with no network.

With no configuration, fairagents serves three models of random weights, one per
modality, each with a byte-level BPE tokenizer trained here on synthetic text:

- ``text``: a Llama-shaped LLM (hidden 128, 2 heads of 64, 2 layers) whose chat
  template offers tools and writes calls in the Hermes syntax (``<tool_call>``);
- ``vision``: an Idefics3 VLM (a 2-layer ViT of width 64 on 56-pixel tiles, a
  pixel-shuffle connector, the same tiny Llama): an image becomes up to 4 tiles
  and a global view of 4 image tokens each (vLLM runs Idefics3 without torchvision);
  its template offers tools as the text model's does, and tool results may carry images;
- ``image``: a PixArt-α pipeline (a DiT denoiser of width 64 and 2 layers with 2×2
  patches, a 2-layer T5 text encoder, a VAE that downsamples 2×).

Their output is gibberish (noise, for the image model); their serving, batching,
token counts and timings are real. Models are built once into ``$FAIRAGENTS_HOME/models`` (default:
``~/.cache/fairagents``), atomically, so concurrent first uses do not collide.

Building needs ``torch``, ``transformers`` and ``tokenizers`` (the ``cpu`` or ``gpu``
extra), and ``diffusers`` for the image model. Each model is built the first time it is
asked for (``ensure_default_models(["vision"])`` builds only that one).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fairagents._logging import get_logger
from fairagents.errors import InvalidParameterError, ModelLoadError

__all__ = [
    "DEFAULT_IMAGE_MODEL",
    "DEFAULT_TEXT_MODEL",
    "DEFAULT_VISION_MODEL",
    "EMBEDDED_CONTEXT",
    "EMBEDDED_MAX_CONTEXT",
    "LOAD_LOCK",
    "build_image_model",
    "build_text_model",
    "build_vision_model",
    "check_model_source",
    "ensure_default_models",
    "home",
    "model_path",
]

log = get_logger("fairagents.models")

#: Held while a thread imports model libraries and loads or builds a model: transformers' lazy
#: imports are not thread-safe, and engines start in parallel threads.
LOAD_LOCK = threading.Lock()

#: Name of the embedded text model; bump the suffix when the recipe changes.
DEFAULT_TEXT_MODEL = "tiny-llama-v3"
#: Context an engine serves the embedded text model with unless told otherwise (``max_model_len``); the model
#: holds up to :data:`EMBEDDED_MAX_CONTEXT`, enough for a coding agent's prompt of tens of thousands of tokens.
EMBEDDED_CONTEXT = 2048
#: Longest context the embedded text model holds (its ``max_position_embeddings``).
EMBEDDED_MAX_CONTEXT = 131_072
#: Name of the embedded vision-language model.
DEFAULT_VISION_MODEL = "tiny-idefics3-v2"
#: Name of the embedded image-generation (diffusion) model.
DEFAULT_IMAGE_MODEL = "tiny-pixart-v1"

_SPECIALS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
# Idefics3's image tokens: the placeholder, the tile frame, the global view, the tile grid.
_VISION_SPECIALS = [
    *_SPECIALS,
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
]
# Tools are offered, called and answered in the Hermes syntax (vLLM's "hermes" tool parser reads it).
_TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|tool|>"]
_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nYou may call these functions:\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'To call one, write <tool_call>{"name": <name>, "arguments": <arguments object>}</tool_call>'
    "{{ eos_token }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|tool|>\n<tool_response>{{ m['content'] }}</tool_response>{{ eos_token }}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}"
    '<tool_call>{"name": "{{ c[\'function\'][\'name\'] }}", "arguments": {{ c[\'function\'][\'arguments\'] | tojson }}}'
    "</tool_call>{% endfor %}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Content is text, or a list of parts: {"type": "text", "text": ...} and {"type": "image"}. Tools, calls and tool
# results (which may carry images) as the text model's template has them, in the Hermes syntax.
_VISION_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call these functions:\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'To call one, write <tool_call>{"name": <name>, "arguments": <arguments object>}</tool_call>'
    "<end_of_utterance>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|tool|>\n<tool_response>{% else %}<|{{ m['role'] }}|>\n{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %}"
    '<tool_call>{"name": "{{ c[\'function\'][\'name\'] }}", "arguments": {{ c[\'function\'][\'arguments\'] | tojson }}}'
    "</tool_call>{% endfor %}"
    "{% if m['role'] == 'tool' %}</tool_response>{% endif %}<end_of_utterance>\n"
    "{% endfor %}"
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


def check_model_source(source: str, *, timeout: float = 5.0, hub: bool = True) -> None:
    """Raise :class:`~fairagents.errors.ModelLoadError`, in one line, if ``source`` cannot be a model to load.

    ``source`` is a model folder here, or a Hugging Face name (``org/model``) found in
    the local Hugging Face cache or on the Hub. What fails says why: no such folder, a
    folder without ``config.json`` (or a diffusers ``model_index.json``), a name the Hub
    does not have, or a Hub out of reach within ``timeout`` seconds (engines would
    otherwise retry for half a minute before their own, longer error). With ``hub=False``
    only what is on this disk is checked: a Hugging Face name passes unchecked.

    Examples:
        >>> from fairagents.models import check_model_source
        >>> check_model_source("/no/such/model")
        Traceback (most recent call last):
            ...
        fairagents.errors.ModelLoadError: no folder '/no/such/model' (a Hugging Face name has the form 'org/model')
    """
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{source!r} is a file; a model is a folder with a config.json")
        if not any((path / marker).is_file() for marker in ("config.json", "model_index.json")):
            raise ModelLoadError(f"{source!r} has no config.json: not a model folder")
        return
    if source.startswith(("/", ".", "~")) or source.count("/") > 1 or (os.sep != "/" and os.sep in source):
        raise ModelLoadError(f"no folder {source!r} (a Hugging Face name has the form 'org/model')")
    if not hub:
        return
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        if any(isinstance(try_to_load_from_cache(source, marker), str) for marker in ("config.json", "model_index.json")):
            return  # in the local Hugging Face cache
    except HFValidationError:
        raise ModelLoadError(f"no folder {source!r}, and it is not a Hugging Face name ('org/model')") from None
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"no folder {source!r}, and it is not in the Hugging Face cache (HF_HUB_OFFLINE is set)")
    try:
        HfApi().model_info(source, timeout=timeout)
    except GatedRepoError:
        raise ModelLoadError(f"{source!r} is gated on the Hugging Face Hub: accept its terms, then set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"no folder {source!r}, and no such model on the Hugging Face Hub "
                             "(or it is private: set HF_TOKEN)") from None
    except Exception as err:  # noqa: BLE001 - any failure to reach the Hub is the same advice
        raise ModelLoadError(f"no folder {source!r}, and the Hugging Face Hub could not be reached "
                             f"({type(err).__name__}, timeout {timeout:g} s): download the model and give its folder, or set "
                             "HF_HUB_OFFLINE=1 with it in the Hugging Face cache") from None


def ensure_default_models(kinds: Iterable[str] = ("text", "vision", "image")) -> dict[str, Path]:
    """Build the embedded models of ``kinds`` that are missing; their folders by kind.

    Kinds are ``"text"``, ``"vision"`` and ``"image"``; each is built at most once,
    under a file lock, into a staging folder renamed into place when complete. In one
    process a build holds :data:`LOAD_LOCK`, as engines do while they load.
    """
    builders = {
        "text": (DEFAULT_TEXT_MODEL, build_text_model),
        "vision": (DEFAULT_VISION_MODEL, build_vision_model),
        "image": (DEFAULT_IMAGE_MODEL, build_image_model),
    }
    paths: dict[str, Path] = {}
    for kind in kinds:
        if kind not in builders:
            raise InvalidParameterError(f"unknown embedded model kind {kind!r}; kinds: {', '.join(builders)}")
        name, build = builders[kind]
        path = model_path(name)
        if not (path / _MARKER[kind]).exists():
            with LOAD_LOCK, _lock(path.parent / f".{name}.lock"):
                if not (path / _MARKER[kind]).exists():  # someone else may have built it meanwhile
                    build(path)
        paths[kind] = path
    return paths


# A folder is complete when this file exists (staging folders are renamed into place whole).
_MARKER = {"text": "config.json", "vision": "config.json", "image": "model_index.json"}


def build_text_model(out: Path, *, vocab_size: int = 1024, seed: int = 0) -> Path:
    """Build the tiny Llama and its locally trained tokenizer into ``out`` (replacing it)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with _staging(Path(out)) as staging:
        hf = _train_tokenizer(_SPECIALS, vocab_size, seed)
        hf.add_tokens(_TOOL_TOKENS)  # one token each, kept in decoded text (not special)
        hf.chat_template = _CHAT_TEMPLATE
        hf.save_pretrained(staging)
        config = LlamaConfig(
            vocab_size=len(hf),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,  # head_dim 64: vLLM's CPU attention rejects 16
            num_key_value_heads=2,
            max_position_embeddings=EMBEDDED_MAX_CONTEXT,  # rotary: no weight depends on it
            bos_token_id=hf.bos_token_id,
            eos_token_id=hf.eos_token_id,
            pad_token_id=hf.pad_token_id,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(staging)
    return Path(out)


def build_vision_model(out: Path, *, vocab_size: int = 1024, seed: int = 0) -> Path:
    """Build the tiny Idefics3 VLM, its processor and tokenizer into ``out`` (replacing it).

    A 56-pixel tile of 14-pixel patches is 16 patches, which the connector's pixel
    shuffle (scale 2) folds into 4 image tokens; the processor cuts an image into at
    most 2×2 tiles (longest edge 112) plus a global view, so an image costs 8 to 20
    image tokens plus its frame tokens.
    """
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, LlamaConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tile, patch, shuffle = 56, 14, 2
    with _staging(Path(out)) as staging:
        tok = _train_tokenizer(_VISION_SPECIALS, vocab_size, seed)
        tok.add_tokens(_TOOL_TOKENS)  # as the text model's: its template offers tools too
        tok.chat_template = _VISION_CHAT_TEMPLATE
        images = Idefics3ImageProcessorPil(
            size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile}, do_image_splitting=True
        )
        processor = Idefics3Processor(
            image_processor=images, tokenizer=tok, image_seq_len=(tile // patch) ** 2 // shuffle**2,
            chat_template=_VISION_CHAT_TEMPLATE,
        )
        processor.save_pretrained(staging)
        tok.save_pretrained(staging)
        text = LlamaConfig(
            vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,  # head_dim 64 for vLLM's CPU attention
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )
        config = Idefics3Config(
            vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                               image_size=tile, patch_size=patch),
            text_config=text, scale_factor=shuffle, image_token_id=tok.convert_tokens_to_ids("<image>"),
            pad_token_id=tok.pad_token_id, torch_dtype="float32",
        )
        torch.manual_seed(seed)
        Idefics3ForConditionalGeneration(config).save_pretrained(staging)
    return Path(out)


def build_image_model(out: Path, *, vocab_size: int = 1024, seed: int = 0) -> Path:
    """Build the tiny PixArt-α diffusion pipeline into ``out`` (replacing it).

    The denoiser is a DiT of 4 heads × 16 = width 64 and 2 layers over 2×2 patches of
    a latent that the VAE downsamples 2× (so a 64×64 image is 16 × 16 = 256 patches);
    the text encoder is a 2-layer T5 reading the locally trained tokenizer.
    """
    import torch
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    with _staging(Path(out)) as staging:
        tok = _train_tokenizer(_SPECIALS, vocab_size, seed)
        tok.model_max_length = 32
        torch.manual_seed(seed)
        encoder = T5EncoderModel(T5Config(
            vocab_size=len(tok), d_model=64, d_kv=16, num_heads=4, num_layers=2, d_ff=128,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        ))
        denoiser = PixArtTransformer2DModel(
            sample_size=32, num_layers=2, patch_size=2, attention_head_dim=16, num_attention_heads=4,
            caption_channels=64, in_channels=4, cross_attention_dim=64, out_channels=8, attention_bias=True,
            activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
            norm_elementwise_affine=False, norm_eps=1e-6,
        )
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            layers_per_block=1, norm_num_groups=8, sample_size=64,
        )
        pipe = PixArtAlphaPipeline(
            tokenizer=tok, text_encoder=encoder, vae=vae, transformer=denoiser, scheduler=DPMSolverMultistepScheduler()
        )
        pipe.save_pretrained(staging)
    return Path(out)


def _train_tokenizer(specials: list[str], vocab_size: int, seed: int) -> Any:
    """A byte-level BPE trained on :func:`_corpus`, adding ``<s>`` in front of every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=2048,
        additional_special_tokens=specials[3:],
    )


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A fresh folder beside ``out`` that replaces ``out`` whole if the block completes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("fairagents.models.built", model=str(out))


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
