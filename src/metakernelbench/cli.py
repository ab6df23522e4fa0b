"""The `mkb` command: problems, grading and validation; agent runs, their status, transcripts and exports."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(width=160)
err = Console(stderr=True)

SuiteOption = typer.Option(None, "--suite", help="Folder of problem modules (default: the built-in suite).")
LEDGER = Path("validation/ledger")
AWAITING_FILE = "awaiting-gpu.json"


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _problems(suite: Optional[Path], names: Optional[str] = None):
    from metakernelbench.suite import ProblemError, load_problem, load_suite

    try:
        if names:
            return [load_problem(n.strip(), suite) for n in names.split(",") if n.strip()]
        return load_suite(suite)
    except ProblemError as exc:
        _fail(str(exc))


def _dsls(value: Optional[str]) -> list[str]:
    from metakernelbench.dsl import dsl_names

    chosen = [d.strip() for d in value.split(",")] if value else list(dsl_names())
    for dsl in chosen:
        if dsl not in dsl_names():
            _fail(f"unknown DSL '{dsl}'; choose from {', '.join(dsl_names())}")
    return chosen


def _device(value: Optional[str]) -> str:
    import torch

    if value is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    chosen = torch.device(value)
    if chosen.type == "cuda" and not torch.cuda.is_available():
        _fail(f"device '{value}' requested but no CUDA GPU is visible; use --device cpu")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        _fail(f"device '{value}' does not exist: {torch.cuda.device_count()} GPU(s) visible, cuda:0 to "
              f"cuda:{torch.cuda.device_count() - 1}")
    return value


@app.command("list")
def list_problems(suite: Optional[Path] = SuiteOption) -> None:
    """List the problems of the suite."""
    from metakernelbench.suite.loader import default_suite_path, recipes

    from metakernelbench.dsl import dsl_names
    from metakernelbench.grader.validation import read_awaiting, read_ledger

    ledger = read_ledger(LEDGER) if LEDGER.is_dir() else []
    vouched = {(r.problem, r.dsl, r.sha256) for r in ledger if r.passed and "H200" in r.gpu}
    awaiting = read_awaiting(LEDGER.parent / AWAITING_FILE)
    table = Table("#", "source model", "H200 record (" + ", ".join(dsl_names()) + ")", "summary")
    table.columns.insert(1, Column("id", no_wrap=True))
    for p in _problems(suite):
        marks = []
        for dsl in dsl_names():
            if p.solution_path(dsl).is_file():
                state = ("ok" if (p.id, dsl, p.solution_sha256(dsl)) in vouched
                         else "awaiting" if (p.id, dsl) in awaiting else "unrecorded")
                marks.append(state)
        table.add_row(str(p.number), p.id, p.source_model, ", ".join(marks) or "-", p.summary)
    console.print(table)
    waiting = recipes(suite or default_suite_path())
    if waiting:
        console.print(f"{len(waiting)} SOL-ExecBench recipe(s) (*.json) are not listed: they become problems once "
                      "assembled with the licensed dataset (upstream's licenses/README.md)", highlight=False)


@app.command("dsls")
def list_dsls() -> None:
    """List the registered DSLs: name, title, whether installed, versions (a DSL package adds itself by entry point)."""
    from metakernelbench.dsl import dsl_names, get_adapter

    table = Table("name", "title", "installed", "versions")
    for name in dsl_names():
        adapter = get_adapter(name)
        found = adapter.versions()
        table.add_row(name, adapter.title, "yes" if adapter.available() else "no",
                      ", ".join(f"{k} {v}" for k, v in found.items() if v) or "-")
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
def grade(problem: str, file: Path, dsl: str = typer.Option(..., help="The variant's DSL (`mkb dsls` lists them)."),
          device: Optional[str] = typer.Option(None, help="cuda, cuda:N or cpu (default: cuda if present)."),
          as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
          suite: Optional[Path] = SuiteOption) -> None:
    """Grade one submission FILE for PROBLEM in DSL; exits 0 when it passes, 1 when it fails."""
    from metakernelbench.grader import Grader, GraderConfig

    (p,) = _problems(suite, problem)
    _dsls(dsl)
    if file.is_dir():
        _fail(f"{file} is a folder: pass the submission's .py file")
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
    """Check every problem's spec and formulas, and prove its outputs vary with the seed and are not near-constant
    (exit 1 otherwise). Modules in upstream's layout declare no sizes or formulas: only the seed audit applies."""
    from metakernelbench.suite import ProblemError
    from metakernelbench.suite.audit import audit_problem
    from metakernelbench.suite.spec import check_work

    table = Table("problem", "size", "output", "changed", "distinct", "std/max", "ok")
    failed = 0
    for p in _problems(suite):
        faults = [] if p.published_layout else check_work(p)
        for fault in faults:
            err.print(f"spec: {fault}", highlight=False, markup=False, soft_wrap=True)
        try:
            rows = audit_problem(p, _device(device))
        except ProblemError as exc:
            _fail(str(exc))
        failed += len(faults) + sum(not row.passed for row in rows)
        for row in rows:
            table.add_row(row.problem, row.size, row.output, f"{row.changed_fraction:.1%}",
                          str(row.distinct_values), f"{row.relative_spread:.3g}",
                          "yes" if row.passed else f"[red]no[/red]: {escape(row.reason)}")
    console.print(table)
    raise typer.Exit(1 if failed else 0)


