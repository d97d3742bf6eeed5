"""How a count reads in messages, reports and pages rendered in Python."""


def counted(count: int, noun: str) -> str:
    """`count` with `noun`, in the plural unless it is one: "1 execution", "3 executions"
    (every noun worded here takes an s)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
