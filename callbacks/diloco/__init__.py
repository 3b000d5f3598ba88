"""DiLoCo (Douillard et al. 2023, 2025; Charles et al. 2025): replicas that sync every H steps, in streaming fragments."""