@app.command()
def validate(dsl: Optional[str] = typer.Option(None, help="Comma-separated DSLs (default: all)."),
             problems: Optional[str] = typer.Option(None, help="Comma-separated problems (default: all)."),
             device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if present)."),
             arch: str = typer.Option("sm_90a", help="GPU arch for compile checks on a CPU-only machine."),
             changed: bool = typer.Option(False, "--changed", help="Grade only variants the ledger does not vouch "
                                          "for on this GPU (their graded file, GPU or versions changed)."),
             ledger: Path = typer.Option(LEDGER, help="The ledger folder (*.jsonl records)."),
             list_awaiting: Optional[str] = typer.Option(
                 None, "--list-awaiting", metavar="WHY", help="No grading: write validation/awaiting-gpu.json, "
                 "listing every reference without a passing H200 record (at its current hash) and WHY."),
             record: Optional[Path] = typer.Option(None, help="Append this run's records here (default: a new "
                                                   "file in the ledger folder)."),
             compile_baseline: Optional[bool] = typer.Option(
                 None, "--compile-baseline/--no-compile-baseline",
                 help="Also time torch.compile of the reference (default: on a GPU)."),
             suite: Optional[Path] = SuiteOption) -> None:
    """Grade reference solutions on the GPU into the ledger; on a CPU-only machine, compile each for --arch."""
    from metakernelbench.grader.parent import device_name
    from metakernelbench.grader.validation import (compile_references, grade_references, read_ledger,
                                                   record_name, versions, write_awaiting)

    chosen, dsls = _problems(suite, problems), _dsls(dsl)
    variants = [(p, d) for p in chosen for d in dsls if p.solution_path(d).is_file()]
    if list_awaiting is not None:
        records = read_ledger(ledger) if ledger.is_dir() else []
        entries = [{"problem": p.id, "dsl": d, "sha256": p.solution_sha256(d), "why": list_awaiting}
                   for p, d in variants
                   if not any(r.vouches_for(p.id, d, p.solution_sha256(d), "H200") for r in records)]
        write_awaiting(ledger.parent / AWAITING_FILE, entries)
        console.print(f"{len(entries)} of {len(variants)} references await their H200 record: "
                      f"{ledger.parent / AWAITING_FILE}", highlight=False)
        return
    dev = _device(device)
    started = time.monotonic()
    if dev == "cpu":
        console.print(f"No GPU: compile-checking {len(variants)} reference solutions for {arch} (one process per "
                      "DSL) instead of grading.", highlight=False)

        def show_check(item):
            problem, check = item
            mark = "[green]ok[/green]" if check.ok else "[red]FAIL[/red]"
            detail = "" if check.ok else escape((check.error.strip().splitlines() or [""])[-1])
            console.print(f"{mark} {problem.id} {escape('[' + check.dsl + ']')} {check.seconds:.1f} s {detail}",
                          highlight=False)

        checks = compile_references(variants, arch, progress=show_check)
        passed = sum(c.ok for _, c in checks)
        console.print(f"{passed}/{len(checks)} variants compile ({time.monotonic() - started:.0f} s)")
        raise typer.Exit(0 if passed == len(checks) else 1)
    try:
        known = read_ledger(ledger) if ledger.is_dir() else []
    except ValueError as exc:
        _fail(f"{exc}: fix or remove that line")
    if changed:
        gpu = device_name(dev)
        current = {d: versions(dev, d) for d in dsls}
        vouched = [(p, d) for p, d in variants if any(r.vouches_for(p.id, d, p.solution_sha256(d), gpu, current[d])
                                                      for r in known)]
        variants = [v for v in variants if v not in vouched]
        console.print(f"the ledger vouches for {len(vouched)} variant(s) on {gpu}; grading {len(variants)}",
                      highlight=False)
    target = record or ledger / record_name(device_name(dev))

    def show_row(row):
        mark = "[green]ok[/green]" if row.passed else "[red]FAIL[/red]"
        timing = f"{row.median_ms:.4f} ms, roofline {row.fraction_of_roofline:.0%}" \
            if row.median_ms and row.fraction_of_roofline else ""
        console.print(f"{mark} {row.problem} {escape('[' + row.dsl + ']')} {timing} {escape(row.reason)} "
                      f"({row.seconds or 0:.1f} s)", highlight=False)

    rows = grade_references(variants, dev, target, compile_baseline, progress=show_row) if variants else []
    passed = sum(r.passed for r in rows)
    console.print(f"{passed}/{len(rows)} variants pass ({time.monotonic() - started:.0f} s); records: "
                  f"{target if rows else 'none'}", highlight=False)
    raise typer.Exit(0 if passed == len(rows) else 1)


