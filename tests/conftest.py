import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The test models are tiny: one thread is faster than two (no threading overhead) and gives the same
# numbers on every machine. Tests about threading set the count themselves.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread_again():
    """A test that ran mech.py with --threads leaves torch as it found it."""
    yield
    torch.set_num_threads(1)


def cli(args, capsys) -> tuple:
    """(exit code, stdout, stderr) of `python mech.py ARGS`, run in this process."""
    import mech
    try:
        mech.main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
