"""Downstream evaluation: the lm-eval adapter against lm-eval's own Hugging Face model, the
adapter under FSDP2 against one process, the offline corpus_cloze task against the token
cache's held-out text, and scripts/evaluate.py end to end on a trained checkpoint."""

from __future__ import annotations

import json
import random
import string
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lm_eval.api.instance import Instance

from common.errors import DataError
from data.datamodule import TextDataModule
from data.token_cache import open_token_cache
from data.tokenizer_export import save_hf_tokenizer
from data.tokenizers import ByteTokenizer
from evaluation.corpus_cloze import TASK_NAME, build_corpus_cloze_task
from evaluation.harness import evaluate
from evaluation.lm_adapter import LlamaLM
from lightning_modules.hf_interop import save_hf_pretrained
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from tests.run_helpers import REPO, TINY, run_script, run_to_completion

EOS, MAX_LENGTH = 256, 48
PAIRS = [
    ("héllo wörld, ", "naïve café"),  # trailing space moves to the continuation
    ("", "an empty context"),
    ("日本語のテキスト", "です。"),
    ("The cat sat on the", " mat 🐈"),
    ("a long context, " * 5, "cut from the left"),  # longer than the window
]
TEXTS = ["short", "Rolling windows — ünïcödé " * 6, "z" * (3 * MAX_LENGTH + 5)]
GENERATIONS = [
    ("Once upon a time", {"until": ["\n", "."], "max_gen_toks": 12}),
    ("Hi", {"until": ["e"], "max_gen_toks": 6}),
]


def tiny_model() -> Llama:
    torch.manual_seed(0)
    config = LlamaSettings(vocab_size=320, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)
    return Llama(config).eval()


def instances(kind: str, arguments: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, args, index) for index, args in enumerate(arguments)]


def byte_data_settings(cache_dir: Path, **source) -> dict:
    """A checkpoint's data settings, for the embedded corpus and the byte tokenizer."""
    return {
        "source": {"kind": "embedded", "max_documents": 300, "max_tokens": None, **source},
        "tokenizer": {"kind": "byte"},
        "seq_len": MAX_LENGTH,
        "micro_batch_size": 2,
        "val_fraction": 0.1,
        "val_max_rows": None,
        "shuffle": True,
        "seed": 0,
        "cache_dir": str(cache_dir),
    }


def greedy_pairs(model: Llama, contexts: list[str]) -> list[tuple[str, str]]:
    """(context, next character) pairs the model predicts greedily (over all its rows), where
    that character is printable ASCII: requests whose is_greedy flag must be True."""
    pairs = []
    for context in contexts:
        with torch.no_grad():
            token = int(model(torch.tensor([list(context.encode())]))[0, -1].argmax())
        if 32 <= token < 127:
            pairs.append((context, chr(token)))
    return pairs


def test_adapter_matches_lm_eval_hflm_on_the_hugging_face_export(tmp_path):
    """Two independent paths to the same numbers.

    HFLM is lm-eval's own model class: it reads the exported folder with transformers'
    LlamaForCausalLM and AutoTokenizer, tokenizes, batches, truncates and windows with its
    own code. The adapter runs this project's Llama and byte tokenizer. They can be compared
    because the export holds the same function (our logits equal LlamaForCausalLM's for the
    same weights, tests/test_hf_interop.py), the exported tokenizer gives the byte
    tokenizer's ids and adds no BOS (tests/test_export_hf.py), and both use the
    end-of-document token as the prefix of an empty context (HFLM's prefix is the
    tokenizer's BOS, which the export sets to it) and the same window (max_length).
    """
    from lm_eval.models.huggingface import HFLM

    model = tiny_model()
    ids = save_hf_tokenizer(byte_data_settings(tmp_path / "cache"), tmp_path / "hf")
    save_hf_pretrained(model, tmp_path / "hf", MAX_LENGTH, ids)
    hflm = HFLM(
        pretrained=str(tmp_path / "hf"),
        tokenizer=str(tmp_path / "hf"),
        device="cpu",
        dtype="float32",
        max_length=MAX_LENGTH,
        batch_size=3,
    )
    adapter = LlamaLM(model, ByteTokenizer(), max_length=MAX_LENGTH, batch_size=4)

    rng = random.Random(0)
    contexts = ["".join(rng.choices(string.ascii_letters + " ", k=rng.randrange(3, 30))) for _ in range(40)]
    pairs = PAIRS + greedy_pairs(model, contexts)
    assert len(pairs) > len(PAIRS), "no greedy request found: the is_greedy comparison would be vacuous"
    requests = instances("loglikelihood", pairs)
    ours, theirs = adapter.loglikelihood(requests), hflm.loglikelihood(requests)
    assert [greedy for _, greedy in ours] == [greedy for _, greedy in theirs]
    assert any(greedy for _, greedy in ours) and not all(greedy for _, greedy in ours)
    ll_diff = max(abs(a - b) for (a, _), (b, _) in zip(ours, theirs))

    rolling = [(text,) for text in TEXTS]
    ours_rolling = adapter.loglikelihood_rolling(instances("loglikelihood_rolling", rolling))
    theirs_rolling = hflm.loglikelihood_rolling(instances("loglikelihood_rolling", rolling))
    rolling_diff = max(abs(a - b) for a, b in zip(ours_rolling, theirs_rolling))
    print(f"adapter vs HFLM: max |diff| loglikelihood {ll_diff:.2e}, rolling {rolling_diff:.2e}")
    assert ll_diff < 1e-4 and rolling_diff < 1e-4

    generations = instances("generate_until", GENERATIONS)
    assert adapter.generate_until(generations) == hflm.generate_until(generations)