@app.command()
def run(model: str = typer.Option(..., help="openai:MODEL, anthropic:MODEL, replay:DIR, reference (offline); or an "
                                              "agent CLI run in a sandboxed workspace: claude-code:MODEL, "
                                              "codex:MODEL, command:CMD."),
        problems: Optional[str] = typer.Option(None, help="Comma-separated problems (default: all)."),
        families: Optional[str] = typer.Option(None, help="Comma-separated families (default: all)."),
        dsls: Optional[str] = typer.Option(None, help="Comma-separated DSLs (default: all)."),
        arms: str = typer.Option("solo,skill,placebo", help="Arms: solo, skill, placebo."),
        replicates: int = typer.Option(1, help="Replicates of every cell."),
        solo_control: bool = typer.Option(True, help="Add a second solo replicate (the noise floor)."),
        submissions: int = typer.Option(10, help="Budget: submissions per trial, every arm alike (default 10, the "
                                                 "published benchmark's)."),
        turns: Optional[int] = typer.Option(None, help="Budget: model turns per trial (default 40; command agents: "
                                                       "only where the agent takes a turn limit)."),
        output_tokens: Optional[int] = typer.Option(None, help="Budget: output tokens per trial (default 400000; "
                                                               "not for command agents)."),
        wall_s: float = typer.Option(2400.0, help="Budget: wall seconds per trial (default 2400, the published "
                                                  "benchmark's)."),
        temperature: Optional[float] = typer.Option(None),
        max_output_tokens: Optional[int] = typer.Option(None, help="Per answer (default 16384; not for command "
                                                                   "agents)."),
        reasoning_effort: Optional[str] = typer.Option(None), base_url: Optional[str] = typer.Option(None),
        agent_env: str = typer.Option("", help="Command agents only: comma-separated environment variables the "
                                               "agent gets (its own API key); it sees no other secret, and their "
                                               "values never reach the store."),
        regrades: int = typer.Option(2, help="Fresh gradings of each trial's chosen submission; their median is the "
                                             "trial's runtime (0: the grading that chose it)."),
        prices: Optional[Path] = typer.Option(None, help="JSON of extra model prices, USD per million tokens: "
                                                         '{"MODEL": {"input": 3, "cached_input": 0.3, "output": 15}}.'),
        max_cost: Optional[float] = typer.Option(None, help="Start no trial once the run has cost this many USD "
                                                            "(rerun with a higher limit to go on)."),
        replan: bool = typer.Option(False, help="Redo finished trials whose task changed since they ran (and the "
                                                "skill arms fed by them) instead of refusing to resume."),
        seed: int = typer.Option(0, help="Fixes placebo choices."),
        db: Path = typer.Option(Path("results/mkb.sqlite"), help="The results store (SQLite)."),
        run_id: str = typer.Option("main", help="Name of the run inside the store; rerun it to resume."),
        device: Optional[str] = typer.Option(
            None, help="Grading devices, one lane each: cuda:0,cuda:1 or cpu, or cpu,cpu for two CPU lanes on half "
                       "the CPUs each (default: every visible GPU, else cpu). With --executor ray: cuda (each lane on "
                       "the GPU Ray gives it) or cpu (its node's CPU; with --address local, cpu,cpu declares 2 GPUs)."),
        executor: str = typer.Option("local", help="Where grading runs: local (lanes on this machine) or ray (a lane "
                                                   "per GPU of a Ray cluster; the `ray` extra)."),
        address: Optional[str] = typer.Option(None, help="--executor ray: auto (the cluster this machine joined with "
                                                         "`ray start`; the default), local (a new one here) or "
                                                         "HOST:PORT."),
        concurrency: int = typer.Option(4, help="Trials in flight at once (they mostly wait on the model)."),
        dry_run: bool = typer.Option(False, help="Print the plan, its worst-case tokens, cost and wall time, and exit."),
        suite: Optional[Path] = SuiteOption) -> None:
    """Plan and run trials: solo in every DSL, then skill and placebo arms; resumable (rerun the same command).

    Default budgets per trial are the published benchmark's: 10 submissions and 2400 s of wall time (plus 40 turns
    and 400000 output tokens for chat models). A trial whose agent could not be set up ends as agent_error, makes
    the run exit non-zero and is retried on resume."""
    from metakernelbench.agent.clients import ClientError, Sampling, make_client, ping
    from metakernelbench.agent.command import preflight, run_command_trial
    from metakernelbench.agent.presets import agent_command, is_command_agent
    from metakernelbench.agent.reference import ReferenceClient
    from metakernelbench.agent.trial import run_trial as run_chat_trial
    from metakernelbench.agent.usage import PriceError, Prices
    from metakernelbench.protocol import Budget, PlanError, plan
    from metakernelbench.protocol.fingerprint import fingerprints, stale_trials
    from metakernelbench.protocol.runner import CostSpent, SetupFailed, execute
    from metakernelbench.store import Store, StoreError

    chosen, dsl_list = _problems(suite, problems), _dsls(dsls)
    if families:
        wanted = {f.strip() for f in families.split(",") if f.strip()}
        unknown = wanted - {p.family for p in chosen}
        if unknown:
            _fail(f"unknown or unselected famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(sorted(unknown))}: "
                  f"choose from {', '.join(sorted({p.family for p in chosen}))}")
        chosen = [p for p in chosen if p.family in wanted]
    if concurrency < 1:
        _fail(f"--concurrency must be at least 1, not {concurrency}")
    if max_cost is not None and max_cost <= 0:
        _fail(f"--max-cost {max_cost} spends nothing: pass a positive number of USD")
    try:
        price_table = Prices.with_file(prices)
    except PriceError as exc:
        _fail(str(exc))
    budget = Budget(submissions, 40 if turns is None else turns, 400_000 if output_tokens is None else output_tokens,
                    wall_s)
    sampling = Sampling(temperature, 16384 if max_output_tokens is None else max_output_tokens, reasoning_effort)
    env_keys = tuple(k.strip() for k in agent_env.split(",") if k.strip())
    agent = None
    if is_command_agent(model):
        try:
            agent = agent_command(model, budget, base_url=base_url, agent_env=env_keys, turns=turns,
                                  reasoning_effort=reasoning_effort, temperature=temperature,
                                  max_output_tokens=max_output_tokens, output_tokens=output_tokens)
        except ClientError as exc:
            _fail(str(exc))
        if agent.label != model:
            err.print("warning: the command line holds what looks like a key; it is redacted from every record, "
                      "but pass keys by name instead: export the variable and name it in --agent-env",
                      highlight=False, markup=False, soft_wrap=True)
    elif env_keys:
        _fail("--agent-env is for command agents (claude-code:, codex:, command:) only: drop it")
    elif model != "reference":
        try:
            make_client(model, sampling, base_url=base_url)
        except ClientError as exc:
            _fail(str(exc))
    label = agent.label if agent else model
    offline = model == "reference" or model.startswith("replay:")
    if executor not in ("local", "ray"):
        _fail(f"unknown --executor '{executor}': choose local or ray")
    if address is not None and executor != "ray":
        _fail("--address is for --executor ray: add --executor ray, or drop --address")
    if executor == "ray" and not _ray_devices(device, address):
        _fail(f"--device {device} with --executor ray: pass cuda (each lane grades on the GPU Ray gives it) or "
              "cpu; cpu,cpu (one lane per entry) only with --address local, whose cluster declares that many GPUs")
    on_cluster_gpus = executor == "ray" and not _cpu_lanes(device)
    on_cpu = not offline and not dry_run and not on_cluster_gpus and _require_gpu_or_cpu_consent(device, dsls)
    try:
        specs = plan(run_id, label, [p.id for p in chosen], dsl_list, [a.strip() for a in arms.split(",")],
                     replicates, budget, seed, solo_control, regrades)
    except PlanError as exc:
        _fail(str(exc))
    counts = {arm: sum(s.arm == arm for s in specs) for arm in ("solo", "skill", "placebo")}
    console.print(f"plan: {len(specs)} trials ({', '.join(f'{n} {a}' for a, n in counts.items() if n)}) of "
                  f"{label} on {len(chosen)} problems x {len(dsl_list)} DSLs; budget {budget}; {regrades} fresh "
                  "gradings score each trial", highlight=False, markup=False)
    if dry_run:
        _print_dry_run(specs, chosen, dsl_list, replicates, concurrency, agent, offline, sampling, model, price_table)
        return
    if on_cpu:
        err.print("warning: no GPU: grading TIRx on the CPU through LLVM; runtimes are CPU times, not GPU times",
                  highlight=False, markup=False, soft_wrap=True)
    if agent is not None:
        try:
            preflight(agent, db)
            if agent.api is not None:
                api_model, api_url, key_var = agent.api
                ping(make_client(api_model, Sampling(max_output_tokens=16), base_url=api_url, max_retries=2,
                                 api_key=os.environ[key_var], wire="responses" if agent.wire == "responses" else "chat"))
        except ClientError as exc:
            _fail(f"preflight: {exc}")
    elif not offline:
        try:
            ping(make_client(model, dataclasses.replace(sampling, max_output_tokens=16), base_url=base_url,
                             max_retries=2))
        except ClientError as exc:
            _fail(f"preflight: {exc}")
    from metakernelbench.execute import LaneFailed
    from metakernelbench.grader import GraderConfig

    config = {"model": label, "problems": [p.id for p in chosen], "dsls": dsl_list, "arms": arms,
              "replicates": replicates, "solo_control": solo_control, "budget": budget.__dict__,
              "sampling": sampling.__dict__, "seed": seed, "base_url": base_url, "regrades": regrades}
    by_id = {p.id: p for p in chosen}
    hashes = fingerprints(specs, by_id)
    lanes = _open_lanes(executor, address, device, GraderConfig(preload_dsls=tuple(dsl_list)))
    try:
        lane_info = lanes.lanes()
        try:
            store = Store(db)
            store.ensure_run(run_id, config, {**_lanes_environment(executor, lane_info), "agent_env": list(env_keys)})
        except StoreError as exc:
            _fail(str(exc))
        stale = stale_trials(store.trials(run_id), specs, hashes)
        if stale and not replan:
            store.close()
            first = next(s for s in specs if s.trial_id == stale[0])
            _fail(f"run '{run_id}' in {db} has {len(stale)} finished trials whose task changed since they ran "
                  f"(first: {first.problem} [{first.dsl}] {first.arm}): pass --replan to redo them, or a new --run-id")
        if stale:
            store.replan({t: hashes[t] for t in stale})
            console.print(f"replanned {len(stale)} trials whose task changed", highlight=False)

        def client_for(spec, problem):
            if agent is not None:
                return agent  # run_command_trial's "client" is the agent
            if model == "reference":
                return ReferenceClient(problem, spec.dsl, sampling)
            return make_client(model, sampling, base_url=base_url, prices=price_table)

        progress = _RunProgress(store, specs)

        def report(spec, outcome):
            mark = outcome if isinstance(outcome, str) else ("pass" if outcome.passed else "fail")
            progress.trial_ended(spec, f"{spec.trial_id} {spec.problem} [{spec.dsl}] {spec.arm} r{spec.replicate}: "
                                       f"{mark}")

        run_trial = run_chat_trial if agent is None else functools.partial(run_command_trial, prices=price_table)
        where = ", ".join(f"{lane.label} on {lane.host} (CPUs {_cpu_ranges(lane.cpus)})" for lane in lane_info)
        console.print(f"grading lanes ({executor}): {where}; up to {concurrency} trials in flight", highlight=False)
        try:
            with progress:
                execute(store, specs, by_id, client_for, lanes, sampling.__dict__, on_trial=report,
                        concurrency=concurrency, run_trial=run_trial, task_hashes=hashes, max_cost_usd=max_cost)
        except (SetupFailed, CostSpent) as exc:
            store.close()
            _print_status(db, run_id)
            _fail(str(exc), 3 if isinstance(exc, CostSpent) else 2)
        except LaneFailed as exc:
            _fail(f"{exc}; the trials it held are pending again: rerun the same command to resume")
        finally:
            store.close()
    finally:
        lanes.close()
    _print_status(db, run_id)


