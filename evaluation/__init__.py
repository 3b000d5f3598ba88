"""Downstream evaluation with lm-evaluation-harness (`lm-eval` 0.4).

- `lm_adapter.py`: `LlamaLM`, lm-eval's model interface over this project's model and
  tokenizer (one device, or every rank of a DDP / FSDP2 run with the same requests).
- `corpus_cloze.py`: an offline multiple-choice task cut from the run's held-out documents.
- `harness.py`: `TaskSpec`, and running tasks (local or lm-eval's own) to metrics.
- `checkpoint.py`: a checkpoint turned into model, tokenizer and data settings.

`scripts/evaluate.py` puts them together for a checkpoint; a training callback can use the
same pieces on the live model.
"""
