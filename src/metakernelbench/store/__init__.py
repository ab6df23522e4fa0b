"""The results store: one SQLite file (WAL) is the source of truth for runs, trials, submissions, transcripts, skills.

Every state change of a trial is one transaction, so a process killed at any moment leaves each trial either
finished (never redone), or unfinished (restarted from scratch on resume, its partial rows removed first). A trial
whose agent could not be set up ends as `agent_error` with its cause: no result, retried on resume.
Trial threads share one store: a lock serialises every transaction and read on its one connection.
Stores written by schema 1 are migrated in place when opened (added columns and tables only).
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from metakernelbench.protocol import TrialSpec

SCHEMA_VERSION = 2
# What schema 2 added to schema 1: the task fingerprint and agent_error cause of a trial, the agent's whole output
# and its CLI's conversation files (compressed), and the fresh gradings of each trial's chosen submission.
_ADDED_IN_2 = (
    "ALTER TABLE trials ADD COLUMN task_hash TEXT",
    "ALTER TABLE trials ADD COLUMN error TEXT",
    "CREATE TABLE IF NOT EXISTS artifacts (trial_id TEXT NOT NULL REFERENCES trials(trial_id), name TEXT NOT NULL, "
    "data BLOB NOT NULL, chars INTEGER NOT NULL, truncated INTEGER NOT NULL, PRIMARY KEY (trial_id, name))",
    "CREATE TABLE IF NOT EXISTS regrades (trial_id TEXT NOT NULL REFERENCES trials(trial_id), idx INTEGER NOT NULL, "
    "submission INTEGER NOT NULL, verdict TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (trial_id, idx))",
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, created REAL NOT NULL, config TEXT NOT NULL,
    environment TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (trial_id TEXT PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs(run_id),
    model TEXT NOT NULL, problem TEXT NOT NULL, dsl TEXT NOT NULL, arm TEXT NOT NULL, replicate INTEGER NOT NULL,
    source_dsl TEXT, skill_problem TEXT, spec TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL,
    started REAL, finished REAL, result TEXT, skill TEXT, skill_audit TEXT, usage TEXT, sampling TEXT,
    task_hash TEXT, error TEXT);
CREATE TABLE IF NOT EXISTS submissions (trial_id TEXT NOT NULL REFERENCES trials(trial_id), idx INTEGER NOT NULL,
    code TEXT NOT NULL, verdict TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (trial_id, idx));
CREATE TABLE IF NOT EXISTS messages (trial_id TEXT NOT NULL REFERENCES trials(trial_id), idx INTEGER NOT NULL,
    role TEXT NOT NULL, content TEXT NOT NULL, usage TEXT, created REAL NOT NULL, PRIMARY KEY (trial_id, idx));
""" + "".join(f"{statement};\n" for statement in _ADDED_IN_2[2:])
STATUSES = ("pending", "running", "finished", "skipped", "agent_error")


class StoreError(Exception):
    """A store that cannot be used as asked; the message names the fix."""


@dataclass(frozen=True)
class TrialRow:
    trial_id: str
    run_id: str
    model: str
    problem: str
    dsl: str
    arm: str
    replicate: int
    source_dsl: str | None
    skill_problem: str | None
    status: str
    attempts: int
    result: dict | None
    skill: str | None
    skill_audit: dict | None
    usage: dict | None
    task_hash: str | None = None
    error: str | None = None  # why an agent_error trial's agent could not be set up