def _lanes_environment(executor: str, lanes) -> dict:
    """Where the run grades, for its record: the first lane's machine and versions, and every lane's place."""
    return {**lanes[0].environment, "executor": executor, "grading_devices": [lane.label for lane in lanes],
            "grading_lanes": [{"label": lane.label, "device": lane.device, "host": lane.host, "cpus": list(lane.cpus)}
                              for lane in lanes]}


def _cpu_lanes(device: Optional[str]) -> bool:
    return device is not None and {d.strip() for d in device.split(",") if d.strip()} == {"cpu"}


def _ray_devices(device: Optional[str], address: Optional[str]) -> bool:
    """With Ray a lane grades on the GPU Ray gives it (cuda, the default) or on its node's CPU (cpu); only a local
    cluster, which declares its GPUs itself, takes a count (cpu,cpu)."""
    entries = [d.strip() for d in device.split(",") if d.strip()] if device else []
    return entries in ([], ["cuda"]) or (_cpu_lanes(device) and (len(entries) == 1 or address == "local"))


def _cpu_ranges(cpus) -> str:
    """0-3,8 for (0, 1, 2, 3, 8)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _open_lanes(executor: str, address: Optional[str], device: Optional[str], config):
    """The run's grading lanes, started: on this machine, one per device, or on a Ray cluster, one per GPU (the
    --device values were checked for Ray before anything started)."""
    from metakernelbench.execute import GradingLanes, LaneFailed, local_devices

    entries = [d.strip() for d in device.split(",") if d.strip()] if device else []
    try:
        if executor == "local":
            return GradingLanes([_device(d) for d in entries] or local_devices(), config)
        from metakernelbench.execute.cluster import RayLanes

        on_cpu = _cpu_lanes(device)
        return RayLanes(address or "auto", config, on_cpu=on_cpu, local_gpus=len(entries) if on_cpu else None)
    except (LaneFailed, ValueError) as exc:
        _fail(str(exc))


def _require_gpu_or_cpu_consent(device: Optional[str], dsls: Optional[str]) -> bool:
    """A real model's trials on a machine without a GPU are graded on the CPU, where CuTe DSL cannot run and times
    are not GPU times: that takes an explicit --device cpu --dsls tirx. True when grading will be on the CPU."""
    import torch

    if torch.cuda.is_available():
        return False
    if not _cpu_lanes(device) or dsls is None or [d.strip() for d in dsls.split(",") if d.strip()] != ["tirx"]:
        _fail("no GPU here: a real model's trials would be graded on the CPU, where CuTe DSL cannot run; pass "
              "--device cpu --dsls tirx to run them there anyway")
    return True


def _print_dry_run(specs, chosen, dsl_list, replicates, concurrency, agent, offline, sampling, model,
                   price_table) -> None:
    from metakernelbench.analysis.power import no_transfer_lift_range, published_comparison
    from metakernelbench.protocol import worst_case
    from metakernelbench.task import task_statement

    cells = len({(s.source_dsl, s.dsl) for s in specs if s.arm != "solo"}) or len(dsl_list)
    noise = no_transfer_lift_range(len(chosen), replicates, cells)
    console.print(f"noise alone moves paired lift within ±{noise.half_width:.0f}% per model×direction cell "
                  f"({len(chosen)} problems x {replicates} replicate{'s' if replicates != 1 else ''}, {cells} "
                  f"cells: expected extremes {noise.cells_low:+.0f}%..{noise.cells_high:+.0f}%) "
                  f"(74-problem published range for comparison: {published_comparison()})", highlight=False)
    prompt = max((len(task_statement(p, d)) for p in chosen for d in dsl_list), default=0) // 4  # ~4 chars a token
    bounded = agent is None and not offline
    worst = worst_case(specs, concurrency, prompt, sampling.max_output_tokens if bounded else None,
                       price=price_table.price(model) if bounded else None)
    hours = f"{worst.wall_s:.0f} s ({worst.wall_s / 3600:.1f} h) at --concurrency {concurrency}, grading aside"
    if offline:
        tokens = "no model tokens (offline)"
    elif worst.output_tokens is None:
        tokens = "tokens and cost not bounded by mkb (the agent spends what it spends within its wall time)"
    else:
        cost = f"${worst.cost_usd:,.2f}" if worst.cost_usd is not None else "cost unknown (no price for the " \
                                                                              "model: pass --prices FILE)"
        tokens = f"{worst.input_tokens:,} input and {worst.output_tokens:,} output tokens, {cost} at list price"
    console.print(f"worst case: {tokens}; wall time {hours}", highlight=False, markup=False)
    table = Table("trial", "problem", "dsl", "arm", "source", "replicate")
    for s in specs:
        table.add_row(*(escape(v) for v in (s.trial_id, s.problem, s.dsl, s.arm, s.skill_problem or s.source_dsl
                                            or "", str(s.replicate))))
    console.print(table)


class _RunProgress:
    """A live line for a run: trials done, passes, output tokens and cost so far (trials end on their own threads)."""

    def __init__(self, store, specs) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.store = store
        self.lock = threading.Lock()
        self.ids = {s.trial_id for s in specs}
        rows = [t for t in store.trials(specs[0].run_id) if t.trial_id in self.ids] if specs else []
        self.done = sum(t.status in ("finished", "skipped") for t in rows)
        self.passed = sum(bool((t.result or {}).get("passed")) for t in rows)
        self.tokens = sum((t.usage or {}).get("output_tokens") or 0 for t in rows)
        self.costs = [t.usage.get("cost_usd") for t in rows if t.usage and "cost_usd" in t.usage]
        self.bar = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                            TimeElapsedColumn(), console=console, transient=False)
        self.task = self.bar.add_task(self._text(), total=len(self.ids), completed=self.done)

    def _text(self) -> str:
        return f"passed {self.passed} · output tokens {self.tokens:,} · cost {_money(self.costs)}"

    def trial_ended(self, spec, line: str) -> None:
        row = self.store.trial(spec.trial_id)
        with self.lock:
            self.done += 1
            self.passed += bool((row.result or {}).get("passed"))
            self.tokens += (row.usage or {}).get("output_tokens") or 0
            if row.usage and "cost_usd" in row.usage:
                self.costs.append(row.usage["cost_usd"])
            self.bar.console.print(line, highlight=False, markup=False)
            self.bar.update(self.task, completed=self.done, description=self._text())

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()


def _open_store(db: Path, fix: str = "run `mkb run` first or pass --db"):
    """The store at `db`, or one line naming the fix (no file, not a store, a newer schema)."""
    from metakernelbench.store import Store, StoreError

    if not db.is_file():
        _fail(f"no store at {db}: {fix}")
    try:
        return Store(db)
    except StoreError as exc:
        _fail(str(exc))


def _money(costs: list) -> str:
    """A sum of costs, 'n/a' when none is known, marked '≥' when some trials used a model without a price."""
    known = [c for c in costs if c is not None]
    if not known:
        return "n/a"
    return ("≥" if len(known) < len(costs) else "") + f"${sum(known):.2f}"


def _print_status(db: Path, run_id: Optional[str]) -> None:
    store = _open_store(db)
    columns = ("trials", "finished", "passed", "skipped", "agent_error", "running", "pending")
    table = Table("run", "arm", *columns, "input tokens", "output tokens", "cost")
    rows: dict = {}
    errors = []
    for t in store.trials(run_id):
        row = rows.setdefault((t.run_id, t.arm), {**{k: 0 for k in columns}, "input": 0, "output": 0, "costs": []})
        row["trials"] += 1
        row[t.status] += 1
        row["passed"] += bool(t.result and t.result.get("passed"))
        if t.usage:
            row["input"] += t.usage.get("input_tokens") or 0
            row["output"] += t.usage.get("output_tokens") or 0
            if "input_tokens" in t.usage or "cost_usd" in t.usage:
                row["costs"].append(t.usage.get("cost_usd"))
        if t.status == "agent_error":
            errors.append(t)
    for (run, arm), row in rows.items():
        table.add_row(escape(run), arm, *(str(row[k]) for k in columns), f"{row['input']:,}", f"{row['output']:,}",
                      _money(row["costs"]))
    console.print(table)
    for t in errors:
        console.print(f"agent_error {t.trial_id} {t.problem} [{t.dsl}] {t.arm}: {t.error}", highlight=False,
                      markup=False, soft_wrap=True)
    store.close()


@app.command()
def status(db: Path = typer.Option(Path("results/mkb.sqlite")), run_id: Optional[str] = None) -> None:
    """Trials per run and arm: finished, passed, skipped, agent_error (set-up failures, retried on resume),
    interrupted (running), pending; tokens and cost."""
    _print_status(db, run_id)


@app.command()
def trial(trial_id: str, db: Path = typer.Option(Path("results/mkb.sqlite")),
          files: bool = typer.Option(False, "--files", help="Also print the agent's whole output and its CLI's "
                                                            "conversation files.")) -> None:
    """A trial's readable transcript, its verdicts, its fresh gradings and its skill."""
    from metakernelbench.store import StoreError

    store = _open_store(db, "pass --db")
    try:
        row = store.trial(trial_id)
    except StoreError as exc:
        _fail(str(exc))
    console.print(f"{row.trial_id} {row.model} {row.problem} [{row.dsl}] {row.arm} r{row.replicate} ({row.status})",
                  highlight=False, markup=False, style="bold")
    if row.error:
        console.print(f"agent_error: {row.error}", highlight=False, markup=False)
    for role, content in store.transcript(trial_id):
        console.rule(role)
        print(content)
    console.rule("skill")
    print(row.skill or "(none)")
    for idx, submission, verdict in store.regrades(trial_id):
        runtime = (verdict.get("runtime") or {}).get("median_ms")
        console.print(f"fresh grading {idx + 1} of submission {submission}: "
                      f"{'passed' if verdict['passed'] else 'FAILED ' + str(verdict['failed_check'])}"
                      + (f", median {runtime:.4f} ms" if runtime else ""), highlight=False, markup=False)
    artifacts = store.artifacts(trial_id)
    for name, text, cut in artifacts:
        if files:
            console.rule(name, characters="=")
            print(text)
        else:
            console.print(f"file {name}: {len(text):,} characters{' (cut at the cap)' if cut else ''}",
                          highlight=False, markup=False)
    if artifacts and not files:
        console.print("(print them with --files)", highlight=False, markup=False)
    console.print(f"result: {json.dumps(row.result)}", highlight=False, markup=False)
    store.close()


