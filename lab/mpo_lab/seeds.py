"""Every seed of a run, derived in one place: which tasks it plays (the layout of task
seeds, disjoint by construction) and the seed of each of its random streams.

A *task seed* is what an environment is reset with. The reproduction draws them for four
purposes: the **held-out** tasks (evaluation, the base policies' success, the warm-up's
held-out explained variance, the chance estimate, the diagnosis log: the same for every
run), and for each run seed s the **training** tasks, the base policy's **demonstrations**
and the critic **warm-up**'s rollouts. :func:`task_seeds` is the one place that derives
them and :func:`decode` inverts it: a task seed names at most one (purpose, run seed,
index), so no two purposes -- and no two run seeds -- ever share a task, for every run
seed :func:`check_run_seeds` accepts (``0 <= s < MAX_RUN_SEED``).

Layout: a task seed is ``block * 2**32 + index`` with ``index < 2**32``; every block is
below ``2**32``, so every task seed is below ``2**64`` (the width the built-in
environments' ``SeedStream`` reads: a wider seed would alias a narrower one).

- The held-out tasks are block :data:`HELD_OUT_BLOCK` (256): task seeds ``2**40 + index``.
- Run seeds below 256 and from 768 to 1023 (:func:`keeps_first_layout`; every committed
  configuration's: QUICK's 0, FULL's 1-12, PILOT's 1001-1004) keep the blocks their results
  were made with: training s, demonstrations 512 + s, warm-up 1024 + s. Those six ranges
  of blocks and block 256 do not meet.
- Every other run seed s gets the tagged block ``2**31 + purpose * 2**24 + s`` (training 0,
  demonstrations 1, warm-up 2), above every block of the first layout.

The random streams (:class:`Stream`): each generator a run draws from is seeded by one
function below, from the run seed s. They are the formulas the committed runs were made
with; changing one changes every result, so a new stream gets a new formula here, never an
edit of an old one. The learner's own two streams (minibatch order, and the critic's
minibatches) come from ``LearnerConfig.seed`` inside the library.

Numpy-free and torch-free: :mod:`.config` validates its seeds with it.
"""

from __future__ import annotations

from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError

__all__ = [
    "HELD_OUT",
    "HELD_OUT_BLOCK",
    "INDEX_LIMIT",
    "MAX_RUN_SEED",
    "PURPOSES",
    "Stream",
    "check_run_seeds",
    "decode",
    "keeps_first_layout",
    "task_seeds",
]

HELD_OUT = "held_out"
PURPOSES = ("train", "demo", "warmup")
"""The per-run purposes, in the order of their tag."""
INDEX_LIMIT = 1 << 32
"""Tasks per (purpose, run seed): an index is below this."""
HELD_OUT_BLOCK = 256
MAX_RUN_SEED = 1 << 24
"""Run seeds are ``0 <= s < MAX_RUN_SEED``."""
_FIRST_OFFSET = {"train": 0, "demo": 512, "warmup": 1024}
_TAGGED = 1 << 31


def keeps_first_layout(run_seed: int) -> bool:
    """Whether ``run_seed`` keeps the first layout's blocks (below 256, or 768-1023)."""
    return 0 <= run_seed < 256 or 768 <= run_seed < 1024


