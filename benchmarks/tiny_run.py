"""The tiny run that tests and CPU benchmarks train: a 2-block, 32-wide model on a few
hundred documents of the embedded corpus, so that a few optimizer steps take about a second
on CPU. One list, so a benchmark measures the run the tests check."""

#: The model and the corpus, as train.py overrides.
TINY_MODEL = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.mlp_hidden=64",
    "data.seq_len=32",
    "data.source.max_documents=600",
    "data.val_max_rows=16",
]
#: The model, the corpus and the recipe.
TINY_RUN = [
    *TINY_MODEL,
    "optimizer=adamw",
    "optimizer.lr=4e-3",
    "lr_schedule.warmup_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.num_sanity_val_steps=0",
]
