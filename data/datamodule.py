"""The LightningDataModule: load, tokenize (once, cached), pack, shard by rank, resume.

Data flows source -> tokenizer -> token cache (sharded flat files) -> packed rows (a view)
-> per-rank micro-batches. The training state is one number, `rows_consumed`: the
position in the global row order that every rank has reached (under the training module,
the clock's sequence count), plus, for a weighted mixture of sources, the history of its
weights. It is checkpointed through `state_dict`, so a resumed run reads exactly the rows
it would have read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from common.data_groups import DataGroups
from common.errors import CheckpointError, ConfigError, DataError
from data.batches import ChainedBatches, TrainBatches, ValidationBatches
from data.config_checks import as_plain_dict, check_seq_len
from data.content_digest import cached_digest
from data.fingerprint import digest_json
from data.mixture import MixtureOrder, mixture_entries
from data.packing import PackedRows
from data.sampler import ResumableRankSampler, check_position
from data.sources import DocumentSource, build_source
from data.split import ValidationSplit
from data.token_cache import HF_DATASETS_SUBDIR, build_token_cache, cache_fingerprint, open_token_cache
from data.token_files import TokenFiles
from data.tokenizers import Tokenizer, build_tokenizer, check_tokenizer_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourcePart:
    """One source of the training data: the only one (name None) or a named share of a mixture."""

    name: str | None
    weight: float
    source: DocumentSource | TokenFiles


class TextDataModule(L.LightningDataModule):
    """Packed next-token-prediction batches `{"input_ids", "labels"}` (int64, [b, seq_len]).

    The constructor only checks settings (cheap, nothing is read). The tokenizer is
    built on first use of `tokenizer` / `vocab_size` / `eos_id` (a `bpe` tokenizer is
    trained then), `prepare_data()` tokenizes the corpus into the cache and `setup()`
    memory-maps it. The data-parallel rank and size come from the attached trainer.

    Every call of `next()` on the train loader is one micro-batch on this rank, and all
    ranks must draw the same number of them: then `rows_consumed` (a multiple of
    micro_batch_size * dp_size) is exactly the rows trained on, whatever the number of
    micro-batches per optimizer step.
    """

    def __init__(
        self,
        *,
        source: Mapping[str, Any] | None,
        tokenizer: Mapping[str, Any],
        seq_len: int,
        micro_batch_size: int,
        val_fraction: float,
        val_max_rows: int | None,
        shuffle: bool,
        seed: int,
        cache_dir: str,
        mixture: Mapping[str, Any] | None = None,
        data_groups: DataGroups | Mapping[str, int] = DataGroups(),
    ) -> None:
        super().__init__()
        # Saved into checkpoints (``datamodule_hyper_parameters``), so tools that read a
        # checkpoint alone (evaluation, export) can rebuild its tokenizer and corpus.
        self.save_hyperparameters(ignore=["data_groups"])
        # Hydra's instantiate hands a dataclass argument over as a mapping.
        self.data_groups = data_groups if isinstance(data_groups, DataGroups) else DataGroups(**data_groups)
        _check_settings(seq_len, micro_batch_size, val_fraction, val_max_rows, shuffle, seed)
        self.parts = _source_parts(source, mixture)
        self.tokenizer_config = check_tokenizer_config(as_plain_dict(tokenizer, "data.tokenizer"))
        if self.tokenizer_config["kind"] == "bpe" and any(isinstance(part.source, TokenFiles) for part in self.parts):
            raise ConfigError(
                "data.tokenizer.kind=bpe learns from text, and data.source.kind=tokens has none: declare the "
                "tokenizer the files were written with (data.tokenizer.kind=byte, file or hf)"
            )
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.val_fraction = val_fraction
        self.val_max_rows = val_max_rows
        self.shuffle = shuffle
        self.seed = seed
        self.cache_dir = Path(cache_dir)
        self._split = ValidationSplit(val_fraction)
        self._tokenizer: Tokenizer | None = None
        self._train_rows: PackedRows | None = None
        self._val_rows: list[PackedRows] | None = None  # one per source
        self._source_rows: list[int] = []  # training rows of each source, laid end to end
        self._sampler: ResumableRankSampler | None = None
        self._start_position = 0
        self._weight_history: list[tuple[int, list[float]]] = [(0, [part.weight for part in self.parts])]
        self._order: MixtureOrder | None = None

    # -- tokenizer ---------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer, built on first access (which trains a `bpe` tokenizer, once per corpus)."""
        if self._tokenizer is None:
            corpus = {**self._descriptions(), "val_fraction": str(self.val_fraction)}
            self._tokenizer = build_tokenizer(
                self.tokenizer_config,
                self.cache_dir / "tokenizers",
                corpus_iter_factory=self._training_documents,
                corpus_fingerprint=digest_json(corpus),
            )
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def fingerprint(self) -> str:
        """Identifies the tokens (corpus, tokenizer, val_fraction), not the packing nor a mixture's weights."""
        prints = {part.name: cache_fingerprint(part.source, self.tokenizer, self.val_fraction) for part in self.parts}
        return prints[None] if None in prints else digest_json(prints)

    @property
    def content_fingerprint(self) -> str:
        """A digest of the tokens themselves, every source's training and validation splits
        (``data/content_digest.py``): the same for byte-identical copies of a corpus at other
        paths or times, which ``fingerprint`` tells apart. Needs ``setup()``; computed once per
        cache and kept in the cache folder."""
        prints = {}
        for part in self.parts:
            key = cache_fingerprint(part.source, self.tokenizer, self.val_fraction)
            prints[part.name or ""] = cached_digest(self.cache_dir, key, self._splits(part.source))
        return prints[""] if "" in prints else digest_json(prints)

    @property
    def source_names(self) -> list[str]:
        """The names of a mixture's sources, in their configured order; empty for a single source."""
        return [part.name for part in self.parts if part.name is not None]

    def rows_per_source(self, position: int) -> list[int]:
        """Training rows read from each mixture source by global positions [0, position)."""
        return self._mixture_order().rows_per_source(position)

    # -- data parallelism ----------------------------------------------------------------

    @property
    def job_rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @property
    def job_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    @property
    def dp_rank(self) -> int:
        """This rank's slice of the training stream, among every data group's ranks."""
        return self.data_groups.data_parallel_rank(self.job_rank, self.job_size)

    @property
    def dp_size(self) -> int:
        return self.data_groups.data_parallel_size(self.job_size)

    # -- Lightning hooks -----------------------------------------------------------------

    def prepare_data(self) -> None:
        """Tokenize each text source into the cache unless a complete cache exists (local rank 0
        only); token files are checked against the tokenizer instead (once per file version)."""
        for part in self.parts:
            if isinstance(part.source, TokenFiles):
                part.source.check(self.tokenizer, self.cache_dir)
            else:
                build_token_cache(part.source, self.tokenizer, self.cache_dir, self.val_fraction)

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the tokens and check that they hold enough rows for this packing and rank count.

        The training rows of all sources are laid end to end (each packed on its own); the
        validation rows stay per source, so that each source's loss can be logged.
        """
        train_segments, self._val_rows, self._source_rows = [], [], []
        for part in self.parts:
            train, val = self._splits(part.source)
            self._source_rows.append(PackedRows(train, self.seq_len).num_rows)
            train_segments += train
            self._val_rows.append(PackedRows(val, self.seq_len))
        self._train_rows = PackedRows(train_segments, self.seq_len)
        self._order = None
        self._check_row_counts()

    def prepare(self, world_size: int) -> None:
        """Tokenize unless cached, then check the rows suffice for the data-parallel ranks of
        ``world_size`` processes: what ``prepare_data`` and ``setup`` do, callable before the
        Trainer (and any logger) exists."""
        self.prepare_data()
        self.setup()
        self._check_row_counts(self.data_groups.job_data_parallel_size(world_size))

    def train_dataloader(self) -> DataLoader:
        """Endless micro-batches for this rank, from the current (possibly restored) position.

        `num_workers=0` on purpose: a batch is a few memmap slices (microseconds), and
        without worker prefetch the sampler's position is exactly what training consumed,
        which keeps `state_dict` and resume exact.
        """
        self._check_row_counts()
        self._sampler = ResumableRankSampler(
            num_rows=self._rows("train").num_rows,
            micro_batch_size=self.micro_batch_size,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            seed=self.seed,
            shuffle=self.shuffle,
            position=self.rows_consumed,
            order=self._mixture_order() if self.source_names else None,
        )
        return DataLoader(TrainBatches(self._rows("train"), self._sampler), batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        """The same validation rows every time, at full seq_len, split evenly over this job's
        data-parallel ranks (the ranks that hold one model together read the same rows); a
        mixture's batches come source after source, each tagged with its source's name."""
        rank = self.job_rank // self.data_groups.model_parallel
        ranks = self.data_groups.job_data_parallel_size(self.job_size)
        batches = [
            ValidationBatches(rows, self.micro_batch_size, rank, ranks, self.val_max_rows, part.name)
            for part, rows in zip(self.parts, self._val_parts())
        ]
        return DataLoader(ChainedBatches(batches), batch_size=None, num_workers=0)

    # -- resume ------------------------------------------------------------------------

    @property
    def rows_consumed(self) -> int:
        """Global rows consumed by all ranks together: the position in the global order.

        Under a training module with a training state (`LlamaLightningModule`), the position
        is its clock's sequence count: rows consumed by *completed* optimizer steps. A
        checkpoint taken in the middle of gradient accumulation (preemption, an epoch end)
        then resumes exactly: the partial step's micro-batches are read again. Without
        one, it is the sampler's position.
        """
        state = getattr(self.trainer.lightning_module, "training_state", None) if self.trainer is not None else None
        if state is not None:
            return state.clock.sequences
        return self._sampler.position if self._sampler is not None else self._start_position

    def seek(self, position: int) -> None:
        """Continue the training stream at a global position: the clock's, when it moved before
        the first batch (a replica group that rejoined its peers at their step)."""
        check_position(position, self.micro_batch_size, self.dp_size)
        self._start_position = position
        if self._sampler is not None:
            self._sampler.position = position

    def state_dict(self) -> dict[str, Any]:
        state = {
            "rows_consumed": self.rows_consumed,
            "fingerprint": self.fingerprint,
            "seq_len": self.seq_len,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }
        if self.source_names:
            state["mixture"] = {"names": self.source_names, "weight_history": self._weight_history}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the position; takes effect at the next `train_dataloader()` (Lightning calls that later)."""
        if state_dict["fingerprint"] != self.fingerprint:
            raise CheckpointError(
                f"the checkpoint was trained on token cache {state_dict['fingerprint']} but the current data "
                f"settings give {self.fingerprint}: data.source, data.tokenizer or data.val_fraction differ. "
                "Resume with the data settings of the checkpoint."
            )
        for key in ("seq_len", "shuffle", "seed"):
            saved, current = state_dict[key], getattr(self, key)
            if saved != current:
                raise CheckpointError(
                    f"the checkpoint read rows with data.{key}={saved!r} but data.{key}={current!r} now, "
                    f"which changes the row order; resume with data.{key}={saved!r}"
                )
        check_position(state_dict["rows_consumed"], self.micro_batch_size, self.dp_size)
        self._start_position = state_dict["rows_consumed"]
        if self.source_names:
            self._restore_weights(state_dict["mixture"]["weight_history"], self._start_position)
        self._sampler = None

    def _restore_weights(self, history: list[tuple[int, list[float]]], position: int) -> None:
        """Keep the weights the checkpoint trained with; new ones apply from `position` on, said in one line."""
        current = self._weight_history[-1][1]
        self._weight_history = [(int(start), list(weights)) for start, weights in history]
        saved = self._weight_history[-1][1]
        if any(abs(a - b) > 1e-12 for a, b in zip(saved, current)):
            change = ", ".join(f"{name} {a:.3g} -> {b:.3g}" for name, a, b in zip(self.source_names, saved, current))
            log.info("data.mixture weights changed since the checkpoint (%s); applied from row %d on", change, position)
            self._weight_history = [entry for entry in self._weight_history if entry[0] < position]
            self._weight_history.append((position, list(current)))
        self._order = None

    # -- helpers -------------------------------------------------------------------------

    @property
    def num_val_rows(self) -> int:
        """Rows of the validation split at this packing (all sources)."""
        return sum(rows.num_rows for rows in self._val_parts())

    def _rows(self, split: str) -> PackedRows:
        """The training rows, or the validation rows of the only source."""
        if split == "val":
            (rows,) = self._val_parts()
            return rows
        if self._train_rows is None:
            raise RuntimeError("call prepare_data() and setup() before using the data (Lightning does)")
        return self._train_rows

    def _val_parts(self) -> list[PackedRows]:
        if self._val_rows is None:
            raise RuntimeError("call prepare_data() and setup() before using the data (Lightning does)")
        return self._val_rows

    def _splits(self, source: DocumentSource | TokenFiles) -> tuple[list, list]:
        """A source's training and validation token segments: its cache's two files, or its token files."""
        if isinstance(source, TokenFiles):
            return source.splits(self.val_fraction)
        cache = open_token_cache(self.cache_dir / cache_fingerprint(source, self.tokenizer, self.val_fraction))
        return [cache.train], [cache.val]

    def _mixture_order(self) -> MixtureOrder:
        if self._order is None:
            self._order = MixtureOrder(self._source_rows, self._weight_history, self.seed, self.shuffle)
        return self._order

    def _descriptions(self) -> dict[str, Any]:
        """What the sources read: the tokenizer's corpus key."""
        if self.source_names:
            return {"mixture": {part.name: part.source.description for part in self.parts}}
        return {"source": self.parts[0].source.description}

    def _training_documents(self) -> Iterator[str]:
        """The training-split documents of every source, which a `bpe` tokenizer learns from
        (never validation text).

        The first document is read here, so an empty corpus is reported as such before
        training rather than caching a tokenizer that learnt nothing.
        """
        documents = chain.from_iterable(
            self._split.training_documents(part.source.batches(self.cache_dir / HF_DATASETS_SUBDIR))
            for part in self.parts
        )
        first = next(documents, None)
        if first is None:
            raise self.parts[0].source.no_documents_error()
        return chain([first], documents)

    def _check_row_counts(self, dp_size: int | None = None) -> None:
        dp_size = dp_size or self.dp_size
        row = self.seq_len + 1
        group = self.micro_batch_size * dp_size
        train_rows = self._rows("train").num_rows
        labels = " and ".join(part.source.label for part in self.parts)
        if train_rows < group:
            raise DataError(
                f"the training split has {train_rows} rows of seq_len + 1 = {row} tokens from {labels}, "
                f"fewer than one global micro-batch (micro_batch_size * dp_size = {group} rows): lower data.seq_len "
                "or batch.micro_batch_size, or use more text"
            )
        for part, rows in zip(self.parts, self._val_parts()):
            usable = rows.num_rows if self.val_max_rows is None else min(rows.num_rows, self.val_max_rows)
            if usable < dp_size:
                raise DataError(
                    f"the validation split has {usable} usable rows of {row} tokens from {part.source.label}, "
                    f"fewer than one per data-parallel rank ({dp_size}): raise data.val_fraction "
                    f"(now {self.val_fraction}) or data.val_max_rows, lower data.seq_len, or use more text"
                )
        for part, rows in zip(self.parts, self._source_rows):
            if part.name is not None and rows == 0:
                raise DataError(
                    f"data.mixture.{part.name} has no training row of {row} tokens in {part.source.label}: "
                    "lower data.seq_len, or give it more text"
                )


