"""Cost of an LLM call: USD per one million input and output tokens, per model.

Pure (no Django): the gateway prices the agent's calls with it and the judge client its own.

Prices are list prices at the time of writing; a spec gives the price of a model this table
does not know, or overrides one, in `llm.prices`. A dated model name
(`gpt-4o-mini-2024-07-18`) is priced by its longest matching prefix. A model with no price
has no cost (None), not a cost of $0: a `cost` check or gate must not pass on a call it could
not price.
"""

from __future__ import annotations

from collections.abc import Mapping

# model -> (USD per 1M input tokens, USD per 1M output tokens)
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "scripted": (0.0, 0.0),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4": (30.00, 60.00),
    "gpt-3.5-turbo": (0.50, 1.50),
    "o1": (15.00, 60.00),
    "o1-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    "text-embedding-ada-002": (0.10, 0.0),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-opus": (15.00, 75.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "gemini-1.5-pro": (1.25, 5.00),
    "gemini-1.5-flash": (0.075, 0.30),
    "gemini-2.0-flash": (0.10, 0.40),
    "mistral-large": (2.00, 6.00),
    "mistral-small": (0.20, 0.60),
    "llama-3.1-8b": (0.05, 0.08),
    "llama-3.1-70b": (0.59, 0.79),
}


def price_for(
    model: str, table: Mapping[str, tuple[float, float]] | None = None
) -> tuple[float, float] | None:
    """The (input, output) price of `model`; None for a model the table does not know."""
    prices = DEFAULT_PRICES if table is None else table
    name = model.strip().lower()
    if name in prices:
        return prices[name]
    if "/" in name:  # "openai/gpt-4o" as routers spell it
        name = name.rsplit("/", 1)[1]
    if name in prices:
        return prices[name]
    matches = [key for key in prices if name.startswith(key)]
    if not matches:
        return None
    return prices[max(matches, key=len)]


def cost_usd(
    model: str,
    input_tokens: int,
    output_tokens: int,
    table: Mapping[str, tuple[float, float]] | None = None,
) -> float | None:
    """What the call cost in USD; None when `model` has no price (and the call used tokens)."""
    if input_tokens == 0 and output_tokens == 0:
        return 0.0
    price = price_for(model, table)
    if price is None:
        return None
    input_price, output_price = price
    return (input_tokens * input_price + output_tokens * output_price) / 1_000_000


def no_price_for(models: list[str]) -> str:
    """What to tell the user of calls to models with no price, and what to do about it."""
    names = ", ".join(repr(model) for model in models)
    return (
        f"no price for the model(s) {names}; give each one's price (USD per million tokens) "
        "in the spec's llm.prices, e.g. prices: {MODEL: {input: 1.25, output: 10}}"
    )


def format_usd(value: float, *others: float) -> str:
    """`value` as dollars: four decimals, or as many more as it takes (up to 10) for a
    non-zero cost not to read $0.0000 and for it to read differently from each of `others`
    it differs from (a limit it exceeded by a fraction of a cent)."""
    decimals = 4
    while decimals < 10:
        shown = round(value, decimals)
        if (value == 0 or shown != 0) and all(
            other == value or round(other, decimals) != shown for other in others
        ):
            break
        decimals += 1
    return f"${value:.{decimals}f}"
