"""examples/ddp_train.py, an unmodified-style DDP script, runs on the gyre
backend in this job and trains (it checks its own result: identical
parameters on every rank, accuracy well above chance)."""

import importlib.util
import pathlib

import torch.distributed as dist

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def test_ddp_example_trains():
    spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # The script initialises the default group itself; other test modules
    # initialise it again when they need it.
    if dist.is_initialized():
        dist.destroy_process_group()
    assert example.main(["--epochs", "1", "--batch-size", "64"]) == 0
    assert not dist.is_initialized()
