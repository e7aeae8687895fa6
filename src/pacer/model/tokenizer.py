"""Text <-> token ids: a thin wrapper over a transformers fast tokenizer, and streaming detokenization.

`Tokenizer.load(path)` reads an HF directory's tokenizer files, or builds the tokenizer a GGUF file
describes in its metadata. Building from GGUF through transformers takes seconds (most of it parsing
the metadata), so the common byte-level BPE case is built directly with `tokenizers` and every GGUF
tokenizer is cached as an HF tokenizer directory next to the dequantized weights (see
`gguf_cache_stem`). `IncrementalDetokenizer` turns a growing list of ids into text pieces in
O(new tokens) per call. This module touches only tokenizer files and the GGUF cache directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Tokenizer", "IncrementalDetokenizer", "gguf_cache_stem", "default_cache_dir"]

logger = logging.getLogger(__name__)

# bump when the cached files' content or layout changes, so old caches are not reused
CACHE_VERSION = 1
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# llama.cpp's `tokenizer.ggml.pre` names whose split we rebuild directly (the same regexes
# transformers uses); any other pre-tokenizer or tokenizer model goes through transformers.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# GPT-2's own split; llama.cpp's smollm also isolates digits, which its vocabulary never merges anyway
_PRE_GPT2_REGEX = ("gpt2", "smollm")
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


def default_cache_dir() -> Path:
    """`$PACER_CACHE_DIR/gguf`, else `~/.cache/pacer/gguf` (read at call time, not at import)."""
    root = os.environ.get("PACER_CACHE_DIR")
    return Path(root) / "gguf" if root else Path.home() / ".cache" / "pacer" / "gguf"


def gguf_cache_stem(gguf_path: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Cache path prefix for one GGUF file, keyed by (absolute path, size, mtime): a changed or
    replaced file gets a new key. Callers append their own suffix."""
    path = Path(gguf_path).resolve()
    st = path.stat()
    key = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{CACHE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / f"{path.stem}-{digest}"


class Tokenizer:
    """Encode, decode and chat templates over a transformers fast tokenizer.

    `encode` adds BOS only when the model's tokenizer does so by default; `decode` never applies
    transformers' "clean up tokenization spaces" (it changes model output and breaks streaming).
    """

    def __init__(self, hf_tokenizer: Any) -> None:
        if not getattr(hf_tokenizer, "is_fast", False):
            raise TypeError(f"Tokenizer needs a transformers fast tokenizer, got {type(hf_tokenizer).__name__}")
        self.hf = hf_tokenizer
        self._backend = hf_tokenizer.backend_tokenizer
        decoder = self._backend.get_added_tokens_decoder()
        # exactly the ids `decode(..., skip_special_tokens=True)` drops
        self._skip_ids = frozenset(i for i, tok in decoder.items() if tok.special)
        self._added_ids = frozenset(decoder)
        self._byte_decoder: dict[str, int] | None = None
        if type(self._backend.decoder).__name__ == "ByteLevel":
            self._byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}

    @classmethod
    def load(cls, path: str, *, cache_dir: str | None = None, gguf_reader: Any = None) -> Tokenizer | None:
        """The tokenizer of an HF directory or a `.gguf` file; None if it has no tokenizer files / vocabulary.

        `gguf_reader`: an already-open `gguf.GGUFReader` of `path`, so a caller that has parsed the
        file does not pay for it twice. `cache_dir` defaults to `default_cache_dir()`.
        """
        p = Path(path)
        if p.is_dir():
            if not any((p / name).exists() for name in _TOKENIZER_FILES):
                return None
            from transformers import AutoTokenizer

            return cls(AutoTokenizer.from_pretrained(str(p)))
        if p.suffix == ".gguf" and p.is_file():
            hf_tokenizer = _load_gguf_tokenizer(str(p), cache_dir, gguf_reader)
            return None if hf_tokenizer is None else cls(hf_tokenizer)
        raise FileNotFoundError(f"no tokenizer at {path!r}: expected an HF model directory or a .gguf file")

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            chat_template: str | None = None, **template_kwargs: Any) -> list[int]:
        """Token ids of `messages` rendered with the model's chat template, or `chat_template` (its
        text), with `template_kwargs` as its extra variables (e.g. enable_thinking); specials in
        the rendered text, like a BOS the template writes, become their ids; nothing else is added."""
        if not chat_template and not self.hf.chat_template:
            raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                           chat_template=chat_template, **template_kwargs)
        return list(self.hf.encode(text, add_special_tokens=False))

    def chat_segments(self, messages: list[dict[str, Any]], roles: tuple[str, ...] = ("tool",),
                      add_generation_prompt: bool = True, chat_template: str | None = None,
                      **template_kwargs: Any) -> tuple[list[int], list[tuple[int, int]]]:
        """`apply_chat_template`'s token ids, and the token span (start, length) of the content of
        each segment message (`with_segments`: role in `roles` unless the message says otherwise in
        `"segment"`; the tokens wholly inside its text in the render; segment reuse's default
        segments: tool outputs)."""
        if not chat_template and not self.hf.chat_template:
            raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
        text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                           chat_template=chat_template, **template_kwargs)
        return self.with_segments(text, messages, roles)

    def with_segments(self, text: str, messages: list[dict[str, Any]], roles: tuple[str, ...]
                      ) -> tuple[list[int], list[tuple[int, int]]]:
        """`text` (a chat render of `messages`) as token ids, and the token span (start, length) of
        each segment message's content: the tokens wholly inside its text in the render. A message
        is a segment when its `"segment"` says so (a client's mark), else when its role is in `roles`."""
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        spans: list[tuple[int, int]] = []
        pos = 0
        for m in messages:
            content = m.get("content")
            if not isinstance(content, str) or not content or (at := text.find(content, pos)) < 0:
                continue
            pos = at + len(content)
            if not m.get("segment", m.get("role") in roles):
                continue
            inside = [i for i, (a, b) in enumerate(offsets) if a >= at and b <= pos and b > a]
            if inside:
                spans.append((inside[0], inside[-1] + 1 - inside[0]))
        return ids, spans

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for. A byte-level BPE token may hold part of a UTF-8
        character, which `decode([token_id])` shows as U+FFFD; its bytes here are exact."""
        piece = self._backend.id_to_token(token_id)
        if piece is not None and self._byte_decoder is not None and token_id not in self._added_ids:
            try:
                return bytes(self._byte_decoder[c] for c in piece)
            except KeyError:   # not a byte-level piece after all
                pass
        return self.decode([token_id], skip_special_tokens=False).encode()

    @property
    def eos_token_id(self) -> int | None:
        token_id = self.hf.eos_token_id
        return None if token_id is None else int(token_id)

    @property
    def bos_token_id(self) -> int | None:
        token_id = self.hf.bos_token_id
        return None if token_id is None else int(token_id)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included (a model's embedding may have more rows)."""
        return len(self.hf)

    @property
    def all_special_ids(self) -> list[int]:
        """Named special tokens plus every added token marked special (control tokens)."""
        return sorted(self._skip_ids.union(self.hf.all_special_ids))

    def _is_skipped(self, token_id: int) -> bool:
        return token_id in self._skip_ids


