"""Cancel, pause and keys through PgBouncer in transaction pooling mode (tests of
test_conformance_control.py and test_conformance_keys.py)."""

from __future__ import annotations

import pytest

from tests.integration.test_conformance_control import (  # noqa: F401 (tests)
    test_a_cancelled_pending_task_is_archived_and_never_claimed,
    test_a_paused_queue_is_not_claimed_until_resumed,
    test_a_running_task_is_marked_and_its_worker_sees_it,
    test_cancel_racing_claims_each_task_is_claimed_or_cancelled_never_both,
)
from tests.integration.test_conformance_keys import (  # noqa: F401
    test_a_queue_rate_spaces_the_starts_of_the_whole_queue,
    test_a_rate_spaces_the_starts_of_a_key,
    test_an_ordered_key_starts_its_tasks_one_by_one_in_enqueue_order,
    test_neither_an_enqueue_nor_an_outcome_waits_for_a_claim_holding_a_key,
    test_racing_claims_never_exceed_a_key_s_concurrency,
    test_tasks_with_and_without_a_key_are_all_claimed,
)

pytestmark = pytest.mark.postgresql
