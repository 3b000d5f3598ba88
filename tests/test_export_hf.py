"""The Hugging Face export is usable as it is: transformers' tokenizer gives the run
tokenizer's ids for every tokenizer kind, and `generate()` stops at the end-of-document
token and never emits a padded vocabulary row.

Each check compares independent paths: the run's tokenizer (`data.tokenizers`) against
`AutoTokenizer` on the exported files, and what a trained model learnt (to end its
document) against what `generate()` does with the exported configs.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from data.datamodule import TextDataModule
from data.tokenizer_export import save_hf_tokenizer
from data.tokenizers import ByteTokenizer
from lightning_modules.hf_interop import save_hf_pretrained
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from tests.run_helpers import REPO, run_script

transformers = pytest.importorskip("transformers")

EOS, TOKENIZER_VOCAB, MODEL_ROWS = 256, 257, 320
DOCUMENT = "the quick brown fox jumps over the lazy dog."
TEXTS = [
    "plain ASCII, with punctuation: (a) [b] {c}!",
    "multi-byte: héllo wörld, naïve café, 日本語のテキスト, emoji 🙂🚀",
    "  leading spaces, double  spaces,\ttabs,\nnew lines\r\n and trailing spaces  ",
    "the literal text <|endoftext|> of the end-of-document token",
]


def tiny_config() -> LlamaSettings:
    return LlamaSettings(vocab_size=MODEL_ROWS, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)


def data_settings(cache_dir: Path, **tokenizer) -> dict:
    """What a checkpoint's ``datamodule_hyper_parameters`` holds, for a small embedded corpus."""
    return {
        "source": {"kind": "embedded", "max_documents": 300, "max_tokens": None},
        "tokenizer": tokenizer or {"kind": "byte"},
        "seq_len": 64,
        "micro_batch_size": 2,
        "val_fraction": 0.05,
        "val_max_rows": None,
        "shuffle": True,
        "seed": 0,
        "cache_dir": str(cache_dir),
    }


def test_byte_tokenizer_export_gives_the_bytes_as_ids(tmp_path):
    ids = save_hf_tokenizer(data_settings(tmp_path / "cache"), tmp_path / "hf")
    assert (ids.vocab_size, ids.eos_id, ids.bos_id, ids.pad_id) == (TOKENIZER_VOCAB, EOS, EOS, EOS)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert len(exported) == TOKENIZER_VOCAB and exported.eos_token_id == EOS and exported.pad_token_id == EOS
    for text in TEXTS:
        encoded = exported(text)["input_ids"]  # default settings: no BOS may be added
        assert encoded == list(text.encode("utf-8")), text
        assert exported.decode(encoded) == text
        assert exported.decode(encoded + [EOS], skip_special_tokens=True) == text
    rng = random.Random(0)  # arbitrary bytes, invalid UTF-8 included, decode alike
    for ids_ in [list(range(256))] + [[rng.randrange(256) for _ in range(24)] for _ in range(50)]:
        assert exported.decode(ids_) == ByteTokenizer().decode(ids_)


@pytest.fixture(scope="module")
def trained_bpe(tmp_path_factory) -> tuple[dict, Path]:
    """A small BPE trained on the corpus by the data module, and its cached tokenizer.json."""
    cache = tmp_path_factory.mktemp("bpe_cache")
    settings = data_settings(cache, kind="bpe", vocab_size=400, max_train_documents=200)
    _ = TextDataModule(**settings).tokenizer  # trains it into the cache
    return settings, next((cache / "tokenizers").glob("bpe-*/tokenizer.json"))


