"""The newest committed H200 validation record vouches for the reference solutions as committed: every variant of
the suite graded and passed on the GPU with every isolation check on, and each file's hash is today's. A reference
changed without a new GPU record fails here."""
import hashlib
import json
import re
from pathlib import Path

from metakernelbench.dsl import DSL_NAMES
from metakernelbench.suite import load_suite

VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def newest_record() -> dict:
    full = sorted(p for p in VALIDATION.glob("h200-*.json") if re.fullmatch(r"h200-\d{4}-\d{2}-\d{2}\.json", p.name))
    assert full, "no full validation record (validation/h200-YYYY-MM-DD.json)"
    return json.loads(full[-1].read_text())


def test_newest_record_grades_every_variant_on_the_gpu():
    record = newest_record()
    assert record["mode"] == "grade" and record["environment"]["device"] == "cuda"
    graded = {(row["problem"], row["dsl"]) for row in record["variants"]}
    assert graded == {(p.id, dsl) for p in load_suite() for dsl in DSL_NAMES}
    assert record["summary"]["passed"] == record["summary"]["total"] == len(graded)


def test_newest_record_passed_with_every_isolation_check_on():
    for row in newest_record()["variants"]:
        verdict = row["verdict"]
        assert row["passed"] and verdict["passed"], row["problem"]
        isolation = verdict["checks"]["isolation"]
        assert isolation["passed"] and set(isolation["detail"].values()) == {"on"}, (row["problem"], isolation)


def test_newest_record_hashes_match_the_committed_references():
    problems = {p.id: p for p in load_suite()}
    for row in newest_record()["variants"]:
        path = problems[row["problem"]].solution_path(row["dsl"])
        assert hashlib.sha256(path.read_bytes()).hexdigest() == row["verdict"]["file_sha256"], (
            f"{path} changed since the newest validation record: re-run `mkb validate --out "
            f"validation/h200-DATE.json` on a GPU")
