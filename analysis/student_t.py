"""Student's t quantile: the one the analysis's intervals (fits, spreads over seeds) and the
study's claim tests take their widths from."""

from scipy import stats


def t_quantile(df: int, probability: float = 0.975) -> float:
    """Student's t quantile (two-sided 95% by default)."""
    return float(stats.t.ppf(probability, df))
