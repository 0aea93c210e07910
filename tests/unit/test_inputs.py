"""Occurrence keys hold an input digest: a faster encoder must never change one."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ultimat3_jobs.inputs import canonical_input, input_digest, value_problem

# What every release so far digested: json with sorted keys and no spaces.
_REFERENCE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode

plain = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(max_codepoint=127)),
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
)
flat = st.dictionaries(st.text(alphabet=st.characters(max_codepoint=127)) | st.text(), plain)


def _reference(value: dict[str, Any]) -> str:
    return hashlib.sha256(_REFERENCE(value).encode()).hexdigest()[:16]


@settings(max_examples=500)
@given(flat)
def test_input_digest__is_the_reference_digest_for_flat_input(value: dict[str, Any]) -> None:
    assert input_digest(value) == _reference(value)


def test_input_digest__edge_values_keep_their_reference_digest() -> None:
    for value in (
        {},
        {"del": "\x7f"},
        {"\x7f": 1},
        {"ctl": "".join(chr(i) for i in range(32))},
        {"big": 2**63, "small": -(2**63), "edge": 2**63 - 1},
        {"é": "ü", "astral": "\U0001f600"},
        {"nested": {"b": [1, 2.5, None]}, "a": True},
    ):
        assert input_digest(value) == _reference(value), value


def _without_nul(value: dict[str, Any]) -> bool:
    return not any("\x00" in t for k, v in value.items() for t in (k, v) if isinstance(t, str))


@given(flat.filter(_without_nul))
def test_canonical_input__flat_input_comes_back_as_json_reads_it(value: dict[str, Any]) -> None:
    # Hypothesis text holds no lone surrogate: without NUL, every value is storable.
    assert canonical_input("unit.job", value) == json.loads(json.dumps(value))


@given(
    st.one_of(st.integers(), st.integers(min_value=2**62), st.booleans(), st.none()),
    st.integers(1, 40),
)
def test_value_problem__a_scalar_is_judged_by_its_json_text(value: Any, limit: int) -> None:
    # None, bools and 64-bit integers skip the encoding: the answer must be the same.
    assert (value_problem(value, limit) is None) == (len(json.dumps(value)) <= limit)
