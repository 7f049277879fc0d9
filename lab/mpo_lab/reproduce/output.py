"""Where ``reproduce`` writes: the claim of its output directory, by the output-safety rule
of rust/logs, so that a directory it did not write, or the runs of another configuration,
are never written over."""

from __future__ import annotations

from pathlib import Path

from mpo_rs.exceptions import InvalidOptionError
from mpo_rs.outputs import check_output_dir
from mpo_rs.outputs import claim_output_dir as native_claim

__all__ = ["claim_output_dir"]


def claim_output_dir(out: Path, config_hash: str, *, overwrite: bool) -> None:
    """Takes ``out`` for a run of the configuration ``config_hash``, by the output-safety
    rule of rust/logs (:func:`mpo_rs.outputs.claim_output_dir`): a new or empty directory, or
    an earlier output of ``reproduce`` with the same configuration (its finished runs are
    resumed). A directory that reproduce did not write, or one of another configuration,
    is refused with InvalidOptionError unless ``overwrite``; nothing is deleted."""
    try:
        previous = check_output_dir(out, "reproduce", overwrite=overwrite, label="--out")
    except InvalidOptionError as e:
        # Advise --overwrite only where it would lift the refusal (not for a file, a FIFO,
        # a device, a dangling link or an input: those messages say what helps).
        if overwrite or not _overwrite_helps(out):
            raise
        raise InvalidOptionError(f"{e}, or pass --overwrite to write into it anyway") from None
    if previous is not None and previous != config_hash and not overwrite:
        raise InvalidOptionError(
            f"--out {out} holds the runs of another configuration ({previous}, not {config_hash}); "
            "choose a new directory, or pass --overwrite to write this one's beside them"
        )
    native_claim(out, "reproduce", config_hash, overwrite=overwrite, label="--out")


def _overwrite_helps(out: Path) -> bool:
    try:
        check_output_dir(out, "reproduce", overwrite=True, label="--out")
    except InvalidOptionError:
        return False
    return True
