"""Writes: every change to Keystone's rows goes through a function of this package, one
module per domain. Naming follows `<entity>_<action>`; tasks, views, the API and the CLI call
these and hold no domain logic of their own. The lifecycle of a run:

specs.spec_version_create -> runs.run_create -> runs.run_plan (Execution rows)
-> executions.execution_execute (claim, harness) -> recording.execution_record
-> finalize.run_finalize (scores, gates, exit code, review items), with
executions.execution_requeue_expired for dead workers. Work is handed on by
evaluations.queue. docs/architecture.md walks one run through these modules.

The names below are what the interfaces call, so they need one import:
`from evaluations import services`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evaluations.services.alerts import (
        AlertError,
        alert_channel_create,
        alert_channel_delete,
        alert_rule_create,
        alert_rule_delete,
        alerts_evaluate,
        firing_deliver,
        firing_resend,
        firings_send_stale,
    )
    from evaluations.services.baselines import (
        BASELINE_OUTPUT_MAX_CHARS,
        BaselineError,
        baseline_branch,
        baseline_promote,
        baseline_rollback,
    )
    from evaluations.services.digest import digest_due_end, digests_send_due
    from evaluations.services.executions import (
        InfrastructureError,
        execution_claim,
        execution_enqueue,
        execution_execute,
        execution_leases_renew_now,
        execution_release,
        execution_requeue_expired,
    )
    from evaluations.services.finalize import run_finalize, run_finalize_if_done
    from evaluations.services.projects import (
        MembershipError,
        demo_load,
        demo_runs_seed,
        member_create,
        membership_add,
        membership_remove,
        membership_set_role,
        project_create,
        project_default,
    )
    from evaluations.services.recording import execution_record, execution_record_error
    from evaluations.services.replay import execution_replay_session, run_replay_export
    from evaluations.services.review_verdicts import (
        ReviewSubmission,
        review_adjudicate,
        review_submit,
        review_undo,
    )
    from evaluations.services.reviews import (
        REVIEW_POLICY_DEFAULTS,
        ReviewClaimError,
        ReviewError,
        ReviewInputError,
        ReviewPermissionError,
        ReviewPolicy,
        project_review_policy_set,
        review_claim,
        review_items_select,
        review_next,
        review_policy_for,
        review_release,
        review_send,
    )
    from evaluations.services.runs import (
        IdempotencyConflict,
        RunLabelError,
        engine_spec,
        run_cancel,
        run_create,
        run_plan,
        run_rerun_failed,
        run_sweep_stuck,
        run_warning_add,
    )
    from evaluations.services.specs import SpecVersionConflict, spec_version_create
    from evaluations.services.tokens import (
        TokenError,
        personal_token_issue,
        personal_token_revoke,
        token_issue,
        token_revoke,
    )

# Where each name is defined. A module is imported when one of its names is first used
# (PEP 562), so a command pays for the modules it calls, not for all of them: importing every
# module here made each `keystone run` load the digest and the regression report with
# services.alerts and selectors.
_NAMES = {
    "alerts": (
        "AlertError",
        "alert_channel_create",
        "alert_channel_delete",
        "alert_rule_create",
        "alert_rule_delete",
        "alerts_evaluate",
        "firing_deliver",
        "firing_resend",
        "firings_send_stale",
    ),
    "baselines": (
        "BASELINE_OUTPUT_MAX_CHARS",
        "BaselineError",
        "baseline_branch",
        "baseline_promote",
        "baseline_rollback",
    ),
    "digest": (
        "digest_due_end",
        "digests_send_due",
    ),
    "executions": (
        "InfrastructureError",
        "execution_claim",
        "execution_enqueue",
        "execution_execute",
        "execution_leases_renew_now",
        "execution_release",
        "execution_requeue_expired",
    ),
    "finalize": (
        "run_finalize",
        "run_finalize_if_done",
    ),
    "projects": (
        "MembershipError",
        "demo_load",
        "demo_runs_seed",
        "member_create",
        "membership_add",
        "membership_remove",
        "membership_set_role",
        "project_create",
        "project_default",
    ),
    "recording": (
        "execution_record",
        "execution_record_error",
    ),
    "replay": (
        "execution_replay_session",
        "run_replay_export",
    ),
    "review_verdicts": (
        "ReviewSubmission",
        "review_adjudicate",
        "review_submit",
        "review_undo",
    ),
    "reviews": (
        "REVIEW_POLICY_DEFAULTS",
        "ReviewClaimError",
        "ReviewError",
        "ReviewInputError",
        "ReviewPermissionError",
        "ReviewPolicy",
        "project_review_policy_set",
        "review_claim",
        "review_items_select",
        "review_next",
        "review_policy_for",
        "review_release",
        "review_send",
    ),
    "runs": (
        "IdempotencyConflict",
        "RunLabelError",
        "engine_spec",
        "run_cancel",
        "run_create",
        "run_plan",
        "run_rerun_failed",
        "run_sweep_stuck",
        "run_warning_add",
    ),
    "specs": ("SpecVersionConflict", "spec_version_create"),
    "tokens": (
        "TokenError",
        "personal_token_issue",
        "personal_token_revoke",
        "token_issue",
        "token_revoke",
    ),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
# The same names again, for `import *` and for linters, which check the imports above
# against them (tests/test_cli_startup.py checks them against _NAMES).
__all__ = [
    "AlertError",
    "BASELINE_OUTPUT_MAX_CHARS",
    "BaselineError",
    "IdempotencyConflict",
    "InfrastructureError",
    "MembershipError",
    "REVIEW_POLICY_DEFAULTS",
    "ReviewClaimError",
    "ReviewError",
    "ReviewInputError",
    "ReviewPermissionError",
    "ReviewPolicy",
    "ReviewSubmission",
    "RunLabelError",
    "SpecVersionConflict",
    "TokenError",
    "alert_channel_create",
    "alert_channel_delete",
    "alert_rule_create",
    "alert_rule_delete",
    "alerts_evaluate",
    "baseline_branch",
    "baseline_promote",
    "baseline_rollback",
    "demo_load",
    "demo_runs_seed",
    "digest_due_end",
    "digests_send_due",
    "engine_spec",
    "execution_claim",
    "execution_enqueue",
    "execution_execute",
    "execution_leases_renew_now",
    "execution_record",
    "execution_record_error",
    "execution_release",
    "execution_replay_session",
    "execution_requeue_expired",
    "firing_deliver",
    "firing_resend",
    "firings_send_stale",
    "member_create",
    "membership_add",
    "membership_remove",
    "membership_set_role",
    "personal_token_issue",
    "personal_token_revoke",
    "project_create",
    "project_default",
    "project_review_policy_set",
    "review_adjudicate",
    "review_claim",
    "review_items_select",
    "review_next",
    "review_policy_for",
    "review_release",
    "review_send",
    "review_submit",
    "review_undo",
    "run_cancel",
    "run_create",
    "run_finalize",
    "run_finalize_if_done",
    "run_plan",
    "run_replay_export",
    "run_rerun_failed",
    "run_sweep_stuck",
    "run_warning_add",
    "spec_version_create",
    "token_issue",
    "token_revoke",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next use finds it without this function
    return value
