"""A small Whisper model for tests, built here, and audio to feed it.

The tokenizer is a real ``WhisperTokenizer`` (transformers) over a real byte-level BPE:
the Qwen3 tokenizer's first 50,257 tokens (``mlxcore.testing.small_vocab``), then
Whisper's special tokens in Whisper's order (end of text, start of transcript, 99
languages, translate, transcribe, start of LM, start of previous, no speech, no
timestamps, 1,501 timestamps), so the vocabulary has the multilingual models' 51,865
entries and language and task tokens work as in whisper-tiny..large-v2. The weights are
seeded random numbers in mlx-audio's Whisper module, float32.
"""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np

TEXT_TOKENS = 50257
"""Regular tokens before ``<|endoftext|>`` (as in Whisper's multilingual vocabulary)."""
TINY = {"n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 64, "n_audio_head": 2,
        "n_audio_layer": 2, "n_text_ctx": 64, "n_text_state": 64, "n_text_head": 2,
        "n_text_layer": 2}  # fmt: skip
WHISPER_TINY = {"n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 384, "n_audio_head": 6,
                "n_audio_layer": 4, "n_text_ctx": 448, "n_text_state": 384,
                "n_text_head": 6, "n_text_layer": 4}  # fmt: skip
"""whisper-tiny's shape (for speed measurements)."""


def whisper_specials() -> list[str]:
    """Whisper's special tokens after ``<|endoftext|>``, in their id order."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    languages = [f"<|{code}|>" for code in list(LANGUAGES)[:99]]
    tasks = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>"]
    times = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    return ["<|startoftranscript|>", *languages, *tasks, "<|nospeech|>", "<|notimestamps|>", *times]


def write_whisper_tokenizer(folder: Path) -> int:
    """The tokenizer and feature extractor (a ``WhisperProcessor``) saved in ``folder``;
    returns the vocabulary's size."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    from mlxcore.testing.small_vocab import BYTE_TOKENS, small_qwen3_tokenizer

    data, _ = small_qwen3_tokenizer(TEXT_TOKENS - BYTE_TOKENS)
    vocab = dict(data["model"]["vocab"])
    vocab["<|endoftext|>"] = len(vocab)
    merges = [tuple(merge) for merge in data["model"]["merges"]]
    tokenizer = WhisperTokenizer(vocab=vocab, merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": whisper_specials()})
    processor = WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer)
    processor.save_pretrained(str(folder))
    return len(tokenizer)


def build_whisper(folder: Path, shape: dict[str, int] | None = None, seed: int = 0) -> Path:
    """A Whisper checkpoint (mlx-audio's names, ``config.json`` in its format) of
    ``shape`` (default :data:`TINY`) with seeded weights, in ``folder``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_whisper_tokenizer(folder)
    dims = {**(shape or TINY), "n_vocab": vocab}
    mx.random.seed(seed)
    model = Model(ModelDimensions(**dims), dtype=mx.float32)
    # mlx-audio starts the learned positions at zero: every step would look alike
    positions = model.decoder.positional_embedding
    model.decoder.positional_embedding = mx.random.normal(positions.shape) * 0.5
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    mx.save_safetensors(str(folder / "model.safetensors"), dict(params))
    config = {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]}
    (folder / "config.json").write_text(json.dumps({**config, **dims}, indent=2) + "\n")
    return folder


def speechlike(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    """A speech-like signal (float32 in [-1, 1]): voiced syllables of a few hundred
    milliseconds — a pitch with its harmonics, shaped by formant-like bands and a
    syllable envelope — separated by short pauses."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * rate), dtype=np.float32)
    at = 0
    while at < len(out):
        length = int(rate * rng.uniform(0.12, 0.35))
        t = np.arange(length) / rate
        pitch = rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(2, 5) * t))
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        voice = sum(np.sin(k * phase) / k for k in range(1, 8))
        formants = rng.uniform([300, 900], [800, 2400])
        voice += sum(0.3 * np.sin(2 * np.pi * f * t) for f in formants)
        syllable = (voice * np.sin(np.pi * t / t[-1]) ** 2 * 0.2).astype(np.float32)
        end = min(len(out), at + length)
        out[at:end] = syllable[: end - at]
        at = end + int(rate * rng.uniform(0.03, 0.25))
    return out


def wav_bytes(samples: np.ndarray, rate: int = 16000, channels: int = 1) -> bytes:
    """``samples`` (float in [-1, 1]; frames x channels when ``channels`` > 1) as a
    16-bit PCM WAV file."""
    pcm = np.clip(np.round(np.asarray(samples) * 32767), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


SOPRANO_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "max_position_embeddings": 2048, "rope_theta": 10000.0,
                "rms_norm_eps": 1e-6}  # fmt: skip
"""A small Soprano language model (its Vocos decoder keeps Soprano's own shape)."""


def build_soprano(folder: Path, seed: int = 0, merges: int = 2000) -> Path:
    """A Soprano text-to-speech checkpoint (mlx-audio's ``soprano``: a Qwen3 language
    model whose hidden states a Vocos decoder turns into 32 kHz audio) with seeded
    weights: the Qwen3 tokenizer cut to ``merges`` merges plus Soprano's ``[STOP]``,
    ``[TEXT]`` and ``[START]`` tokens."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.soprano.soprano import Model, ModelConfig
    from transformers import AutoTokenizer

    from mlxcore.testing.small_vocab import write_small_qwen3_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_small_qwen3_tokenizer(folder, merges)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_special_tokens(
        {"pad_token": "[STOP]", "additional_special_tokens": ["[STOP]", "[TEXT]", "[START]"]}
    )
    tokenizer.save_pretrained(str(folder))
    config = {"model_type": "soprano", **SOPRANO_TINY, "vocab_size": len(tokenizer),
              "tie_word_embeddings": False, "sample_rate": 32000}  # fmt: skip
    mx.random.seed(seed)
    model = Model(ModelConfig.from_dict({**config, "model_path": str(folder)}))
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    mx.save_safetensors(str(folder / "model.safetensors"), dict(params))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
