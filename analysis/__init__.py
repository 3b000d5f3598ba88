"""Reading finished runs from their local logs: reports, comparisons and scaling-law fits.

Everything here works from the files a run leaves on disk (`csv/metrics.csv`,
`csv/hparams.yaml`, `.hydra/overrides.yaml`), so no W&B account or network is needed.
"""
