"""The tokens' content digest: what fault-tolerant DiLoCo groups at two sites compare instead of
where their corpus copies sit."""

import os
import shutil
from pathlib import Path

import numpy as np

from data.content_digest import SUBDIR, digest_tokens
from launch.from_config import shared_settings
from tests.run_helpers import compose_config
from tests.test_data import datamodule, ready

TEXT = "".join(f"Paragraph {i} of a small corpus, with some words in it.\n\n" for i in range(200))


def test_the_digest_is_of_the_ids_whatever_their_width_and_tells_splits_apart() -> None:
    ids = np.arange(1000) % 300
    narrow, wide = (
        [[ids.astype(np.uint16)], [ids[:10].astype(np.uint16)]],
        [[ids.astype(np.uint32)], [ids[:10].astype(np.uint32)]],
    )
    assert digest_tokens(narrow) == digest_tokens(wide)
    changed = ids.copy()
    changed[500] += 1
    assert digest_tokens([[changed], [ids[:10]]]) != digest_tokens(narrow)
    assert digest_tokens([[ids, ids[:10]], []]) != digest_tokens(narrow)  # the same ids, the validation split moved


def test_byte_identical_copies_at_other_paths_and_times_have_one_content_digest(tmp_path) -> None:
    copies = [tmp_path / "a" / "corpus.txt", tmp_path / "b" / "other_name.txt"]
    copies[0].parent.mkdir()
    copies[0].write_text(TEXT)
    copies[1].parent.mkdir()
    shutil.copyfile(copies[0], copies[1])
    os.utime(copies[1], (1_600_000_000, 1_600_000_000))
    modules = [ready(datamodule(tmp_path, {"kind": "files", "paths": [str(copy)]})) for copy in copies]
    assert modules[0].fingerprint != modules[1].fingerprint  # the cache key: paths and times
    assert modules[0].content_fingerprint == modules[1].content_fingerprint
    assert len(list((tmp_path / "cache" / SUBDIR).iterdir())) == 2  # one kept per cache
    copies[1].write_text(TEXT.replace("small", "large"))
    edited = ready(datamodule(tmp_path, {"kind": "files", "paths": [str(copies[1])]}))
    assert edited.content_fingerprint != modules[0].content_fingerprint


def test_where_the_data_sit_is_not_among_the_settings_groups_compare(tmp_path: Path) -> None:
    cfg = compose_config(
        ["data=local_files", "data.source.paths=[/site_a/corpus.txt]", "data.tokenizer.path=/site_a/tok.json"], tmp_path
    )
    keys = dict(shared_settings(cfg))
    assert "data.source.paths" not in keys and "data.tokenizer.path" not in keys
    assert "data.source.kind" in keys and "data.seq_len" in keys
