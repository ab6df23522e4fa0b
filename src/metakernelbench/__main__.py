"""`python -m metakernelbench` is the `mkb` command."""
from metakernelbench.cli import app

app()
