"""The fake cluster's Job controller, reduced to a Job's status: a created Job is active at
once, and stays so until a test says how it ended (`succeed_job`, `fail_job`), as the real
controller writes it (the terminal condition after the one that announces it). Nothing runs a
Job's container: a test that needs the initializer's files writes them itself."""

from __future__ import annotations

import copy

from tests.api.backends.k8s_fake.store import Obj, Store, now

NS = "live-migrator"
DEFAULT_PROPAGATION = "Orphan"
"""batch/v1 Jobs keep the old default of a delete without a propagationPolicy: the Job goes,
its pods stay."""


class JobController:
    store: Store

    def job(self, name: str, namespace: str = NS) -> Obj:
        with self.store.changed:
            return copy.deepcopy(self.store.get("jobs", namespace, name))

    def succeed_job(self, name: str, namespace: str = NS) -> None:
        self._end_job(name, namespace, {"succeeded": 1, "completionTime": now()}, [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached"}])

    def fail_job(self, name: str, reason: str = "BackoffLimitExceeded",
                 namespace: str = NS) -> None:
        self._end_job(name, namespace, {"failed": 3}, [
            {"type": "FailureTarget", "status": "True", "reason": reason},
            {"type": "Failed", "status": "True", "reason": reason}])

    def _end_job(self, name: str, namespace: str, counts: Obj, conditions: list[Obj]) -> None:
        with self.store.changed:
            job = copy.deepcopy(self.store.get("jobs", namespace, name))
            stamped = [{**c, "lastProbeTime": now(), "lastTransitionTime": now(),
                        "message": c["reason"]} for c in conditions]
            job["status"] = {**job.get("status", {}), "active": 0, "ready": 0, **counts,
                             "conditions": stamped}
            self.store.update("jobs", job)

    def _start_jobs(self) -> None:
        """Every new Job: its pod created and running (as far as its status tells)."""
        for (plural, _, _), job in list(self.store.objects.items()):
            if plural == "jobs" and not job.get("status"):
                job = copy.deepcopy(job)
                job["status"] = {"active": 1, "ready": 0, "startTime": now()}
                self.store.update("jobs", job)
