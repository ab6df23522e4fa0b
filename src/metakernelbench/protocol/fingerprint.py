"""Task fingerprints: a hash of everything that decides what a trial is shown and how it is graded (the task
statement, the problem module, the DSL guide and the grader's source), so a resumed run can tell whether a finished
trial attempted the task the run would pose now."""
from __future__ import annotations

import hashlib
from pathlib import Path

import metakernelbench
from metakernelbench.dsl import get_adapter
from metakernelbench.task import task_statement

GRADER_SOURCE = Path(metakernelbench.__file__).resolve().parent / "grader"


def grader_version() -> str:
    """A hash of the grader package's source: any change to how submissions are judged changes it."""
    digest = hashlib.sha256()
    for path in sorted(GRADER_SOURCE.rglob("*.py")):
        digest.update(path.relative_to(GRADER_SOURCE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def task_fingerprint(problem, dsl: str, grader: str | None = None) -> str:
    """The fingerprint of one variant's task; pass `grader` (grader_version()) when hashing many variants."""
    parts = (task_statement(problem, dsl), Path(problem.path).read_text(), get_adapter(dsl).guide(),
             grader or grader_version())
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part.encode()).digest())
    return digest.hexdigest()[:32]


def fingerprints(specs, problems: dict) -> dict[str, str]:
    """Trial id to task fingerprint for every planned trial (`problems` maps problem id to Problem)."""
    grader, by_variant = grader_version(), {}
    for spec in specs:
        if (spec.problem, spec.dsl) not in by_variant:
            by_variant[spec.problem, spec.dsl] = task_fingerprint(problems[spec.problem], spec.dsl, grader)
    return {spec.trial_id: by_variant[spec.problem, spec.dsl] for spec in specs}


def stale_trials(rows, specs, hashes: dict[str, str]) -> list[str]:
    """Ids of the recorded trials whose task changed since they ran (finished with another fingerprint), followed
    by the skill and placebo trials that were handed a changed solo's skill (or skipped for want of it).
    Trials recorded before fingerprints existed carry none and are not judged."""
    by_id = {row.trial_id: row for row in rows}
    changed = {s.trial_id for s in specs if (row := by_id.get(s.trial_id)) is not None
               and row.status == "finished" and row.task_hash and row.task_hash != hashes[s.trial_id]}
    solos = {(s.problem, s.dsl, s.replicate) for s in specs if s.trial_id in changed and s.arm == "solo"}
    dependents = [s.trial_id for s in specs if s.arm != "solo" and s.skill_source() in solos
                  and s.trial_id not in changed and by_id.get(s.trial_id) is not None
                  and by_id[s.trial_id].status in ("finished", "skipped")]
    return [s.trial_id for s in specs if s.trial_id in changed] + dependents
