"""The wait for a launched driver's generation claim (`services/follow.py` `wait_for_claim`),
shared by the detached client-mode and the cluster-mode submit: a driver that claimed
nothing within the bound is killed there (one home for that rule), one that ended is not."""

from __future__ import annotations

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.services.follow import wait_for_claim
from airflow_sparkpoint.storage import MemoryStorage


class Driver:
    """A launched driver that never claims; `gone` says whether it ended."""

    def __init__(self, gone: bool) -> None:
        self._gone = gone
        self.kills = 0

    def describe(self) -> str:
        return "driver 7"

    def active(self) -> bool:
        return not self._gone

    def gone(self) -> bool:
        return self._gone

    def kill(self) -> str:
        self.kills += 1
        return "SIGTERM to driver 7; it ended"

    def where(self) -> dict[str, str]:
        return {}


def test_a_driver_that_claims_nothing_in_time_is_killed_and_the_kill_reported() -> None:
    catalog = Catalog(MemoryStorage(), "orders")
    driver = Driver(gone=False)
    waited = wait_for_claim(catalog, "token-1", 0, driver, timeout_s=0.0, sleep=lambda s: None)
    assert (waited.claim, waited.why, waited.killed) == (None, "timeout", "SIGTERM to driver 7; it ended")
    assert driver.kills == 1


def test_a_driver_that_ended_before_its_claim_is_not_killed() -> None:
    catalog = Catalog(MemoryStorage(), "orders")
    driver = Driver(gone=True)
    waited = wait_for_claim(catalog, "token-1", 0, driver, timeout_s=60.0, sleep=lambda s: None)
    assert (waited.claim, waited.why, waited.killed) == (None, "ended", "")
    assert driver.kills == 0
