"""Analysis of a results store: for now the run summary that `mkb run` and `mkb demo` print and write."""
from metakernelbench.analysis.summary import summarise

__all__ = ["summarise"]