class Store:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection for every thread; `_lock` keeps one thread at a time on it (sqlite3 objects are not
        # safe for concurrent use, and a second BEGIN inside another thread's transaction would fail).
        self._lock = threading.Lock()
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
        try:
            self._open()
        except sqlite3.DatabaseError as exc:  # a file that is not SQLite at all, or a damaged one
            self.db.close()
            raise StoreError(f"{self.path} is not a MetaKernelBench store ({exc}): pass a new --db path") from None

    def _open(self) -> None:
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA synchronous=NORMAL")
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "meta" not in tables:
            raise StoreError(f"{self.path} is not a MetaKernelBench store: pass a new --db path")
        if not tables:
            self.db.executescript(_SCHEMA)
        with self._transaction():
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) == 1:
                for statement in _ADDED_IN_2:
                    self.db.execute(statement)
                self.db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(f"{self.path} has store schema {row[0]}, this version reads {SCHEMA_VERSION}: "
                                 "use a new --db path or the matching MetaKernelBench version")

    @contextlib.contextmanager
    def _transaction(self):
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def _read(self, query: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self.db.execute(query, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self.db.close()

    # -- runs and trials --------------------------------------------------------------------------------------
    def ensure_run(self, run_id: str, config: dict, environment: dict) -> None:
        """Record a run once; a rerun with the same id must carry the same configuration."""
        with self._transaction():
            row = self.db.execute("SELECT config FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                self.db.execute("INSERT INTO runs VALUES (?, ?, ?, ?)", (run_id, time.time(), json.dumps(
                    config, sort_keys=True), json.dumps(environment, sort_keys=True)))
            elif json.loads(row[0]) != json.loads(json.dumps(config, sort_keys=True)):
                raise StoreError(f"run '{run_id}' already exists in {self.path} with another configuration: "
                                 "resume it with the same options or pick a new --run-id")

    def add_trials(self, specs: list[TrialSpec], task_hashes: dict[str, str] | None = None) -> None:
        """Record planned trials once; `task_hashes` (trial id to task fingerprint) marks what each will be shown."""
        hashes = task_hashes or {}
        with self._transaction():
            self.db.executemany(
                "INSERT OR IGNORE INTO trials (trial_id, run_id, model, problem, dsl, arm, replicate, source_dsl, "
                "skill_problem, spec, status, attempts, task_hash) VALUES (?,?,?,?,?,?,?,?,?,?, 'pending', 0, ?)",
                [(s.trial_id, s.run_id, s.model, s.problem, s.dsl, s.arm, s.replicate, s.source_dsl,
                  s.skill_problem, json.dumps(asdict(s)), hashes.get(s.trial_id)) for s in specs])

    def start_trial(self, trial_id: str, sampling: dict, task_hash: str | None = None) -> bool:
        """Claim a trial for running. False when it already finished or was skipped. An interrupted trial (killed
        while running) or one whose agent could not be set up (agent_error) loses its partial transcript,
        submissions and files and starts over. `task_hash` records the task it is now shown."""
        with self._transaction():
            (status,) = self.db.execute("SELECT status FROM trials WHERE trial_id=?", (trial_id,)).fetchone()
            if status in ("finished", "skipped"):
                return False
            self._clear(trial_id)
            self.db.execute("UPDATE trials SET status='running', attempts=attempts+1, started=?, sampling=?, "
                            "error=NULL, task_hash=COALESCE(?, task_hash) WHERE trial_id=?",
                            (time.time(), json.dumps(sampling), task_hash, trial_id))
        return True

    def _clear(self, trial_id: str) -> None:
        for table in ("submissions", "messages", "artifacts", "regrades"):
            self.db.execute(f"DELETE FROM {table} WHERE trial_id=?", (trial_id,))

    def fail_setup(self, trial_id: str, cause: str, usage: dict | None = None) -> None:
        """End a trial as agent_error: its agent never really attempted the task, so it has no result, counts in
        no metric, and is retried on resume."""
        with self._transaction():
            self.db.execute("UPDATE trials SET status='agent_error', finished=?, result=NULL, skill=NULL, "
                            "skill_audit=NULL, usage=?, error=? WHERE trial_id=?",
                            (time.time(), json.dumps(usage) if usage else None, cause, trial_id))

    def release_trial(self, trial_id: str) -> None:
        """Hand back a trial that the harness itself failed in: pending again, restarted from scratch on resume."""
        with self._transaction():
            self.db.execute("UPDATE trials SET status='pending' WHERE trial_id=? AND status='running'", (trial_id,))

    def replan(self, task_hashes: dict[str, str]) -> None:
        """Forget what the given trials did, whatever their status, and mark each with its new task fingerprint."""
        with self._transaction():
            for trial_id, task_hash in task_hashes.items():
                self._clear(trial_id)
                self.db.execute("UPDATE trials SET status='pending', finished=NULL, result=NULL, skill=NULL, "
                                "skill_audit=NULL, usage=NULL, error=NULL, task_hash=? WHERE trial_id=?",
                                (task_hash, trial_id))

    def add_message(self, trial_id: str, idx: int, role: str, content: str, usage: dict | None = None) -> None:
        with self._transaction():
            self.db.execute("INSERT INTO messages VALUES (?,?,?,?,?,?)",
                            (trial_id, idx, role, content, json.dumps(usage) if usage else None, time.time()))

    def add_submission(self, trial_id: str, idx: int, code: str, verdict: dict) -> None:
        with self._transaction():
            self.db.execute("INSERT INTO submissions VALUES (?,?,?,?,?)",
                            (trial_id, idx, code, json.dumps(verdict), time.time()))

    def add_artifact(self, trial_id: str, name: str, text: str, truncated: bool = False) -> None:
        """Keep a whole text the agent left (its output, its CLI's conversation file), compressed."""
        with self._transaction():
            self.db.execute("INSERT OR REPLACE INTO artifacts VALUES (?,?,?,?,?)",
                            (trial_id, name, zlib.compress(text.encode(), 6), len(text), int(truncated)))

    def add_regrade(self, trial_id: str, idx: int, submission: int, verdict: dict) -> None:
        with self._transaction():
            self.db.execute("INSERT INTO regrades VALUES (?,?,?,?,?)",
                            (trial_id, idx, submission, json.dumps(verdict), time.time()))

    def finish_trial(self, trial_id: str, result: dict, skill: str | None, skill_audit: dict | None,
                     usage: dict) -> None:
        with self._transaction():
            self.db.execute("UPDATE trials SET status='finished', finished=?, result=?, skill=?, skill_audit=?, "
                            "usage=?, error=NULL WHERE trial_id=?", (time.time(), json.dumps(result), skill,
                                                         json.dumps(skill_audit), json.dumps(usage), trial_id))

    def skip_trial(self, trial_id: str, reason: str) -> None:
        with self._transaction():
            self.db.execute("UPDATE trials SET status='skipped', finished=?, result=? WHERE trial_id=?",
                            (time.time(), json.dumps({"skipped": reason}), trial_id))

    # -- reading ------------------------------------------------------------------------------------------------
    def trials(self, run_id: str | None = None) -> list[TrialRow]:
        query = ("SELECT trial_id, run_id, model, problem, dsl, arm, replicate, source_dsl, skill_problem, status, "
                 "attempts, result, skill, skill_audit, usage, task_hash, error FROM trials")
        rows = self._read(query + (" WHERE run_id=?" if run_id else "") + " ORDER BY rowid",
                          (run_id,) if run_id else ())
        load = lambda v: json.loads(v) if v else None  # noqa: E731
        return [TrialRow(*r[:11], load(r[11]), r[12], load(r[13]), load(r[14]), r[15], r[16]) for r in rows]

    def trial(self, trial_id: str) -> TrialRow:
        rows = [t for t in self.trials() if t.trial_id == trial_id]
        if not rows:
            raise StoreError(f"no trial '{trial_id}' in {self.path}: see `mkb status --db {self.path}`")
        return rows[0]

    def find_solo(self, run_id: str, model: str, problem: str, dsl: str, replicate: int) -> TrialRow | None:
        for t in self.trials(run_id):
            if (t.model, t.problem, t.dsl, t.arm, t.replicate) == (model, problem, dsl, "solo", replicate):
                return t
        return None

    def transcript(self, trial_id: str) -> list[tuple[str, str]]:
        return self._read("SELECT role, content FROM messages WHERE trial_id=? ORDER BY idx", (trial_id,))

    def artifacts(self, trial_id: str) -> list[tuple[str, str, bool]]:
        """(name, text, truncated) of every whole text kept for a trial."""
        rows = self._read("SELECT name, data, truncated FROM artifacts WHERE trial_id=? ORDER BY name", (trial_id,))
        return [(name, zlib.decompress(data).decode(errors="replace"), bool(cut)) for name, data, cut in rows]

    def regrades(self, trial_id: str) -> list[tuple[int, int, dict]]:
        """(index, submission graded, verdict) of every fresh grading of a trial's chosen submission."""
        rows = self._read("SELECT idx, submission, verdict FROM regrades WHERE trial_id=? ORDER BY idx", (trial_id,))
        return [(i, s, json.loads(v)) for i, s, v in rows]

    def spent_usd(self, run_id: str) -> float:
        """What the run's trials have cost so far, as their clients or our price table reported it."""
        ((spent,),) = self._read("SELECT COALESCE(SUM(json_extract(usage, '$.cost_usd')), 0) FROM trials "
                                 "WHERE run_id=?", (run_id,))
        return float(spent)

    def submissions(self, trial_id: str) -> list[tuple[int, str, dict]]:
        rows = self._read("SELECT idx, code, verdict FROM submissions WHERE trial_id=? ORDER BY idx", (trial_id,))
        return [(i, c, json.loads(v)) for i, c, v in rows]

    def submission_outcomes(self, run_id: str | None = None) -> dict[str, list[dict]]:
        """compiled / passed / speedup_vs_eager, file_sha256, median_ms and spread of every submission, per trial in
        submission order; read inside SQLite, since whole verdicts of a large run would take long to parse."""
        fields = ("compiled", "passed", "speedup_vs_eager", "file_sha256", "runtime.median_ms", "runtime.spread")
        query = ("SELECT s.trial_id, " + ", ".join(f"json_extract(s.verdict, '$.{f}')" for f in fields)
                 + " FROM submissions s JOIN trials t USING (trial_id)"
                 + (" WHERE t.run_id=?" if run_id else "") + " ORDER BY s.trial_id, s.idx")
        outcomes: dict[str, list[dict]] = {}
        rows = self._read(query, (run_id,) if run_id else ())
        for trial_id, compiled, passed, speedup, sha, median_ms, spread in rows:
            outcomes.setdefault(trial_id, []).append({"compiled": bool(compiled), "passed": bool(passed),
                                                      "speedup_vs_eager": speedup, "file_sha256": sha,
                                                      "median_ms": median_ms, "spread": spread})
        return outcomes

    def runs(self) -> list[tuple[str, dict]]:
        return [(r, json.loads(c)) for r, c in self._read("SELECT run_id, config FROM runs ORDER BY created")]
