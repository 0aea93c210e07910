"""Cron-scheduled tasks for Django: exactly once per occurrence, correct across DST.

    from ultimat3_jobs import job, task

``ultimat3_jobs.cron`` is importable without Django settings.
"""

from .declarations import job, task
from .errors import JobNameTakenError, UltimateError
from .handles import Entry
from .registry import registry

__all__ = ["Entry", "JobNameTakenError", "UltimateError", "job", "registry", "task"]