def test_generation_masks_the_padded_vocabulary_rows(tmp_path):
    """Padded rows 300 / 301 win every raw argmax; the adapter's greedy text equals HFLM's
    on the export, whose generation config suppresses those rows."""
    from lm_eval.models.huggingface import HFLM

    model = tiny_model()
    with torch.no_grad():
        model.output.weight[300], model.output.weight[301] = 100.0, -100.0  # ±100 * sum(h): one is huge
        assert model(torch.tensor([list(b"Once upon a time")]))[0, -1].argmax() >= 257
    ids = save_hf_tokenizer(byte_data_settings(tmp_path / "cache"), tmp_path / "hf")
    save_hf_pretrained(model, tmp_path / "hf", MAX_LENGTH, ids)
    hflm = HFLM(pretrained=str(tmp_path / "hf"), device="cpu", dtype="float32", max_length=MAX_LENGTH, batch_size=2)
    generations = instances("generate_until", GENERATIONS)
    ours = LlamaLM(model, ByteTokenizer(), max_length=MAX_LENGTH).generate_until(generations)
    assert ours == hflm.generate_until(generations)
    assert all(ours), "every prompt generated some text"


def _sharded_rank(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank: the same seeded model, sharded with FSDP2 over a 1-D mesh of all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        model = tiny_model()
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in model.layers.values():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert isinstance(model.tok_embeddings.weight, DTensor)  # each rank holds half of every weight
        torch.save(
            adapter_results(LlamaLM(model, ByteTokenizer(), max_length=MAX_LENGTH, batch_size=3)),
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def adapter_results(lm: LlamaLM) -> dict:
    return {
        "loglikelihood": lm.loglikelihood(instances("loglikelihood", PAIRS)),
        "rolling": lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(text,) for text in TEXTS])),
        "generated": lm.generate_until(instances("generate_until", GENERATIONS)),
    }


