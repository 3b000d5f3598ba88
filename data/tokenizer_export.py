"""Write a run's tokenizer as Hugging Face tokenizer files, beside an exported model.

`AutoTokenizer.from_pretrained(folder)` then gives the ids the model was trained on, for
every tokenizer kind (see `data.tokenizers`):

- `byte`: no file exists, so one is built: a byte-level `tokenizer.json` whose ids 0..255
  are the 256 bytes in order, plus the end-of-document token as special id 256.
- `bpe`: the `tokenizer.json` trained for the run (in the cache).
- `file`: the configured `tokenizer.json`.
- `hf`: the tokenizer's own files (`save_pretrained`), special-token behaviour included.

The tokenizer is rebuilt from the data settings a checkpoint stores
(`datamodule_hyper_parameters`), exactly as the data module builds it, so the files hold
the tokenizer the model was trained with. For the first three kinds, encoding adds no
special token and decoding leaves spaces alone, as in training.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as LibraryTokenizer

from common.errors import DataError
from data.bpe import EOS_TOKEN
from data.datamodule import TextDataModule
from data.tokenizers import JsonTokenizer, Tokenizer, check_tokenizer_config
from lightning_modules.hf_interop import TokenizerIds

BYTE_VOCAB = 256
# The ASCII space is not printable for the byte-level alphabet: it becomes a stand-in character.
SPACE = 32


def save_hf_tokenizer(data_settings: Mapping[str, Any], out_dir: str | Path) -> TokenizerIds:
    """Write the tokenizer of these data settings into `out_dir`; return its size and special ids.

    bos is the tokenizer's own BOS token when it has one, else the end-of-document token:
    every packed training document follows an end-of-document token, so that is what the
    model has seen before a document starts. pad is the tokenizer's own pad token when it
    has one, else the end-of-document token (padding is masked out, any id does).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = TextDataModule(**data_settings).tokenizer
    settings = check_tokenizer_config(data_settings["tokenizer"])
    if settings["kind"] == "hf":
        return _save_transformers_tokenizer(settings["name"], tokenizer, out_dir)
    if settings["kind"] == "byte":
        library_tokenizer, split_special = byte_level_tokenizer(), True
    else:
        library_tokenizer, split_special = _trained_library_tokenizer(settings, data_settings, tokenizer), False
    eos_token = library_tokenizer.id_to_token(tokenizer.eos_id)
    library_tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_transformers_configs(out_dir, eos_token, split_special)
    return TokenizerIds(tokenizer.vocab_size, tokenizer.eos_id, bos_id=tokenizer.eos_id, pad_id=tokenizer.eos_id)


def byte_level_tokenizer() -> LibraryTokenizer:
    """The `byte` tokenizer as a `tokenizers` tokenizer: id b is byte b, EOS is special id 256.

    A byte-level BPE without merges: the ByteLevel pre-tokenizer maps every byte of the
    UTF-8 text to one character of its alphabet, and the vocabulary lists those characters
    in byte order; no prefix space is added, and the ByteLevel decoder maps them back.
    """
    alphabet = byte_level_alphabet()
    tokenizer = LibraryTokenizer(models.BPE(vocab={char: byte for byte, char in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True, normalized=False)])
    return tokenizer


def byte_level_alphabet() -> list[str]:
    """The character the ByteLevel pre-tokenizer writes for each byte 0..255, in byte order.

    This is GPT-2's table: a byte whose Latin-1 character is printable (and not the space)
    stands for itself; the other 68 bytes take the characters U+0100, U+0101, ... in byte
    order. Checked against the library's own alphabet, so a mismatch fails here rather than
    in a silently wrong tokenizer.
    """
    stands_for_itself = [chr(b).isprintable() and b != SPACE for b in range(BYTE_VOCAB)]
    stand_ins = iter(range(BYTE_VOCAB, 2 * BYTE_VOCAB))
    alphabet = [chr(b) if itself else chr(next(stand_ins)) for b, itself in enumerate(stands_for_itself)]
    if set(alphabet) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("this tokenizers version uses another byte-level alphabet; the byte export needs updating")
    return alphabet


def _trained_library_tokenizer(
    settings: Mapping[str, Any], data_settings: Mapping[str, Any], tokenizer: Tokenizer
) -> LibraryTokenizer:
    """The `tokenizer.json` behind a `bpe` or `file` tokenizer, recognised by its fingerprint.

    `bpe` tokenizers are cached under a key private to `data.tokenizers`, so the cached files
    are compared by content: the one that gives the run tokenizer's fingerprint is it.
    """
    kind = settings["kind"]
    if kind == "file":
        candidates = [Path(settings["path"]).expanduser()]
    else:
        candidates = sorted((Path(data_settings["cache_dir"]) / "tokenizers").glob("bpe-*/tokenizer.json"))
    for path in candidates:
        library_tokenizer = LibraryTokenizer.from_file(str(path))
        if JsonTokenizer(library_tokenizer, tokenizer.eos_id).fingerprint == tokenizer.fingerprint:
            return library_tokenizer
    raise DataError(
        f"none of {[str(path) for path in candidates]} is the run's {kind} tokenizer (fingerprint "
        f"{tokenizer.fingerprint}); it changed since training: restore the tokenizer file the run used"
    )


def _write_transformers_configs(out_dir: Path, eos_token: str, split_special_tokens: bool) -> None:
    """`tokenizer_config.json` and `special_tokens_map.json` for a bare `tokenizer.json`.

    No BOS/EOS is added when encoding and decoding leaves spaces as they are, as in
    training. `split_special_tokens` makes the literal text of the EOS token encode as
    ordinary text: the `byte` tokenizer does that, `tokenizers` models (bpe, file) do not.
    """
    special = {"bos_token": eos_token, "eos_token": eos_token, "pad_token": eos_token}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": split_special_tokens,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _save_transformers_tokenizer(name: str, tokenizer: Tokenizer, out_dir: Path) -> TokenizerIds:
    """The `hf` tokenizer's own files, with the run's EOS (which the settings may choose) as
    its eos and pad token."""
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(name)
    eos_token = hf_tokenizer.convert_ids_to_tokens(tokenizer.eos_id)
    bos_id = hf_tokenizer.bos_token_id if hf_tokenizer.bos_token_id is not None else tokenizer.eos_id
    hf_tokenizer.eos_token = eos_token
    hf_tokenizer.pad_token = hf_tokenizer.pad_token or eos_token
    hf_tokenizer.save_pretrained(str(out_dir))
    return TokenizerIds(tokenizer.vocab_size, tokenizer.eos_id, bos_id=bos_id, pad_id=hf_tokenizer.pad_token_id)
