"""The problem suite: fused subgraphs, each a PyTorch reference with an input generator and a numeric contract.

A problem lives in `<suite>/<family>/<nn>_<name>/problem.py`. Reference solutions (`cute.py`, `tirx.py`) sit beside
it and are never shown to agents. Modules in the published benchmark's layout (module constants, `reference`, a
no-argument `make_inputs()` seeded through torch's global generator) load unchanged.
"""
from metakernelbench.suite.loader import Problem, ProblemError, load_problem, load_suite, default_suite_path

__all__ = ["Problem", "ProblemError", "load_problem", "load_suite", "default_suite_path"]
