"""cluster.setup (issue 35, build 2): the site's shell lines, one job.sbatch line each with its exit
code checked; refused in one line when an entry is not one line of text. The lines themselves
run on the local cluster in tests/cluster/test_setup_lines.py."""

from __future__ import annotations

import pytest

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema_cluster import setup_lines
from slurmtrain.common.validation_login import check_setup


def test_a_string_is_its_lines_and_a_list_its_items() -> None:
    assert setup_lines("module load cuda\n\nsource env.sh\n") == [
        "module load cuda",
        "source env.sh",
    ]
    assert setup_lines(["module load cuda", " ", "conda activate x"]) == [
        "module load cuda",
        "conda activate x",
    ]
    assert setup_lines(None) == [] and setup_lines([]) == []
    check_setup("module load cuda\nsource env.sh")
    check_setup(["module load cuda", "source env.sh"])


@pytest.mark.parametrize(
    "setup, says",
    [
        (["module load a\nmodule load b"], "cluster.setup[0]="),
        ([3], "cluster.setup[0]=3: each entry is one shell line"),
        ({"a": 1}, "cluster.setup={'a': 1}: a list of shell lines"),
    ],
)
def test_an_entry_that_is_not_one_line_of_text_is_refused(setup: object, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_setup(setup)
    assert says in str(err.value) and len(str(err.value).splitlines()) == 1
