"""Fuzz smoke (issue: reliability): the checked-in corpus of hostile classes, then a bounded
number of hypothesis cases mutated from it, each through the sanitized scanner and both readers
(tests/fuzz/harness.py says what one case checks). bench/fuzz.py runs the same property long;
COMMPROBE_FUZZ_EXAMPLES sets the number of cases here (CI: 300)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz import harness


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = harness.Driver.build(tmp_path_factory.mktemp("asan"))
    yield d
    if d is not None:
        d.close()  # exit status 0: no leak reported at exit


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("case")


EXPECTED = {"nccl_linked": "ok", "bare_list": "ok", "escaped_keys": "ok", "escaped_name": "ok", "deep_args": "ok",
            "seq_beyond_int64": "ok", "group_size_beyond_int64": "ok", "dict_for_string": "ok",
            "tid_string_and_negative": "ok", "metadata_string": "ok", "utf8_args": "refused",
            "huge_number_args": "refused", "huge_number_ts": "refused", "world_size_list": "ok",
            "traceevents_twice": "refused", "truncated": "refused"}


def test_the_corpus_covers_every_class_and_each_gives_its_answer(driver, work):
    assert sorted(p.stem for p in harness.CORPUS) == sorted(EXPECTED)
    for p in harness.CORPUS:
        for chunk in (0, 1, 5, 64):
            for gz in (False, True):
                assert harness.check(p.read_bytes(), chunk, gz, work, driver) == EXPECTED[p.stem], (p.name, chunk, gz)


def test_the_sanitized_scanner_is_built_where_a_compiler_supports_it(driver):
    if driver is None:
        pytest.skip(f"no sanitizer build here: {harness.Driver.why}")
    assert driver.scan(b'{"traceEvents": []}', 0) == "." and driver.scan(b"[", 0) == "R"
    assert driver.scan(b'[{"name": "' + b"x" * 100 + b'"}]', 7, max_token=64) == "R"


@settings(max_examples=int(os.environ.get("COMMPROBE_FUZZ_EXAMPLES") or 300), derandomize=True, deadline=None,
          database=None, suppress_health_check=list(HealthCheck))
@given(case=harness.cases)
def test_fuzz_smoke(case, driver, work):
    data, chunk, gz = case
    harness.check(data, chunk, gz, work, driver)