def test_adapter_on_two_fsdp2_ranks_matches_one_process(tmp_path):
    """Every rank gets the same requests and the same results as a single process."""
    expected = adapter_results(LlamaLM(tiny_model(), ByteTokenizer(), max_length=MAX_LENGTH, batch_size=3))
    mp.spawn(_sharded_rank, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert got["generated"] == expected["generated"]
        assert [greedy for _, greedy in got["loglikelihood"]] == [greedy for _, greedy in expected["loglikelihood"]]
        got_ll, expected_ll = [ll for ll, _ in got["loglikelihood"]], [ll for ll, _ in expected["loglikelihood"]]
        np.testing.assert_allclose(got_ll, expected_ll, atol=1e-5)
        np.testing.assert_allclose(got["rolling"], expected["rolling"], atol=1e-5)


# -- corpus_cloze ------------------------------------------------------------------------

CLOZE_SOURCE = {"max_documents": 4000}  # 400 held-out documents at val_fraction 0.1
CLOZE_K = 200


def read_items(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{TASK_NAME}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cloze(tmp_path_factory) -> tuple[dict, Path]:
    """The data settings and the task folder of a K=200, seed-0 corpus_cloze task."""
    settings = byte_data_settings(tmp_path_factory.mktemp("cloze_cache"), **CLOZE_SOURCE)
    return settings, build_corpus_cloze_task(settings, k=CLOZE_K, seed=0).include_path


def test_corpus_cloze_items_depend_on_the_seed_only(cloze, tmp_path):
    settings, folder = cloze
    items = read_items(folder)
    assert len(items) == CLOZE_K
    again = build_corpus_cloze_task(settings, cache_dir=tmp_path / "fresh", k=CLOZE_K, seed=0).include_path
    assert again != folder and read_items(again) == items  # rebuilt from the corpus, not read from the cache
    other_seed = build_corpus_cloze_task(settings, cache_dir=tmp_path / "fresh", k=CLOZE_K, seed=1).include_path
    other_seed = read_items(other_seed)
    assert other_seed != items and {item["context"] for item in other_seed} != {item["context"] for item in items}


def test_corpus_cloze_choices_are_cut_from_held_out_documents(cloze):
    """The held-out documents are read back from the token cache's validation file (written
    by the data module), independently of how the task read the corpus."""
    settings, folder = cloze
    data = TextDataModule(**settings)
    data.prepare_data()
    val = open_token_cache(Path(settings["cache_dir"]) / data.fingerprint).val[:]
    ends = np.flatnonzero(val == EOS)
    documents = [ByteTokenizer().decode(val[start:end]) for start, end in zip(np.r_[0, ends[:-1] + 1], ends)]
    for item in read_items(folder):
        truth = item["choices"][item["target"]]
        assert item["context"] + truth in documents[item["documents"][item["target"]]]  # really follows it
        assert len(set(item["documents"])) == 4  # the distractors come from three other documents
        for choice, document in zip(item["choices"], item["documents"]):
            assert choice.startswith(" ") and choice.strip() and choice in documents[document]


def test_untrained_model_scores_chance_on_corpus_cloze(cloze):
    settings, folder = cloze
    lm = LlamaLM(tiny_model(), ByteTokenizer(), max_length=256, batch_size=32)
    metrics = evaluate(lm, [build_corpus_cloze_task(settings, k=CLOZE_K, seed=0)])[TASK_NAME]
    print(f"untrained tiny model on corpus_cloze (K={CLOZE_K}): {metrics}")
    assert 0.15 <= metrics["acc"] <= 0.35 and 0.15 <= metrics["acc_norm"] <= 0.35


def test_corpus_cloze_needs_four_held_out_documents(tmp_path):
    with pytest.raises(DataError, match="raise data.val_fraction"):
        build_corpus_cloze_task(byte_data_settings(tmp_path, max_documents=30), k=5)


# -- scripts/evaluate.py -----------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of a 2-step TINY run; val_fraction 0.05 holds out 30 of its 600 documents."""
    run_dir = tmp_path_factory.mktemp("run")
    overrides = TINY + ["logger=none", "trainer.max_steps=2", "data.val_fraction=0.05"]
    run_to_completion(overrides, run_dir, tmp_path_factory.mktemp("cache"))
    return run_dir / "checkpoints" / "last.ckpt"


def evaluate_script(*args: str) -> subprocess.CompletedProcess:
    return run_script(REPO / "scripts" / "evaluate.py", list(args))


def test_evaluate_script_on_a_trained_checkpoint(trained_checkpoint, tmp_path):
    out = tmp_path / "results.json"
    result = evaluate_script(str(trained_checkpoint), "--tasks", TASK_NAME, "--limit", "20", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)
    table = [line.split() for line in result.stdout.splitlines()]
    assert ["task", "metric", "value", "stderr"] in table
    assert {row[1] for row in table if row[0] == TASK_NAME} == {"acc", "acc_norm"}
    report = json.loads(out.read_text())
    assert report["checkpoint"] == str(trained_checkpoint) and report["step"] == 2 and report["tokens"] == 512
    assert report["results"][TASK_NAME]["sample_len"] == 20
    assert 0 <= report["results"][TASK_NAME]["acc,none"] <= 1


def test_evaluate_script_reports_user_mistakes_in_one_line(trained_checkpoint, tmp_path):
    old = torch.load(trained_checkpoint, weights_only=False)
    del old["datamodule_hyper_parameters"]
    torch.save(old, tmp_path / "old.ckpt")
    typo = "unknown task 'helaswag' in --tasks; did you mean hellaswag,"
    cases = [
        ([str(tmp_path / "missing.ckpt"), "--tasks", TASK_NAME], "Checkpoint not found"),
        ([str(trained_checkpoint), "--tasks", "helaswag"], typo),
        ([str(tmp_path / "old.ckpt"), "--tasks", TASK_NAME], "holds no data settings"),
    ]
    for args, message in cases:
        result = evaluate_script(*args)
        assert result.returncode == 2, result.stderr[-3000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]
