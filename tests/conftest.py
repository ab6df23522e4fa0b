"""Shared fixtures: the built-in suite and a CPU grader whose fork server starts once per test session."""
import pytest

from metakernelbench.suite import load_suite


@pytest.fixture(scope="session")
def suite():
    return load_suite()

