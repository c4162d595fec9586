"""Detecting and repairing ranks whose models have drifted apart.

Both functions are collective: every rank calls them with the same model
structure (same parameter and buffer names in the same order).
"""

import torch

from gyre import _gyre
from gyre.exceptions import DivergenceError, InvalidArgumentError

from gyre.objects import broadcast_object
from gyre.ops import broadcast_async_, synchronize

from .functions import Staged, broadcast_optimizer_state, named_tensors


def _model_tensors(model, what):
    """[(name, tensor)]: a module's parameters then its buffers, or the pairs
    of a state_dict / iterable of (name, tensor)."""
    if isinstance(model, torch.nn.Module):
        return list(model.named_parameters()) + list(model.named_buffers())
    return named_tensors(model, what)


def _staged(model, what):
    items = _model_tensors(model, what)
    if not items:
        raise InvalidArgumentError(f"{what}: the model has no parameters or buffers")
    return [(name, Staged(t)) for name, t in items]


def check_consistency(model):
    """Fingerprints every parameter and buffer on every rank and compares.

    Raises DivergenceError on every rank if any differ; its message names each
    diverged tensor and which ranks hold which value, and its ``mismatches``
    attribute maps each name to {digest: [ranks]}. Returns None when all agree.
    """
    staged = _staged(model, "check_consistency")
    mismatches = _gyre.fingerprint_check([(name, s.tensor) for name, s in staged])
    if not mismatches:
        return None
    by_name = {name: {digest: list(ranks) for digest, ranks in groups} for name, groups in mismatches}
    lines = []
    for name, groups in by_name.items():
        holders = "; ".join(f"ranks {ranks} hold value {digest:016x}" for digest, ranks in groups.items())
        lines.append(f"  '{name}': {holders}")
    raise DivergenceError(
        f"{len(by_name)} of {len(staged)} parameters/buffers differ across ranks:\n" + "\n".join(lines)
        + "\nrepair with gyre.torch.resync(model)", by_name)


def resync(model, policy="newest", optimizer=None):
    """Makes every rank's parameters and buffers equal again, and sets every
    rank's committed step to the agreed one.

    policy="newest": every rank takes the values of the rank that committed
    the most steps (ties: the lowest rank). policy="average": floating-point
    tensors become their average over ranks; integer and bool buffers (such
    as BatchNorm's num_batches_tracked) cannot be averaged and take the
    newest rank's values.

    With `optimizer`, its state (momentum buffers, ...) is also made equal:
    under either policy every rank takes the newest rank's optimizer state,
    since a rank that skipped a step holds stale optimizer state as well.
    """
    if policy not in ("newest", "average"):
        raise InvalidArgumentError(f"resync: unknown policy {policy!r} (expected 'newest' or 'average')")
    staged = _staged(model, "resync")
    # While ranks are at different steps every other collective fails, so
    # the newest rank is read from this rank's version vector now, and the
    # ranks agree on rank 0's reading once resync has equalised the steps.
    steps = _gyre.version_vector()
    newest = steps.index(max(steps))  # index() gives the lowest rank on ties
    if policy == "newest":
        by_resync, by_broadcast = staged, []
    else:
        by_resync = [(n, s) for n, s in staged if s.tensor.is_floating_point()]
        by_broadcast = [(n, s) for n, s in staged if not s.tensor.is_floating_point()]
    if by_resync:
        _gyre.resync([(name, s.tensor) for name, s in by_resync], policy)
    else:  # nothing to average: the step counts are equalised all the same
        _gyre.resync([], "newest")
    if by_broadcast or optimizer is not None:
        root = broadcast_object(newest, root_rank=0, name="resync.newest")
        handles = [broadcast_async_(s.tensor, root, name=f"resync.{name}") for name, s in by_broadcast]
        for h in handles:
            synchronize(h)
        if optimizer is not None:
            broadcast_optimizer_state(optimizer, root_rank=root)
    for _, s in staged:
        s.write_back()