@app.command()
def demo(problems: Optional[str] = typer.Option(None, help="Comma-separated problems (default: the demo set, "
                                                           "problems declaring DEMO = True)."),
         db: Path = typer.Option(Path("results/demo.sqlite"), help="The demo's store."),
         device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda if present)."),
         concurrency: int = typer.Option(2),
         regrades: int = typer.Option(2, help="Fresh gradings of each trial's chosen submission.")) -> None:
    """The whole protocol offline: the `reference` client submits the hidden reference solutions (solo in both
    DSLs, then skill and placebo arms), graded for real — on the GPU if there is one, else on the CPU, where TIRx runs
    through LLVM and CuTe DSL, which cannot launch without a GPU, fails. Writes the store and a summary beside it."""
    from metakernelbench.analysis import summarise
    from metakernelbench.store import Store

    if not problems:  # the demo set: problems that declare DEMO = True (their TIRx references also run on a CPU)
        problems = ",".join(p.id for p in _problems(None) if getattr(p.module, "DEMO", False))
    if regrades < 0:
        _fail(f"--regrades is {regrades}: pass 0 or more")
    run(model="reference", problems=problems, families=None, dsls=None, arms="solo,skill,placebo", replicates=1,
        solo_control=True, submissions=10, turns=None, output_tokens=None, wall_s=2400.0, temperature=None,
        max_output_tokens=None, reasoning_effort=None, base_url=None, agent_env="", regrades=regrades, prices=None,
        max_cost=None, replan=False, seed=0, db=db, run_id="demo", device=device, executor="local", address=None,
        concurrency=concurrency, dry_run=False, suite=None)
    store = Store(db)
    text = summarise(store, "demo")
    store.close()
    summary = db.with_name(f"{db.stem}-summary.md")
    summary.write_text(text)
    print(text)
    console.print(f"store: {db}  summary: {summary}", highlight=False)


