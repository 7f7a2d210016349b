"""Enqueue in the caller's transaction, claims, outcomes, leases and dead letters through
PgBouncer in transaction pooling mode (tests of test_conformance.py and
test_conformance_driver.py)."""

from __future__ import annotations

import pytest

from tests.integration.test_conformance import (  # noqa: F401 (fixtures and tests)
    orders,
    test_a_key_travels_with_the_transaction,
    test_bulk_enqueue_returns_ids_in_input_order,
    test_committed_enqueue_exists_and_runs,
    test_enqueue_and_own_write_share_the_transaction,
    test_rolled_back_enqueue_never_exists_nor_runs,
    test_uncommitted_task_is_never_claimable,
)
from tests.integration.test_conformance_driver import (  # noqa: F401
    test_claim_marks_the_row_processing_and_leased,
    test_complete_moves_the_row_to_the_archive,
    test_dead_list_requeue_and_purge,
    test_failed_discarded_dead_are_always_archived,
    test_insert_dedup_returns_the_live_task,
    test_insert_returns_ids_in_order_and_stores_every_field,
    test_lease_extension_leaves_out_rows_locked_elsewhere_without_waiting,
    test_racing_claimers_claim_every_task_exactly_once,
    test_release_hands_the_task_back_uncounted,
    test_retry_schedules_the_next_attempt,
    test_stale_attempt_outcome_is_fenced_off,
)

pytestmark = pytest.mark.postgresql
