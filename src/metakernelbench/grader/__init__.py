"""The grader: a trusted parent that judges submissions run in fresh untrusted children (see GRADER-THREATS.md).

GPU-side imports are the stdlib, numpy, torch and the DSL packages only, so grading runs on bare GPU nodes.
"""
from metakernelbench.grader.parent import Grader, GraderConfig
from metakernelbench.grader.verdict import VERDICT_LEGEND, Verdict

__all__ = ["Grader", "GraderConfig", "Verdict", "VERDICT_LEGEND"]
