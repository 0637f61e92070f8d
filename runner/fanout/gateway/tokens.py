"""Per-attempt tokens: the "API key" a worker is given instead of the real one.

A token is ``redact.TOKEN_PREFIX`` followed by ``secrets.token_urlsafe(32)`` (256
random bits), good for every API of the job from ``grant`` until ``revoke``; after
that, and for any string never granted, the gateway answers 401.  A token is only ever
a dictionary key here: never logged, never in an event, never in an error message.
The prefix is what lets every output redact any token by its shape (``redact``),
another unit's and a revoked one included, without a registry of the tokens made.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..outcome import ApiUsage, unit_budget_spent
from ..values.redact import TOKEN_PREFIX
from .usage import Ledger


@dataclass(frozen=True, kw_only=True, slots=True)
class Grant:
    """Whom a token was granted to, until when the gateway retries for it (the loop
    time past which a retry would outlive the attempt: then a 429 passes through), and
    what its requests used.  ``budget_usd``: the unit's ``task.budget`` (None: none),
    of which ``spent_usd`` went on its earlier attempts in the run.  Its ledger's
    books go to the journal as (round, unit, attempt): ``Ledger.whose``."""

    unit: str
    attempt: int
    deadline: float
    ledger: Ledger = field(compare=False)
    budget_usd: float | None = None
    spent_usd: float = 0.0

    def refused(self) -> str | None:
        """What each further request of this attempt is told once its unit's budget is
        spent (its own spending included), None while there is some left."""
        if self.budget_usd is None:
            return None
        return unit_budget_spent(self.budget_usd, self.spent_usd + self.ledger.cost_usd())


class Grants:
    def __init__(self, apis: Sequence[str]) -> None:
        self._apis = tuple(apis)
        self._live: dict[str, Grant] = {}

    def grant(
        self,
        *,
        unit: str,
        attempt: int,
        deadline: float,
        budget_usd: float | None = None,
        spent_usd: float = 0.0,
        round: int = 1,
    ) -> str:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self._live[token] = Grant(
            unit=unit,
            attempt=attempt,
            deadline=deadline,
            ledger=Ledger(self._apis, whose=(round, unit, attempt)),
            budget_usd=budget_usd,
            spent_usd=spent_usd,
        )
        return token

    def holder(self, token: str) -> Grant | None:
        return self._live.get(token)

    def revoke(self, token: str) -> tuple[ApiUsage, ...]:
        """Ends the token; what it used, one ``ApiUsage`` per API it called, in job
        order (empty for a token unknown or already revoked), its requests still in
        flight at their reservation.  Such a request finishes; its usage counts toward
        the run and in its attempt's books (the journal), not in what this returned."""
        grant = self._live.pop(token, None)
        return grant.ledger.used() if grant is not None else ()

    def __len__(self) -> int:
        return len(self._live)
