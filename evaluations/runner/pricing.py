"""The price table moved to checks.pricing (the judge client prices its calls without Django);
re-exported here so the gateway and existing imports keep working."""

from __future__ import annotations

from checks.pricing import DEFAULT_PRICES, cost_usd, price_for

__all__ = ["DEFAULT_PRICES", "cost_usd", "price_for"]
