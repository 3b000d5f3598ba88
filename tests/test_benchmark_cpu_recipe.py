"""The CPU recipe benchmark: its reference loop is the documented command, and its predictions
are the measured rate carried to each type's reference loop."""

import re

import pytest

from scripts import benchmark_cpu_recipe as bench
from tests.run_helpers import REPO, TINY


def test_the_reference_loop_is_the_command_the_results_page_gives() -> None:
    page = (REPO / "docs" / "results.md").read_text()
    assert f'python -c "{bench.REFERENCE}"' in page


def test_a_recipe_is_timed_whole_and_carried_to_each_type_by_its_reference(capsys) -> None:
    tiny = ",".join([*TINY, "token_budget=20000", "trainer.max_steps=1000"])
    bench.main(["--recipe", f"tiny={tiny}", "--reference-repeats", "1"])
    out = capsys.readouterr().out
    reference = float(re.search(r"reference loop here: ([\d.]+) s", out).group(1))
    row = next(line for line in out.splitlines() if line.startswith("| tiny |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    tokens, seconds, rate = int(cells[1].replace(",", "")), float(cells[3]), float(cells[4])
    assert tokens >= 20000 and 0.5 < seconds < 300 and float(cells[2]) < 6.0
    # The table rounds seconds to whole ones and rates to hundredths: check within those roundings.
    per_second = 1 / (tokens / 1e6) / reference
    assert (seconds - 0.5) * per_second - 0.005 <= rate <= (seconds + 0.5) * per_second + 0.005
    for cpu, predicted in zip(bench.CPU_TYPES, cells[5:], strict=True):
        scale = cpu.reference_s * tokens / 1e6
        assert (rate - 0.005) * scale - 0.5 <= float(predicted) <= (rate + 0.005) * scale + 0.5


def test_a_recipe_without_a_name_is_refused_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--recipe", "=token_budget=1"])
    assert exit_info.value.code == 2
    assert "recipe '=token_budget=1' has no name" in capsys.readouterr().err
