"""`keywords`: deny-list and allow-list guardrails on the output (KindLM), case-insensitive."""

from __future__ import annotations

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    get_str_list,
    guarded,
    plain_text,
    quote,
    snippet,
)
from checks.results import FailureCode, Outcome


class KeywordsCheck(Check):
    type = "keywords"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        deny = get_str_list(self.config, "deny")
        allow = get_str_list(self.config, "allow")
        if not deny and not allow:
            raise ConfigError("at least one of 'deny' or 'allow' is required")
        output = plain_text(artifact.final_output or "")  # as a reader sees it
        folded = output.casefold()

        denied = []
        for word in deny:
            index = folded.find(plain_text(word).casefold())
            if index >= 0:
                denied.append(
                    {"keyword": word, "context": snippet(output, index, index + len(word))}
                )
        allowed_found = [w for w in allow if plain_text(w).casefold() in folded]
        allow_missing = bool(allow) and not allowed_found

        if denied:
            words = [d["keyword"] for d in denied]
            message = f"output contains denied keyword(s) {', '.join(quote(w, 40) for w in words)}"
            if allow_missing:
                message += "; and none of the allowed keywords"
            return Outcome.fail(
                FailureCode.KEYWORD_DENIED,
                message,
                denied=words,
                occurrences=denied,
                allow_missing=allow_missing,
            )
        if allow_missing:
            return Outcome.fail(
                FailureCode.KEYWORD_MISSING,
                f"output must contain at least one of: {', '.join(quote(w, 40) for w in allow)}",
                allow=allow,
            )
        return Outcome.ok("keyword guardrails hold", allowed_found=allowed_found)


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (KeywordsCheck,)
