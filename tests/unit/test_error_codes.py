"""Every error code is stable, documented in its class and listed in the README's Errors table."""

from __future__ import annotations

import inspect
import pickle
import re
from pathlib import Path

from ultimat3_jobs import errors
from ultimat3_jobs.errors import UltimateError, readable
from ultimat3_jobs.logs import failure_fields

README = Path(__file__).resolve().parents[2] / "README.md"
#: The codes ``logs.failure_fields`` gives failures that are not ``UltimateError``s.
LOG_CODES = [
    "jobs.database-unavailable",
    "jobs.database-not-migrated",
    "jobs.database-timeout",
    "jobs.prepared-statement-lost",
    "jobs.unexpected-error",
]


def _error_classes() -> list[type[UltimateError]]:
    return [
        value
        for _, value in inspect.getmembers(errors, inspect.isclass)
        if issubclass(value, UltimateError)
    ]


def _readme_table_codes() -> set[str]:
    text = README.read_text()
    section = text.split("## Errors\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z.\-]+)` \|", section, flags=re.MULTILINE))


def test_errors__every_class_has_its_own_code_and_a_docstring() -> None:
    classes = _error_classes()
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))
    assert all(cls.__doc__ and cls.__doc__.strip() for cls in classes)
    assert all(re.fullmatch(r"jobs(\.[a-z\-]+)+", code) for code in codes)


def test_readme__the_errors_table_lists_every_code_and_no_other() -> None:
    expected = {cls.code for cls in _error_classes()} | set(LOG_CODES)
    assert _readme_table_codes() == expected


def test_logs__the_log_codes_listed_are_the_ones_failure_fields_gives() -> None:
    source = inspect.getsource(failure_fields)
    assert set(re.findall(r'"(jobs\.[a-z\-]+)"', source)) == set(LOG_CODES)


def test_errors__every_class_survives_pickling_with_its_code_message_fix_and_cause() -> None:
    # Errors cross processes pickled (a Celery prefork pool's child to its parent).
    unpicklable = lambda: None  # noqa: E731
    for kind in _error_classes():
        error = kind("it broke", fix="do this", cause=ValueError("under it"))
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), copy.code, copy.message, copy.fix) == (
            kind,
            kind.code,
            "it broke",
            "do this",
        )
        assert repr(copy.cause) == repr(ValueError("under it"))
        assert pickle.loads(pickle.dumps(kind("m", fix="f", cause=unpicklable))).cause == (
            readable(unpicklable)
        )