def _check_settings(
    seq_len: int, micro_batch_size: int, val_fraction: float, val_max_rows: int | None, shuffle: bool, seed: int
) -> None:
    """Reject bad scalar settings before anything is read or tokenized."""
    check_seq_len(seq_len)
    if not _is_int(micro_batch_size) or micro_batch_size < 1:
        raise ConfigError(f"batch.micro_batch_size must be an integer >= 1, got {micro_batch_size!r}")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 0.5:
        raise ConfigError(f"data.val_fraction must be a number in (0, 0.5), got {val_fraction!r}")
    if val_max_rows is not None and (not _is_int(val_max_rows) or val_max_rows < 1):
        raise ConfigError(f"data.val_max_rows must be a positive integer or null, got {val_max_rows!r}")
    if not isinstance(shuffle, bool):
        raise ConfigError(f"data.shuffle must be true or false, got {shuffle!r}")
    if not _is_int(seed):
        raise ConfigError(f"data.seed must be an integer, got {seed!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _source_parts(source: Mapping[str, Any] | None, mixture: Mapping[str, Any] | None) -> list[SourcePart]:
    """The training sources: `data.source`, or the named sources of `data.mixture` (not both)."""
    if (source is None) == (mixture is None):
        raise ConfigError(
            "set exactly one of data.source and data.mixture: data=mixture sets data.source to null and names its "
            "sources under data.mixture"
        )
    if mixture is None:
        return [SourcePart(None, 1.0, build_source(as_plain_dict(source, "data.source")))]
    entries = mixture_entries(as_plain_dict(mixture, "data.mixture"))
    return [
        SourcePart(
            entry.name, entry.weight, build_source(as_plain_dict(entry.source, f"data.mixture.{entry.name}.source"))
        )
        for entry in entries
    ]
