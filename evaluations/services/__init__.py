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
    engine_spec,
    run_cancel,
    run_create,
    run_plan,
    run_rerun_failed,
    run_sweep_stuck,
    run_warning_add,
)
from evaluations.services.specs import spec_version_create
from evaluations.services.tokens import (
    TokenError,
    personal_token_issue,
    personal_token_revoke,
    token_issue,
    token_revoke,
)

__all__ = [
    "digest_due_end",
    "digests_send_due",
    "AlertError",
    "alert_channel_create",
    "alert_channel_delete",
    "alert_rule_create",
    "alert_rule_delete",
    "alerts_evaluate",
    "firing_deliver",
    "firing_resend",
    "firings_send_stale",
    "BASELINE_OUTPUT_MAX_CHARS",
    "REVIEW_POLICY_DEFAULTS",
    "BaselineError",
    "IdempotencyConflict",
    "InfrastructureError",
    "MembershipError",
    "ReviewClaimError",
    "ReviewError",
    "ReviewInputError",
    "ReviewPermissionError",
    "ReviewPolicy",
    "ReviewSubmission",
    "TokenError",
    "baseline_branch",
    "baseline_promote",
    "baseline_rollback",
    "demo_load",
    "demo_runs_seed",
    "engine_spec",
    "execution_claim",
    "execution_enqueue",
    "execution_execute",
    "execution_record",
    "execution_record_error",
    "execution_release",
    "execution_replay_session",
    "execution_requeue_expired",
    "member_create",
    "membership_add",
    "membership_remove",
    "membership_set_role",
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
    "personal_token_issue",
    "personal_token_revoke",
    "token_issue",
    "token_revoke",
]
