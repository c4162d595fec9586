"""Compares two parameter files saved by the launcher tests:

    python compare.py A B exact|close [KEY]

exact: bit for bit (two ranks: a sum of two values does not depend on the
order); close: within float32 rounding of sums in another order (three or
more ranks: gloo's ring and gyre's add in different orders). Exit status 1
if they differ, with the largest difference."""
import sys

import torch


def load(path, key):
    value = torch.load(path)
    return value[key] if key else value


a_path, b_path, mode = sys.argv[1:4]
key = sys.argv[4] if len(sys.argv) > 4 else None
a, b = load(a_path, key), load(b_path, key)
diff = (a - b).abs().max().item() if a.shape == b.shape else float("inf")
same = torch.equal(a, b) if mode == "exact" else torch.allclose(a, b, rtol=1e-5, atol=1e-6)
print(f"{a_path} vs {b_path}: {'same' if same else 'DIFFERENT'} ({mode}; max |a-b| {diff:.3g})")
sys.exit(0 if same else 1)
