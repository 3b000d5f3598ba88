"""The train / validation split, decided per document.

Document i (counting the non-empty documents of the source from 0) goes to validation
iff floor((i + 1) * f) > floor(i * f). Validation documents are then evenly spaced
through the corpus (no topic drift between the splits, unlike a tail split), the first
n documents always hold exactly floor(n * f) of them, and the decision needs no random
state, so it is the same on every machine and for every tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction


class ValidationSplit:
    """Decides which documents are validation documents, with exact integer arithmetic.

    `val_fraction` is read as the decimal it is written as (0.005 is exactly 1/200), so
    floating-point rounding never moves a document between the splits.
    """

    def __init__(self, val_fraction: float) -> None:
        exact = Fraction(str(val_fraction))
        self._numerator = exact.numerator
        self._denominator = exact.denominator

    def is_validation(self, index: int) -> bool:
        """Whether document `index` belongs to the validation split."""
        before = index * self._numerator // self._denominator
        return (index + 1) * self._numerator // self._denominator > before

    def training_documents(self, batches: Iterable[list[str]]) -> Iterator[str]:
        """The training documents of a batched document stream, in order (what a tokenizer may learn from)."""
        index = 0
        for documents in batches:
            for document in documents:
                if not self.is_validation(index):
                    yield document
                index += 1
