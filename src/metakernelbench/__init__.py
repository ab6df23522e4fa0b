"""MetaKernelBench: does kernel-writing experience transfer between GPU DSLs? Problems, DSL adapters, a hardened grader."""

__version__ = "0.1.0"
