"""Cron-scheduled tasks for Django: exactly once per occurrence, correct across DST.

    from ultimat3_jobs import job, task

``ultimat3_jobs.cron`` is importable without Django settings.
"""

from .errors import JobNameTakenError, UltimateError
from .registry import Entry, job, registry, task

__all__ = ["Entry", "JobNameTakenError", "UltimateError", "job", "registry", "task"]
