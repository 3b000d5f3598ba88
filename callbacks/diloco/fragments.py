"""Streaming DiLoCo's fragments (Douillard et al. 2025): contiguous groups of transformer blocks.

With P fragments, block b of L belongs to fragment floor(b P / L). The parameters outside
the blocks join the fragment next to them: the input embedding the first, the final norm
and the output head the last (with tied embeddings the shared matrix is the embedding, so
it stays in the first). Fragment p syncs after the global steps t with
t mod H = ((p + 1) H / P) mod H, so the P syncs of a round are evenly spaced and the last
fragment syncs at multiples of H, as classic DiLoCo (P = 1) does.
"""

import re
from collections.abc import Iterable

_BLOCK = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def fragment_of(name: str, n_layers: int, fragments: int) -> int:
    """The fragment of a parameter, from its name (wrappers may add prefixes)."""
    match = _BLOCK.search(name)
    if match:
        return int(match.group(1)) * fragments // n_layers
    return 0 if "tok_embeddings" in name else fragments - 1


def split_parameters(names: Iterable[str], n_layers: int, fragments: int) -> list[list[int]]:
    """Indices of the parameters (in the order of ``names``) that make up each fragment."""
    groups: list[list[int]] = [[] for _ in range(fragments)]
    for index, name in enumerate(names):
        groups[fragment_of(name, n_layers, fragments)].append(index)
    return groups


def fragments_due(global_step: int, sync_every: int, fragments: int) -> list[int]:
    """The fragments whose exchange starts after global step ``global_step`` (1-based)."""
    phase = global_step % sync_every
    return [p for p in range(fragments) if (p + 1) * sync_every // fragments % sync_every == phase]
