"""The runbooks travel with the package: `pip wheel` builds a wheel holding
fleetscope/runbooks/<rule id>.md, and in a fresh virtualenv with that wheel installed (no
checkout anywhere near) a finding's runbook opens: `runbook_path` names the installed file and
`fleetscope runbook RULE` prints it. Offline: the wheel is built without build isolation
and installed without its dependencies, which the venv sees from this Python's site-packages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from fleetscope.rules.catalog import RULE_IDS
from tests.conftest import SCENARIOS

REPO = Path(__file__).resolve().parent.parent


def _source_copy(dest: Path) -> Path:
    """The checkout's tracked and new files (not build output), where pip may write."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        source = REPO / name
        if source.is_file() and not name.startswith("tests/fixtures/"):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_a_wheel_install_opens_the_runbook_a_finding_names(tmp_path):
    source = _source_copy(tmp_path / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w",
                            str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("fleetscope-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(n).stem for n in archive.namelist()
                   if n.startswith("fleetscope/runbooks/") and n.endswith(".md")}
    assert set(RULE_IDS) <= shipped

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    python, command = venv / "bin" / "python", venv / "bin" / "fleetscope"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"  # no checkout in the working directory
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import fleetscope; print(fleetscope.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    result = subprocess.run([str(command), "diagnose", "--bundle",
                             str(SCENARIOS / "fd-exhaustion"), "--json"], cwd=elsewhere,
                            capture_output=True, text=True, timeout=300)
    finding = json.loads(result.stdout)["findings"][0]
    assert finding["runbook"] == f"runbooks/{finding['rule']}.md"  # unchanged, beside it:
    path = Path(finding["runbook_path"])
    assert path.is_relative_to(venv) and path.is_file()
    text = path.read_text(encoding="utf-8")
    assert text == (REPO / finding["runbook"]).read_text(encoding="utf-8")
    printed = subprocess.run([str(command), "runbook", finding["rule"]], cwd=elsewhere,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and printed.stdout == text
