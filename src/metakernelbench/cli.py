"""The `mkb` command: list and show problems, grade a submission, audit the suite, validate reference solutions."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(width=160)
err = Console(stderr=True)

SuiteOption = typer.Option(None, "--suite", help="Folder of problem modules (default: the built-in suite).")


def _fail(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _problems(suite: Optional[Path], names: Optional[str] = None):
    from metakernelbench.suite import ProblemError, load_problem, load_suite

    try:
        if names:
            return [load_problem(n.strip(), suite) for n in names.split(",") if n.strip()]
        return load_suite(suite)
    except ProblemError as exc:
        _fail(str(exc))


def _dsls(value: Optional[str]) -> list[str]:
    from metakernelbench.dsl import DSL_NAMES

    chosen = [d.strip() for d in value.split(",")] if value else list(DSL_NAMES)
    for dsl in chosen:
        if dsl not in DSL_NAMES:
            _fail(f"unknown DSL '{dsl}'; choose from {', '.join(DSL_NAMES)}")
    return chosen


def _device(value: Optional[str]) -> str:
    import torch

    if value is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(value).type == "cuda" and not torch.cuda.is_available():
        _fail(f"device '{value}' requested but no CUDA GPU is visible; use --device cpu")
    return value


@app.command("list")
def list_problems(suite: Optional[Path] = SuiteOption) -> None:
    """List the problems of the suite."""
    table = Table("#", "id", "source model", "summary")
    for p in _problems(suite):
        table.add_row(str(p.number), p.id, p.source_model, p.summary)
    console.print(table)


@app.command()
def show(problem: str, dsl: Optional[str] = typer.Option(None, help="Print the task statement for this DSL."),
         suite: Optional[Path] = SuiteOption) -> None:
    """Show a problem, or with --dsl the exact task statement an agent gets for that variant."""
    (p,) = _problems(suite, problem)
    if dsl:
        from metakernelbench.task import task_statement

        _dsls(dsl)
        print(task_statement(p, dsl))
        return
    console.print(f"[bold]{p.id}[/bold] ({p.family}, {p.source_model})", highlight=False)
    print(p.description.strip())
    print(f"sizes: {', '.join(p.sizes)}; outputs: {', '.join(p.outputs)}; compare: {json.dumps(p.compare)}")
    if p.inplace:
        print(f"in-place outputs: {p.inplace}")


@app.command()
def grade(problem: str, file: Path, dsl: str = typer.Option(..., help="The variant's DSL: cute or tirx."),
          device: Optional[str] = typer.Option(None, help="cuda, cuda:N or cpu (default: cuda if present)."),
          as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
          suite: Optional[Path] = SuiteOption) -> None:
    """Grade one submission FILE for PROBLEM in DSL; exits 0 when it passes, 1 when it fails."""
    from metakernelbench.grader import Grader, GraderConfig

    (p,) = _problems(suite, problem)
    _dsls(dsl)
    if not file.is_file():
        _fail(f"submission file {file} does not exist")
    with Grader(GraderConfig(device=_device(device))) as grader:
        verdict = grader.grade(p, dsl, file)
    if as_json:
        print(verdict.to_json())
    else:
        status = "[green]PASSED[/green]" if verdict.passed else f"[red]FAILED[/red] ({verdict.failed_check})"
        console.print(f"{p.id} [{dsl}] {status} {verdict.reason}", highlight=False)
        if verdict.runtime:
            r = verdict.runtime
            console.print(f"median {r['median_ms']:.4f} ms (p10 {r['p10_ms']:.4f}, p90 {r['p90_ms']:.4f}, "
                          f"n {r['n']}); speedup vs eager {verdict.speedup_vs_eager or float('nan'):.2f}x "
                          f"range {verdict.speedup_vs_eager_range}; roofline fraction "
                          f"{verdict.roofline.get('fraction')}", highlight=False)
    raise typer.Exit(0 if verdict.passed else 1)


@app.command()
def audit(suite: Optional[Path] = SuiteOption, device: Optional[str] = typer.Option("cpu")) -> None:
    """Prove every problem's outputs vary with the seed and are not near-constant (exit 1 otherwise)."""
    from metakernelbench.suite.audit import audit_problem

    table = Table("problem", "size", "output", "changed", "distinct", "std/max", "ok")
    failed = 0
    for p in _problems(suite):
        for row in audit_problem(p, _device(device)):
            failed += not row.passed
            table.add_row(row.problem, row.size, row.output, f"{row.changed_fraction:.1%}",
                          str(row.distinct_values), f"{row.relative_spread:.3g}",
                          "yes" if row.passed else f"[red]no[/red]: {row.reason}")
    console.print(table)
    raise typer.Exit(1 if failed else 0)


@app.command()
def validate(dsl: Optional[str] = typer.Option(None, help="Comma-separated DSLs (default: all)."),
             problems: Optional[str] = typer.Option(None, help="Comma-separated problems (default: all)."),
             device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if present)."),
             arch: str = typer.Option("sm_90a", help="GPU arch for compile checks on a CPU-only machine."),
             out: Optional[Path] = typer.Option(None, help="Write the JSON record here."),
             compile_baseline: Optional[bool] = typer.Option(
                 None, "--compile-baseline/--no-compile-baseline",
                 help="Also time torch.compile of the reference (default: on a GPU)."),
             suite: Optional[Path] = SuiteOption) -> None:
    """Grade every reference solution on the GPU; on a CPU-only machine, compile each for --arch instead."""
    from metakernelbench.grader.validation import validate as run_validation

    chosen, dsls, dev = _problems(suite, problems), _dsls(dsl), _device(device)
    if dev == "cpu":
        console.print(f"No GPU: compile-checking every reference solution for {arch} instead of grading.")

    def show_row(row):
        mark = "[green]ok[/green]" if row["passed"] else "[red]FAIL[/red]"
        detail = row.get("reason") or (row.get("error") or "").strip().splitlines()[-1:] or ""
        timing = f"{row['median_ms']:.4f} ms, roofline {row['fraction_of_roofline']:.0%}" \
            if row.get("median_ms") and row.get("fraction_of_roofline") else ""
        console.print(f"{mark} {row['problem']} [{row['dsl']}] {timing} {detail}", highlight=False)

    record = run_validation(chosen, dsls, dev, arch, compile_baseline, progress=show_row)
    s = record["summary"]
    console.print(f"{s['passed']}/{s['total']} variants {'pass' if record['mode'] == 'grade' else 'compile'} "
                  f"({s['seconds']:.0f} s)")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2, default=str))
    raise typer.Exit(0 if s["passed"] == s["total"] else 1)


@app.command()
def legend() -> None:
    """Print the meaning of every field of a verdict."""
    from metakernelbench.grader import VERDICT_LEGEND

    for key, meaning in VERDICT_LEGEND.items():
        console.print(f"[bold]{key}[/bold]: {meaning}", highlight=False)