@app.command("export")
def export_store(db: Path = typer.Option(Path("results/mkb.sqlite")),
                 out: Path = typer.Option(Path("results/export"), help="Folder for the exported files."),
                 fmt: str = typer.Option("jsonl", "--format", help="jsonl or parquet.")) -> None:
    """Export trials, submissions and transcripts (with legend.json) for analysis elsewhere."""
    from metakernelbench.store.export import export

    store = _open_store(db, "pass --db")
    try:
        paths = export(store, out, fmt)
    except ValueError as exc:
        _fail(str(exc))
    finally:
        store.close()
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)


@app.command("report")
def report_cmd(db: Path = typer.Option(Path("results/mkb.sqlite"), help="The results store (SQLite)."),
               run_id: Optional[str] = typer.Option(None, help="The run to report (default: every run in the store)."),
               out: Path = typer.Option(Path("results/report"),
                                        help="Folder for report.json/.md/.html and plots."),
               min_margin: float = typer.Option(0.0, help="Floor of the relative tie margin of every comparison "
                                                "(0.3: times within 30% are ties); see the report's identical-code "
                                                "table for what this machine needs.")) -> None:
    """Full report of a run: ladders, paired statistics against the noise floor, relative standing and plots."""
    from metakernelbench.analysis.report import ReportError, report_store

    if not 0 <= min_margin < 100:
        _fail(f"--min-margin {min_margin} is not a relative margin: pass a number from 0 (the timing spread "
              "alone) up, e.g. 0.3")
    store = _open_store(db)
    try:
        report = report_store(store, out, run_id, min_margin=min_margin)
    except (ReportError, ValueError) as exc:  # ValueError: an incomplete trial result (metrics.compare names it)
        _fail(str(exc))
    finally:
        store.close()
    for note in report["notes"]:
        err.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"wrote {out / 'report.json'}, {out / 'report.md'}, {out / 'report.html'} and "
                  f"{len(report['plots'])} plots", highlight=False)


@app.command()
def legend() -> None:
    """Print the meaning of every field of a verdict."""
    from metakernelbench.grader import VERDICT_LEGEND

    for key, meaning in VERDICT_LEGEND.items():
        console.print(f"[bold]{key}[/bold]: {meaning}", highlight=False)