class IncrementalDetokenizer:
    """Streams text from ids as they are generated, the way vLLM does.

    Each push decodes a short window: the text of `ids[prefix_offset:read_offset]` (already emitted,
    there for context such as a SentencePiece leading space) and of `ids[prefix_offset:]`; the new
    text is the difference. Output ending in U+FFFD is held back, since it is usually a character
    whose UTF-8 bytes span tokens not yet seen. Concatenating every push (and `flush()`) gives
    `tokenizer.decode(all_ids, skip_special_tokens)`.
    """

    _CONTEXT_TOKENS = 5  # ids kept before read_offset as decoding context

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []  # kept ids (skipped specials are dropped on arrival)
        self._prefix_offset = 0
        self._read_offset = 0
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def push(self, new_token_ids: Iterable[int]) -> str:
        """Add ids; return the text they complete ("" while a character is still incomplete)."""
        if self._skip_special_tokens:
            kept = [i for i in new_token_ids if not self._tokenizer._is_skipped(i)]
        else:
            kept = list(new_token_ids)
        if not kept:
            return ""
        self._ids.extend(kept)
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of a stream: return held-back text even if it ends incomplete."""
        return self._emit(final=True) if self._read_offset < len(self._ids) else ""

    def _emit(self, final: bool) -> str:
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=False)
        full_text = decode(self._ids[self._prefix_offset:], skip_special_tokens=False)
        if not final and (len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd")):
            return ""
        new_text = full_text[len(prefix_text):]
        self._read_offset = len(self._ids)
        self._prefix_offset = max(0, self._read_offset - self._CONTEXT_TOKENS)
        self._pieces.append(new_text)
        return new_text


# ---------------------------------------------------------------- GGUF tokenizers


def _load_gguf_tokenizer(path: str, cache_dir: str | None, reader: Any) -> Any:
    from transformers import AutoTokenizer

    stem = gguf_cache_stem(path, cache_dir)
    cached = stem.with_name(stem.name + ".tokenizer")
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    hf_tok = _build_gguf_tokenizer(path, reader)
    if hf_tok is None:
        return None
    _save_atomically(hf_tok, cached)
    return hf_tok


def _build_gguf_tokenizer(path: str, reader: Any) -> Any:
    if reader is None:
        import gguf

        reader = gguf.GGUFReader(path)
    meta = _gguf_tokenizer_metadata(reader.fields)
    if "tokens" not in meta:
        return None  # a GGUF without a vocabulary
    if meta.get("model") == "gpt2" and (meta.get("pre") in _PRE_SPLITS or meta.get("pre") in _PRE_GPT2_REGEX):
        return _byte_level_bpe(meta)
    from transformers import AutoTokenizer  # anything else: transformers' converter (slow, done once)

    p = Path(path).resolve()
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def _gguf_tokenizer_metadata(fields: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("model", "pre", "tokens", "merges", "token_type", "bos_token_id", "eos_token_id",
            "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token")
    meta = {k: fields[f"tokenizer.ggml.{k}"].contents() for k in keys if f"tokenizer.ggml.{k}" in fields}
    if "tokenizer.chat_template" in fields:
        meta["chat_template"] = fields["tokenizer.chat_template"].contents()
    return meta


def _byte_level_bpe(meta: dict[str, Any]) -> Any:
    """Byte-level BPE from GGUF metadata, built the way transformers' GGUF converter builds it."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    fast_tokenizer: Any = PreTrainedTokenizerFast  # untyped in transformers

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens: list[str] = list(meta["tokens"])
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("merges", [])]
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    split = _PRE_SPLITS.get(meta["pre"])
    if split is None:
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        raw.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    raw.decoder = decoders.ByteLevel()
    types = list(meta.get("token_type", ()))
    # a control token spelled outside the byte alphabet is a llama.cpp mislabel (see transformers)
    control = [t for t, k in zip(tokens, types) if k == _GGUF_CONTROL and set(t) <= alphabet]
    user = [t for t, k in zip(tokens, types) if k == _GGUF_USER_DEFINED and t in vocab]
    raw.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    raw.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    def token(key: str) -> str | None:
        idx = meta.get(key)
        return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None

    return fast_tokenizer(
        tokenizer_object=raw,
        bos_token=token("bos_token_id"), eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"), pad_token=token("padding_token_id"),
        add_bos_token=bool(meta.get("add_bos_token", False)),
        add_eos_token=bool(meta.get("add_eos_token", False)),
        chat_template=meta.get("chat_template"),
        clean_up_tokenization_spaces=False,
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _save_atomically(hf_tokenizer: Any, target: Path) -> None:
    """Write the tokenizer directory under a temporary name, then rename it into place; a
    concurrent writer that wins the rename leaves ours to be discarded. A cache that cannot be
    written only costs speed."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp-"))
    except OSError as e:
        logger.warning("not caching the GGUF tokenizer in %s: %s", target.parent, e)
        return
    try:
        hf_tokenizer.save_pretrained(str(tmp))
        with contextlib.suppress(OSError):  # target already there: another process was faster
            os.rename(tmp, target)
    except OSError as e:
        logger.warning("not caching the GGUF tokenizer at %s: %s", target, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
