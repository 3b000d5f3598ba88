"""lm-evaluation-harness's model interface (`lm_eval.api.model.LM`) over this project's model.

`LlamaLM` wraps any module mapping input ids [b, T] to logits [b, T, V] (the plain `Llama`,
or one sharded with FSDP2) and a `data.tokenizers.Tokenizer`, on one device. It scores and
generates the way lm-eval's own `HFLM` does for a causal model, so its numbers compare with
published lm-eval results:

- a (context, continuation) pair moves the context's trailing whitespace to the
  continuation, encodes context and context + continuation, and scores the tokens after
  the context's; an empty context is replaced by the end-of-document token, which is what
  every packed training document follows;
- the model sees at most `max_length` tokens (scripts/evaluate.py passes the training
  sequence length): longer inputs are truncated from the left;
- rolling log-likelihoods (perplexity) use lm-eval's disjoint rolling windows.

Scores use the model's whole output distribution, padded vocabulary rows included (as the
training loss and Hugging Face do); only generation masks the padded rows, so it never
emits an id the tokenizer cannot decode. Requests are sorted by length (longest first) to
reduce padding; results come back in the order of the requests.

Data parallelism: every rank calls the adapter with the same requests and gets the same
results. Nothing is split across ranks, so with DDP each rank simply evaluates everything;
with FSDP2 the forward is collective, and every rank runs the same batches in the same
order because the batching depends on the requests only. Greedy tokens are taken from
rank 0, so a near-tie decided differently on two ranks can never make their generation
loops (and so their collective forwards) diverge.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn

from common.errors import ConfigError
from data.tokenizers import Tokenizer

DEFAULT_BATCH_SIZE = 16
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default generation budget

# (context ids, continuation ids): the continuation's tokens are scored given the context.
Pair = tuple[list[int], list[int]]


class LlamaLM(LM):
    """lm-eval's `LM` for this project's model and tokenizer (see the module docstring).

    The model is called under `torch.no_grad()` as it is; put it in eval mode first if it
    has dropout (this project's Llama has none). Generation re-runs the model over the
    whole window for each new token (there is no KV cache), which suits the short answers
    of zero-shot tasks.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        max_length: int,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        if max_length < 1 or batch_size < 1:
            raise ValueError(f"max_length ({max_length}) and batch_size ({batch_size}) must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.max_gen_toks = max_gen_toks
        self._device = torch.device(device) if device is not None else next(model.parameters()).device

    # -- lm-eval's interface ---------------------------------------------------------------

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        """(log p(continuation | context), whether greedy decoding gives the continuation)."""
        windows = [
            (index, window)
            for index, request in enumerate(requests)
            for window in self._continuation_windows(*self._encode_pair(*request.args))
        ]
        return self._totals(len(requests), windows)

    def loglikelihood_rolling(self, requests: list[Instance]) -> list[float]:
        """log p(text) of whole texts, predicted in disjoint windows of at most `max_length` tokens."""
        windows = [
            (index, make_disjoint_window(window))
            for index, request in enumerate(requests)
            for window in get_rolling_token_windows(
                token_list=self._encode(request.args[0]),
                prefix_token=self.tokenizer.eos_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
        ]
        return [logprob for logprob, _ in self._totals(len(requests), windows)]

    def generate_until(self, requests: list[Instance]) -> list[str]:
        """Greedy continuations, cut before the first `until` string or at the end-of-document token."""
        prompts = [self._encode(request.args[0]) or [self.tokenizer.eos_id] for request in requests]
        settings = [self._generation_settings(request.args[1]) for request in requests]
        results = [""] * len(requests)
        for batch in self._batches([len(prompt) for prompt in prompts]):
            texts = self._generate([prompts[i] for i in batch], [settings[i] for i in batch])
            for i, text in zip(batch, texts):
                results[i] = text
        return results

    # -- encoding --------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return [int(token) for token in self.tokenizer.encode(text)]

    def _encode_pair(self, context: str, continuation: str) -> Pair:
        """Token ids of a context and its continuation, split the way lm-eval splits them.

        Trailing whitespace moves to the continuation (a subword tokenizer encodes " word"
        as one token, so the space belongs with the word), and the continuation's ids are
        those of context + continuation after the context's own ids.
        """
        stripped = context.rstrip()
        continuation = context[len(stripped) :] + continuation
        if not stripped:
            return [self.tokenizer.eos_id], self._encode(continuation)
        context_ids = self._encode(stripped)
        return context_ids, self._encode(stripped + continuation)[len(context_ids) :]

    def _continuation_windows(self, context: list[int], continuation: list[int]) -> list[Pair]:
        """The continuation in pieces of at most `max_length` tokens, each after everything before it.

        A continuation that fits the window is one piece, scored as lm-eval's HFLM scores it;
        a longer one (which HFLM rejects) is scored piece by piece with the longest context
        the window allows, as in a rolling log-likelihood.
        """
        return [
            (context + continuation[:start], continuation[start : start + self.max_length])
            for start in range(0, len(continuation), self.max_length)
        ]

    # -- scoring ---------------------------------------------------------------------------

    def _totals(self, count: int, windows: list[tuple[int, Pair]]) -> list[tuple[float, bool]]:
        """Sum the windows' log-probabilities per request; greedy only if every window is."""
        scores = self._score([pair for _, pair in windows])
        totals = [(0.0, True)] * count
        for (index, _), (logprob, greedy) in zip(windows, scores):
            total, all_greedy = totals[index]
            totals[index] = (total + logprob, all_greedy and greedy)
        return totals

    def _score(self, pairs: list[Pair]) -> list[tuple[float, bool]]:
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        for batch in self._batches([len(context) + len(continuation) for context, continuation in pairs]):
            for i, result in zip(batch, self._score_batch([pairs[i] for i in batch])):
                results[i] = result
        return results

    def _score_batch(self, pairs: list[Pair]) -> list[tuple[float, bool]]:
        """One forward over the pairs, each left-truncated to its last `max_length` + 1 tokens.

        The input drops the last token; the logits at the last len(continuation) positions
        predict the continuation. Right padding is harmless: attention is causal.
        """
        windows = [(context + continuation)[-(self.max_length + 1) :] for context, continuation in pairs]
        logits = self._logits([window[:-1] for window in windows])
        results = []
        for row, (window, (_, continuation)) in enumerate(zip(windows, pairs)):
            end = len(window) - 1
            log_probs = logits[row, end - len(continuation) : end].float().log_softmax(dim=-1)
            targets = torch.tensor(continuation, device=log_probs.device)
            logprob = log_probs.gather(-1, targets[:, None]).sum()
            greedy = bool((log_probs.argmax(dim=-1) == targets).all())
            results.append((float(logprob), greedy))
        return results

    # -- generation ------------------------------------------------------------------------

    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
        """The stop strings and token budget of one request; sampling is refused, not ignored."""
        if gen_kwargs.get("do_sample"):
            raise ConfigError(
                f"a task asks for sampled generation ({gen_kwargs}), but this adapter decodes greedily only; "
                "evaluate tasks with greedy generation or log-likelihoods"
            )
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        return [stop for stop in until if stop], int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))

    def _generate(self, prompts: list[list[int]], settings: list[tuple[list[str], int]]) -> list[str]:
        """Greedy decoding of a batch; a row leaves the batch when it stops."""
        generated: list[list[int]] = [[] for _ in prompts]
        active = [i for i, (_, budget) in enumerate(settings) if budget > 0]
        while active:
            next_ids = self._next_tokens([prompts[i] + generated[i] for i in active])
            still_active = []
            for i, token in zip(active, next_ids):
                if token == self.tokenizer.eos_id:
                    continue
                generated[i].append(token)
                until, budget = settings[i]
                text = self.tokenizer.decode(generated[i])
                if len(generated[i]) < budget and not any(stop in text for stop in until):
                    still_active.append(i)
            active = still_active
        return [_cut_at_stop(self.tokenizer.decode(ids), until) for ids, (until, _) in zip(generated, settings)]

    def _next_tokens(self, sequences: list[list[int]]) -> list[int]:
        """The greedy next token of each sequence (its last `max_length` tokens), among real
        token ids only: the logits of the padded vocabulary rows are cut off."""
        windows = [sequence[-self.max_length :] for sequence in sequences]
        logits = self._logits(windows)
        last = torch.stack([logits[row, len(window) - 1] for row, window in enumerate(windows)])
        next_ids = last[:, : self.tokenizer.vocab_size].argmax(dim=-1)
        return _agree_across_ranks(next_ids).tolist()

    # -- model calls -----------------------------------------------------------------------

    def _logits(self, rows: Sequence[list[int]]) -> torch.Tensor:
        """Logits [b, T, V] for token rows right-padded to the longest (with the EOS id)."""
        width = max(len(row) for row in rows)
        inputs = torch.full((len(rows), width), self.tokenizer.eos_id, dtype=torch.long)
        for i, row in enumerate(rows):
            inputs[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        with torch.no_grad():
            return self.model(inputs.to(self._device))

    def _batches(self, lengths: list[int]) -> Iterator[list[int]]:
        """Indices in batches of `batch_size`, longest first (ties in request order), so rows of
        a batch have similar lengths; the order depends on the requests only, the same on every rank."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        for start in range(0, len(order), self.batch_size):
            yield order[start : start + self.batch_size]


def _cut_at_stop(text: str, until: list[str]) -> str:
    """The text before the earliest stop string (all of it when none occurs)."""
    return text[: min((text.find(stop) for stop in until if stop in text), default=len(text))]


def _agree_across_ranks(token_ids: torch.Tensor) -> torch.Tensor:
    """Rank 0's token ids on every rank, when a process group of several ranks is running."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(token_ids, src=0)
    return token_ids
