"""Reference kits: helpers shared by the reference solutions of one DSL (`cute`, `tirx`; `common` for host code).

A reference imports what it needs by name (`from metakernelbench.suite.kits.cute import gmem_ptr`); the graded file is
the reference with those definitions inlined (`suite.bundle`), self-contained like any agent's submission.
"""
