"""One DSL = one adapter file + one registry row: a fake third DSL, installed from the test folder as a package with
an entry point, is listed, posed, planned and graded without editing anything else in the benchmark."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metakernelbench.dsl import dsl_names, foreign_roots, get_adapter, other_kernel_languages

FAKE = Path(__file__).resolve().parent / "fake_dsl"


def mkb(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_built_in_dsls_come_from_the_registry_alone():
    assert dsl_names()[:2] == ("cute", "tirx")
    assert "cutlass" in foreign_roots("tirx") and "tvm_tirx" in foreign_roots("cute")
    assert "triton" in foreign_roots("cute") and "cutlass" not in foreign_roots("cute")
    assert other_kernel_languages("cute") == ["torch.compile", "Apache TVM TIRx", "Triton", "CUDA C++", "CUDA graphs"]
    assert get_adapter("tirx").title not in other_kernel_languages("tirx")


def test_a_third_dsl_plugs_in_through_its_entry_point(tmp_path):
    listed = mkb("dsls")
    assert listed.returncode == 0, listed.stderr
    assert "fake" in listed.stdout and "Fake DSL" in listed.stdout and "0.1" in listed.stdout

    statement = mkb("show", "28", "--dsl", "fake")
    assert statement.returncode == 0, statement.stderr
    assert "written in Fake DSL" in statement.stdout and "`@fakedsl.kernel`" in statement.stdout
    assert "(torch.compile, NVIDIA CuTe DSL, Apache TVM TIRx, Triton, CUDA C++, CUDA graphs)" in statement.stdout

    # the other DSLs' variants now forbid the plugin's package too
    probe = ("from metakernelbench.dsl import foreign_roots, other_kernel_languages; "
             "print(foreign_roots('tirx')); print(other_kernel_languages('tirx'))")
    env = {**os.environ, "PYTHONPATH": str(FAKE)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env).stdout
    assert "'fakedsl'" in out and "Fake DSL" in out

    plan = mkb("run", "--model", "reference", "--problems", "28", "--dsls", "fake,tirx", "--arms", "solo,skill",
               "--dry-run", "--db", str(tmp_path / "plan.sqlite"))
    assert plan.returncode == 0, plan.stderr
    assert " fake " in plan.stdout and "skill" in plan.stdout

    graded = mkb("grade", "28", str(FAKE / "rmsnorm_fake.py"), "--dsl", "fake", "--device", "cpu", "--json")
    verdict = json.loads(graded.stdout)
    assert graded.returncode == 0 and verdict["passed"], (verdict["failed_check"], verdict["reason"])
    assert verdict["checks"]["ghost_replay"]["passed"]

    borrowed = tmp_path / "borrowed.py"
    borrowed.write_text("import tvm_tirx\n" + (FAKE / "rmsnorm_fake.py").read_text())
    refused = json.loads(mkb("grade", "28", str(borrowed), "--dsl", "fake", "--device", "cpu", "--json").stdout)
    assert refused["failed_check"] == "static_rules" and "tvm_tirx" in refused["reason"]


def test_an_unknown_dsl_names_the_registered_ones():
    done = mkb("show", "28", "--dsl", "nosuch")
    assert done.returncode == 2 and "choose from cute, tirx" in done.stderr


@pytest.mark.parametrize("dsl", ["cute", "tirx"])
def test_adapters_know_their_distributions(dsl):
    assert set(get_adapter(dsl).versions()) == set(get_adapter(dsl).distributions)


def test_tirx_finds_its_cuda_toolkit_before_the_child_may_not_start_programs(monkeypatch):
    """TIRx's NVRTC build finds the CUDA headers by running `which nvcc` unless CUDA_PATH is set, and the graded
    child may not start programs: the fork server's preload resolves it first."""
    import shutil

    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc on PATH")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    get_adapter("tirx").preload()
    assert Path(os.environ["CUDA_PATH"], "bin", "nvcc").resolve() == Path(nvcc).resolve()


def test_a_dsl_installed_outside_site_packages_with_its_native_runtime_beside_it(tmp_path):
    """As on a GPU machine without a package registry: the DSL unpacked into a folder on PYTHONPATH, its native
    runtime in a sibling folder of its Python package. Its lazy relative imports and that library are the DSL's,
    not the submission's."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(FAKE, site)
    with open("/proc/self/maps") as maps:
        libm = next(line.split()[-1] for line in maps if "/libm.so" in line or "/libm-" in line)
    (site / "fakedsl_runtime").mkdir()
    shutil.copy(libm, site / "fakedsl_runtime" / "libruntime.so")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    graded = subprocess.run([sys.executable, "-m", "metakernelbench", "grade", "28", str(site / "rmsnorm_fake.py"),
                             "--dsl", "fake", "--device", "cpu", "--json"], capture_output=True, text=True, env=env,
                            timeout=600)
    verdict = json.loads(graded.stdout)
    assert verdict["passed"], (verdict["failed_check"], verdict["reason"])
