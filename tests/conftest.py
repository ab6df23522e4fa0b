"""Shared fixtures: the built-in suite and a CPU grader whose fork server starts once per test session. Where no
nvcc is installed, the CUDA compiler of the `nvcc` extra's wheels serves the compile checks."""
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from metakernelbench.suite import load_suite


def _toolkit_from_wheels() -> None:
    """TIRx's compile checks call `nvcc` from PATH and read CUDA_PATH: point both at the wheels' toolkit."""
    if shutil.which("nvcc"):
        return
    found = importlib.util.find_spec("nvidia")
    for root in (found.submodule_search_locations or []) if found else []:
        toolkit = Path(root, "cu13")
        if (toolkit / "bin" / "nvcc").is_file():
            os.environ["PATH"] = f"{toolkit / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
            if not Path(os.environ.get("CUDA_PATH", "/nonexistent"), "bin", "nvcc").is_file():
                os.environ["CUDA_PATH"] = str(toolkit)
            return


_toolkit_from_wheels()


@pytest.fixture(scope="session")
def suite():
    return load_suite()
