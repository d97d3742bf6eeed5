"""Tool callables of the support agent when it runs as a python agent.

A spec lists them under `agent.tools` (e.g. "support_agent.tools:lookup_order"); Keystone
wraps each one, so tool faults reach the agent where it really calls them, and hands the
wrappers to `support_agent.agent:run` as `context["tools"]`.
"""

from __future__ import annotations

from typing import Any

ORDERS: dict[int, dict[str, Any]] = {
    1042: {"state": "shipped", "order_id": 1042, "carrier": "DHL"},
    7: {"state": "paid", "order_id": 7, "carrier": None},
}
TICKETS_AT_START: dict[str, dict[str, Any]] = {
    "T-19": {"ticket_id": "T-19", "status": "open", "customer_id": 77, "confirmed": True},
    "T-7": {"ticket_id": "T-7", "status": "open", "customer_id": 77, "invoice": "INV-3"},
}
TICKETS: dict[str, dict[str, Any]] = {}


def reset_tickets() -> None:
    """Put the tickets back as they were (a spec's `reset_function`)."""
    TICKETS.clear()
    TICKETS.update({key: dict(ticket) for key, ticket in TICKETS_AT_START.items()})


reset_tickets()


def lookup_order(order_id: int) -> dict[str, Any]:
    """The order's state, or an error document for an unknown order."""
    return dict(ORDERS.get(int(order_id)) or {"error": f"no order {order_id}"})


def lookup_ticket(ticket_id: str) -> dict[str, Any]:
    return dict(TICKETS.get(ticket_id) or {"error": f"no ticket {ticket_id}"})


def update_ticket(ticket_id: str, status: str) -> str:
    if ticket_id not in TICKETS:
        return f"error: no ticket {ticket_id}"
    TICKETS[ticket_id]["status"] = status
    return "ok"
