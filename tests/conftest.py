import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The test models are tiny: one thread is faster than two (no threading overhead) and gives the same
# numbers on every machine. Tests about threading set the count themselves.
torch.set_num_threads(1)