def check_run_seeds(first: object, count: object) -> None:
    """Run seeds ``first, ..., first + count - 1`` as a configuration gives them: ints,
    ``count >= 1``, all in ``[0, MAX_RUN_SEED)``; else InvalidOptionError naming them."""
    for name, value, least in (("first_seed", first, 0), ("seeds", count, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidOptionError(f"{name} must be an int >= {least}, got {value!r}")
    assert isinstance(first, int) and isinstance(count, int)
    if first + count > MAX_RUN_SEED:
        raise InvalidOptionError(
            f"run seeds must be below {MAX_RUN_SEED} (2**24), so that their tasks stay apart from each other's "
            f"and from the held-out ones; first_seed {first} with {count} seed(s) reaches {first + count - 1}"
        )


def _block(purpose: str, run_seed: int | None) -> int:
    if purpose == HELD_OUT:
        if run_seed is not None:
            raise InvalidConfigError("held-out tasks are the same for every run: give run_seed=None")
        return HELD_OUT_BLOCK
    if purpose not in PURPOSES:
        raise InvalidConfigError(f"unknown task purpose {purpose!r}; known: {HELD_OUT}, {', '.join(PURPOSES)}")
    if isinstance(run_seed, bool) or not isinstance(run_seed, int) or not 0 <= run_seed < MAX_RUN_SEED:
        raise InvalidConfigError(f"run seed must be an int in [0, {MAX_RUN_SEED}), got {run_seed!r}")
    if keeps_first_layout(run_seed):
        return _FIRST_OFFSET[purpose] + run_seed
    return _TAGGED + (PURPOSES.index(purpose) << 24) + run_seed


def task_seeds(purpose: str, run_seed: int | None, start: int, count: int) -> range:
    """The task seeds of indices ``start, ..., start + count - 1`` of ``purpose``
    (``"held_out"`` with ``run_seed=None``, or one of :data:`PURPOSES` with the run seed).
    Raises InvalidConfigError for an index outside ``[0, 2**32)`` (a budget that large)."""
    block = _block(purpose, run_seed)
    if start < 0 or count < 0 or start + count > INDEX_LIMIT:
        raise InvalidConfigError(
            f"{purpose} tasks {start}..{start + count - 1} of run seed {run_seed}: at most {INDEX_LIMIT} (2**32) "
            "tasks per purpose and run seed"
        )
    first = block * INDEX_LIMIT + start
    return range(first, first + count)


def decode(task_seed: int) -> tuple[str, int | None, int] | None:
    """``(purpose, run seed, index)`` of a task seed :func:`task_seeds` gives (run seed
    None for the held-out tasks), or None for one it never gives."""
    if not 0 <= task_seed < INDEX_LIMIT * INDEX_LIMIT:
        return None
    block, index = divmod(task_seed, INDEX_LIMIT)
    if block == HELD_OUT_BLOCK:
        return HELD_OUT, None, index
    if block >= _TAGGED:
        tag, run_seed = divmod(block - _TAGGED, 1 << 24)
        if tag < len(PURPOSES) and not keeps_first_layout(run_seed):
            return PURPOSES[tag], run_seed, index
        return None
    for purpose, offset in _FIRST_OFFSET.items():
        if keeps_first_layout(block - offset):
            return purpose, block - offset, index
    return None


class Stream:
    """The seed of each random stream of run seed ``s`` (an int for ``torch.Generator``'s
    ``manual_seed``, a list for ``numpy.random.default_rng``)."""

    @staticmethod
    def weights(s: int) -> int:
        """``torch.manual_seed``: a policy's initial weights (every arm of s starts alike)."""
        return s

    @staticmethod
    def training(s: int) -> int:
        """The sampler's draws over a run's training updates."""
        return s

    @staticmethod
    def evaluation(s: int, update: int) -> int:
        """The sampler's draws of the held-out evaluation at ``update``."""
        return s * 7919 + update

    @staticmethod
    def diagnosis(s: int) -> int:
        """The sampler's draws of the end-of-run rollout log ``mpo-rs diagnose`` reads."""
        return s + 1

    @staticmethod
    def base_success(s: int) -> int:
        """The sampler's draws of a base policy's held-out success."""
        return s * 7919 + 104729

    @staticmethod
    def policy_rollouts(s: int, first_task_seed: int) -> int:
        """The sampler's draws of a policy's rollouts on tasks from ``first_task_seed`` on
        (the critic warm-up's, the held-out explained variance's)."""
        return s * 31 + first_task_seed % 1000003

    @staticmethod
    def gate_rollouts(s: int) -> int:
        """The sampler's draws of the base-policy gates' rollouts."""
        return s * 7 + 3

    @staticmethod
    def demonstrations(s: int) -> list[int]:
        """numpy: the noise of a noisy oracle's demonstrations (cloning's data)."""
        return [s, 0x5EED]

    @staticmethod
    def warmup_minibatches(s: int) -> list[int]:
        """numpy: the critic warm-up's minibatch order."""
        return [s, 0xC41]

    @staticmethod
    def reference_fits(s: int) -> list[int]:
        """numpy: the on-policy reference critic's held-out split of each fit."""
        return [s, 0x4EF]

    PROBES = 0
    """numpy: a user env's probes and chance estimate, and a demonstrator's trial episode
    (the same for every run: they check the env, not a run)."""
