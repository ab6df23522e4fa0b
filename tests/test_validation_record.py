"""The ledger vouches for every committed reference solution: each variant's graded file (kit inlined), by its
current sha256, has a record of passing the grader on an H200 with every isolation check on — or it is listed, at that
same sha256, in validation/awaiting-gpu.json (committed without a GPU, said so, and shown by `mkb list`). A reference
or kit edited without either fails here: run `mkb validate --changed` on an H200 and commit the record it writes."""
import json
from pathlib import Path

import pytest

from metakernelbench.dsl import dsl_names
from metakernelbench.grader.validation import LedgerRecord, read_awaiting, read_ledger, record_name
from metakernelbench.suite import load_suite

LEDGER = Path(__file__).resolve().parents[1] / "validation" / "ledger"
AWAITING = read_awaiting(LEDGER.parent / "awaiting-gpu.json")
VARIANTS = [(p, d) for p in load_suite() for d in dsl_names() if p.solution_path(d).is_file()]


@pytest.fixture(scope="module")
def ledger():
    return read_ledger(LEDGER)


@pytest.mark.parametrize("problem,dsl", VARIANTS, ids=[f"{p.number:02d}-{d}" for p, d in VARIANTS])
def test_a_passing_h200_record_vouches_for_the_graded_reference(ledger, problem, dsl):
    sha = problem.solution_sha256(dsl)
    vouching = [r for r in ledger if r.vouches_for(problem.id, dsl, sha, "H200")]
    listed = AWAITING.get((problem.id, dsl))
    if listed is not None:
        assert not vouching, f"{problem.id} [{dsl}] has its H200 record now: drop it from awaiting-gpu.json"
        assert listed["sha256"] == sha, (f"{problem.id} [{dsl}] changed since it was listed as awaiting the GPU "
                                         "(sha256 differs): validate it, or list the new hash deliberately")
        return
    assert vouching, (f"no passing H200 record for {problem.id} [{dsl}] at sha256 {sha[:12]}: run "
                      f"`mkb validate --changed` on an H200 and commit the record")
    for record in vouching:
        isolation = record.verdict["checks"]["isolation"]
        assert isolation["passed"] and set(isolation["detail"].values()) == {"on"}, (problem.id, dsl, isolation)
        assert record.verdict["file_sha256"] == sha and record.verdict["device"].endswith(f"({record.gpu})")


def test_ledger_lines_are_whole_records(tmp_path):
    row = {field: None for field in LedgerRecord.__dataclass_fields__}
    (tmp_path / "a.jsonl").write_text(json.dumps(row) + "\n\n")
    assert len(read_ledger(tmp_path)) == 1
    (tmp_path / "b.jsonl").write_text(json.dumps({"problem": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"b\.jsonl:1: not a ledger record"):
        read_ledger(tmp_path)


def test_record_names_say_gpu_and_time():
    name = record_name("NVIDIA H200")
    assert name.startswith("h200-20") and name.endswith(".jsonl")


def test_the_awaiting_list_names_only_references_of_the_suite():
    variants = {(p.id, d) for p, d in VARIANTS}
    assert set(AWAITING) <= variants, sorted(set(AWAITING) - variants)
    assert all(entry["why"] for entry in AWAITING.values())
