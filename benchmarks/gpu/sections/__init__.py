"""One module per section of the GPU benchmark, each with a function of its name: ``(Suite) -> Table``."""
