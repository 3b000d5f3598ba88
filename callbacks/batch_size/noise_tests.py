"""The adaptive batch-size tests (Lau, Liu, Kolar 2024; Bollapragada et al. 2018) as formulas.

The inputs are n gradient samples g_1..g_n, each the mean gradient over b_s sequences, and
their mean g (the step's gradient over B = n * b_s sequences). Every test needs only sums
over samples, which sharded ranks can complete with a scalar all-reduce:

- sum_sq = sum_j ||g_j||^2 and g_sq = ||g||^2 (norm test);
- dot_sum = sum_j <g_j, g> and dot_sq_sum = sum_j <g_j, g>^2 (inner-product tests).

Each test returns the batch size at which it would just hold; the callback grows the batch
to it when that is larger than the current one.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TESTS = ("norm", "inner_product", "augmented_inner_product")


@dataclass
class SampleSums:
    """Sums over the n samples of one optimizer step (whole model, all ranks)."""

    n: int
    sample_size: int  # b_s: sequences averaged in one sample
    sum_sq: float
    g_sq: float
    dot_sum: float | None = None
    dot_sq_sum: float | None = None


@dataclass
class PendingSums:
    """A tested step's sums still on the device (reduced over ranks, not yet read), so that
    reading them, which waits for the step's backward and reductions, can come a step later."""

    n: int
    sample_size: int
    totals: "torch.Tensor"  # sum_sq, g_sq, then (inner-product tests) dot_sum, dot_sq_sum

    def read(self) -> SampleSums:
        values = self.totals.cpu().tolist()
        sums = SampleSums(n=self.n, sample_size=self.sample_size, sum_sq=values[0], g_sq=values[1])
        if len(values) > 2:
            sums.dot_sum, sums.dot_sq_sum = values[2], values[3]
        return sums


def gradient_variance(s: SampleSums) -> float:
    """Trace of the per-sequence gradient covariance: b_s * sum_j ||g_j - g||^2 / (n - 1)."""
    return s.sample_size * (s.sum_sq - s.n * s.g_sq) / (s.n - 1)


def noise_scale(s: SampleSums) -> float:
    """The simple gradient noise scale B_simple = tr(Sigma) / ||g||^2 (the norm test at eta = 1)."""
    return gradient_variance(s) / s.g_sq


def norm_test_batch(s: SampleSums, eta: float) -> float:
    """Smallest B with tr(Sigma) / B <= eta^2 ||g||^2."""
    return noise_scale(s) / eta**2


def inner_product_variance(s: SampleSums) -> float:
    """Per-sequence variance of <g_i, g>: b_s times the sample variance of <g_j, g>."""
    return s.sample_size * (s.dot_sq_sum - s.dot_sum**2 / s.n) / (s.n - 1)


def orthogonal_variance(s: SampleSums) -> float:
    """Per-sequence variance of the part of g_i orthogonal to g.

    ||g_j - (<g_j, g> / ||g||^2) g||^2 = ||g_j||^2 - <g_j, g>^2 / ||g||^2, and these parts
    average to zero over the samples.
    """
    return s.sample_size * (s.sum_sq - s.dot_sq_sum / s.g_sq) / (s.n - 1)


def inner_product_test_batch(s: SampleSums, theta: float) -> float:
    """Smallest B with Var(<g_i, g>) / B <= theta^2 ||g||^4."""
    return inner_product_variance(s) / (theta**2 * s.g_sq**2)


def orthogonality_test_batch(s: SampleSums, nu: float) -> float:
    """Smallest B with E||g_i - proj_g g_i||^2 / B <= nu^2 ||g||^2."""
    return orthogonal_variance(s) / (nu**2 * s.g_sq)


def required_batch(s: SampleSums, test: str, eta: float, theta: float, nu: float) -> float:
    """The batch the chosen test asks for (augmented: the larger of its two parts)."""
    if test == "norm":
        return norm_test_batch(s, eta)
    if test == "inner_product":
        return inner_product_test_batch(s, theta)
    return max(inner_product_test_batch(s, theta), orthogonality_test_batch(s, nu))
