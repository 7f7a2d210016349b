"""The cleaner's sweeps, the worker and handlers' transactions through PgBouncer in
transaction pooling mode (tests of test_cleaner_sweeps.py, test_conformance_worker.py and
test_conformance_handlers.py)."""

from __future__ import annotations

import pytest

from tests.integration.test_cleaner_sweeps import (  # noqa: F401 (tests)
    test_archiver_moves_finished_rows_out_of_the_hot_table,
    test_reannouncer_skips_a_paused_queue_until_it_is_resumed,
    test_rescuer_applies_the_policy_to_expired_leases_only,
    test_retention_purges_per_outcome_and_per_queue,
    test_two_cleaners_fire_each_time_once,
    test_two_rescuers_at_once_rescue_each_task_once,
)
from tests.integration.test_conformance_handlers import (  # noqa: F401 (fixtures and tests)
    orders,
    test_a_transaction_held_past_the_heartbeat_keeps_the_attempt,
    test_async_handler_commits_its_writes_and_a_follow_up_with_its_completion,
    test_progress_is_stored_within_the_progress_interval,
    test_results_are_kept_and_final_errors_raised,
    test_sync_handler_commits_its_writes_with_its_completion,
)
from tests.integration.test_conformance_worker import (  # noqa: F401
    test_a_worker_that_lost_its_lease_cannot_overwrite_the_next_attempt,
    test_exhausted_attempts_dead_letter_then_requeue_and_purge,
    test_sync_and_async_handlers_run_with_their_context,
)

pytestmark = [pytest.mark.postgresql, pytest.mark.timeout(60)]