@pytest.mark.parametrize("kind", ["bpe", "file", "hf"])
def test_exported_tokenizer_encodes_as_the_run_tokenizer(kind, trained_bpe, tmp_path):
    """bpe: the run's trained BPE; file: a tokenizer.json; hf: a local transformers tokenizer folder."""
    bpe_settings, bpe_file = trained_bpe
    save_hf_tokenizer(data_settings(tmp_path / "cache"), tmp_path / "byte")
    settings = {
        "bpe": bpe_settings,
        "file": data_settings(tmp_path / "cache", kind="file", path=str(bpe_file), eos_token="<|endoftext|>"),
        "hf": data_settings(tmp_path / "cache", kind="hf", name=str(tmp_path / "byte"), eos_token=None),
    }[kind]
    run_tokenizer = TextDataModule(**settings).tokenizer
    ids = save_hf_tokenizer(settings, tmp_path / "hf")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert ids.vocab_size == run_tokenizer.vocab_size == len(exported)
    assert ids.eos_id == run_tokenizer.eos_id == exported.eos_token_id
    for text in TEXTS[:3]:
        encoded = exported(text, add_special_tokens=False)["input_ids"]
        assert encoded == run_tokenizer.encode(text).tolist(), text
        assert exported.decode(encoded) == run_tokenizer.decode(encoded) == text


def trained_to_end_its_document() -> Llama:
    """A tiny model that learnt one short document followed by the end-of-document token."""
    torch.manual_seed(0)
    model = Llama(tiny_config())
    stream = torch.tensor((list(DOCUMENT.encode()) + [EOS]) * 40)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(250):
        starts = torch.randint(0, len(stream) - 49, (16,))
        rows = torch.stack([stream[start : start + 49] for start in starts])
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def lightning_checkpoint(model: Llama, cache_dir: Path) -> dict:
    """The entries of a checkpoint of this project that the export reads."""
    return {
        "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
        "hyper_parameters": {"model": dataclasses.asdict(model.config)},
        "datamodule_hyper_parameters": data_settings(cache_dir),
    }


def test_exported_model_generates_text_and_stops_at_the_end_of_document(tmp_path):
    model = trained_to_end_its_document()
    torch.save(lightning_checkpoint(model, tmp_path / "cache"), tmp_path / "last.ckpt")
    result = run_script(REPO / "scripts" / "export_hf.py", [str(tmp_path / "last.ckpt"), str(tmp_path / "hf")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == EOS

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt, max_new_tokens = "the quick", 100
    inputs = tokenizer(prompt, return_tensors="pt")
    output = hf.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)[0]
    new_ids = output[inputs["input_ids"].shape[1] :].tolist()

    assert new_ids[-1] == EOS and len(new_ids) < max_new_tokens, new_ids  # stopped at the end of the document
    assert max(output.tolist()) < TOKENIZER_VOCAB
    text = tokenizer.decode(output, skip_special_tokens=True)
    assert text == ByteTokenizer().decode(output.tolist()) == DOCUMENT


def test_generation_never_emits_a_padded_vocabulary_row(tmp_path):
    """A model whose padded rows 300 / 301 win every argmax: the raw logits pick them, the
    exported generation config (``suppress_tokens``) keeps them out."""
    torch.manual_seed(0)
    model = Llama(tiny_config()).eval()
    with torch.no_grad():
        model.output.weight[300], model.output.weight[301] = 100.0, -100.0  # ±100 * sum(h): one is huge
    ids = save_hf_tokenizer(data_settings(tmp_path / "cache"), tmp_path / "hf")
    save_hf_pretrained(model, tmp_path / "hf", tokenizer_ids=ids)
    generation_config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation_config["suppress_tokens"] == list(range(TOKENIZER_VOCAB, MODEL_ROWS))

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt = torch.tensor([list(b"Once upon a time")])
    with torch.no_grad():
        assert hf(prompt).logits[0, -1].argmax() >= TOKENIZER_VOCAB  # what unmasked greedy decoding would pick
    output = hf.generate(prompt, max_new_tokens=20, do_sample=False)[0, prompt.shape[1] :]
    assert len(output) > 0 and max(output.tolist()) < TOKENIZER_VOCAB, output
