"""One refusal for a name already taken, whether the other row was there when the request
looked or arrived between its look and its insert.

A service checks that a name is free, then inserts. Two requests at the same moment both
find it free; the database's unique constraint refuses the second insert, and that
IntegrityError was a 500 naming no field, where the same request a moment later got a clear
refusal. `Taken` asks the same question twice: before the insert (the ordinary refusal),
and again when the insert, run in a savepoint, breaks a constraint; if the row is there
now, the winner of the race committed it, and the loser gets the ordinary refusal. Any
other IntegrityError is raised as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.db import IntegrityError, transaction

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Taken(Generic[T]):
    """`existing()` is the row holding the name (or None); `refusal(row)` the error to raise."""

    existing: Callable[[], T | None]
    refusal: Callable[[T], Exception]

    def check(self) -> None:
        """Refuse when the name is taken now."""
        row = self.existing()
        if row is not None:
            raise self.refusal(row)

    @contextmanager
    def inserting(self) -> Iterator[None]:
        """Run the insert(s) of the body in a savepoint: a unique constraint broken because
        a concurrent request took the name first is the same refusal as `check`."""
        try:
            with transaction.atomic():
                yield
        except IntegrityError:
            # Read committed: this statement sees the row the other transaction committed
            # (PostgreSQL reports the violation only once that transaction has committed).
            row = self.existing()
            if row is None:
                raise
            raise self.refusal(row) from None
