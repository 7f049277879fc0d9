"""The verl plug-in in verl's v1 trainer: multi-output sessions grouped for mpo_grpo as verl
groups them for grpo, one rollout per output for the other estimators, and the hook installed
when verl imports the trainer in a fresh process."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from test_integration_verl import agent_rows, algo_config, last_llm_token  # noqa: E402

from mpo_rs.integrations import verl as plugin  # noqa: E402
from mpo_rs.integrations.verl import values_hook  # noqa: E402

# --------------------------------------------------------------------------- v1 trainer sessions

V1_UTILS = "verl.trainer.ppo.v1.utils"


@pytest.fixture
def v1_utils(monkeypatch):
    """verl's v1-trainer utilities, imported through the import system and so through the
    plug-in's import hook, as in a trainer. The v1 package needs transfer_queue (the v1
    trainer's data store); where it is absent the package's __init__ and the replay buffer
    (utils.py reads one constant from it) are stood in for. utils.py itself is verl's."""
    pytest.importorskip("verl.trainer.ppo.ray_trainer")
    plugin.install_values_hook()
    try:
        import transfer_queue  # noqa: F401
    except ImportError:
        package = types.ModuleType("verl.trainer.ppo.v1")
        package.__path__ = [str(Path(core_algos.__file__).parent / "v1")]
        replay_buffer = types.ModuleType("verl.trainer.ppo.v1.replay_buffer")
        replay_buffer.DAPO_FILTERED_REWARD_COUNTS_KEY = "_dapo_filtered_reward_counts"
        monkeypatch.setitem(sys.modules, package.__name__, package)
        monkeypatch.setitem(sys.modules, replay_buffer.__name__, replay_buffer)
        monkeypatch.delitem(sys.modules, V1_UTILS, raising=False)
        yield importlib.import_module(V1_UTILS)
        sys.modules.pop(V1_UTILS, None)  # it belongs to the stub package
    else:
        yield importlib.import_module(V1_UTILS)


def v1_advantages(utils, estimator, rewards, mask, uid, keys, config, values=None):
    """``compute_advantage_for_multi_trajectories`` called as the v1 trainer's
    ``_compute_advantage`` calls it, on a fresh batch (it writes into the batch)."""
    from verl import DataProto

    tensors = {"token_level_rewards": rewards.clone(), "response_mask": mask.clone()}
    if values is not None:
        tensors["values"] = values
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.asarray(uid, dtype=object)})
    out = utils.compute_advantage_for_multi_trajectories(
        data,
        batch_keys=list(keys),
        adv_estimator=estimator,
        gamma=config.gamma,
        lam=config.lam,
        num_repeat=1,
        norm_adv_by_std_in_grpo=config.get("norm_adv_by_std_in_grpo", True),
        config=config,
    )
    return out.batch["advantages"], out.batch["returns"]


def sessions_batch(seed: int, cols: int = 24):
    """Multi-output sessions as the v1 agent loop writes them: keys ``{uid}_{session}_{output}``,
    4 prompts (uids with an underscore, as verl's rsplit allows) of 2 to 4 sessions each, 1 to
    4 outputs per session and one session of 11 (so output 10 must sort after 9), rows
    shuffled. Every output has token rewards; verl's grouping reads only a session's last."""
    rng = np.random.default_rng(seed)
    keys, uid = [], []
    for p in range(4):
        for session in range(int(rng.integers(2, 5))):
            outputs = 11 if (p, session) == (1, 0) else int(rng.integers(1, 5))
            for output in range(outputs):
                keys.append(f"prompt_{p}_{session}_{output}")
                uid.append(f"prompt_{p}")
    order = rng.permutation(len(keys))
    keys, uid = [keys[i] for i in order], np.array([uid[i] for i in order], dtype=object)
    rows = len(keys)
    mask = agent_rows(rng, rows, cols)
    rewards = (0.1 * rng.standard_normal((rows, cols)) * mask).astype(np.float32)
    rewards[np.arange(rows), last_llm_token(mask)] += rng.integers(0, 2, rows).astype(np.float32)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    return torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(mask), uid, keys


def test_v1_trainer_groups_mpo_grpo_sessions_as_it_groups_grpo(v1_utils):
    # issue 11 item 9: a session of two outputs and one of one, one prompt.
    rewards = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(3, 2, dtype=torch.int64)
    uid, keys = ["p"] * 3, ["p_0_0", "p_0_1", "p_1_0"]
    config = algo_config()
    want, _ = v1_advantages(v1_utils, "grpo", rewards, mask, uid, keys, config)
    s = 2**-0.5
    torch.testing.assert_close(want.float(), torch.tensor([[s, s], [s, s], [-s, -s]]), rtol=1e-5, atol=1e-5)
    got, returns = v1_advantages(v1_utils, "mpo_grpo", rewards, mask, uid, keys, config)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, got)
    # The trainer's own binding (trainer_base imports the function by name) is the hooked one.
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    assert getattr(compute_advantage_for_multi_trajectories, "__mpo_rs_values_hook__", False)
    assert values_hook._SESSION_ESTIMATOR.get() is None


@pytest.mark.parametrize("norm_std", [True, False])
@pytest.mark.parametrize("seed", [40, 41])
def test_v1_trainer_mpo_grpo_equals_grpo_on_uneven_multi_output_sessions(v1_utils, seed, norm_std):
    rewards, _, mask, uid, keys = sessions_batch(seed)
    config = algo_config(norm_adv_by_std_in_grpo=norm_std)
    want, want_ret = v1_advantages(v1_utils, "grpo", rewards, mask, uid, keys, config)
    got, returns = v1_advantages(v1_utils, "mpo_grpo", rewards, mask, uid, keys, config)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, want_ret.float(), rtol=1e-5, atol=1e-5)
    # The batch is one where grouping matters: one output per rollout gives other numbers.
    per_output, _ = plugin.compute_mpo_grpo_advantage(rewards, mask, config, uid)
    assert not torch.allclose(per_output, got, atol=1e-3)


def test_v1_trainer_gives_the_other_estimators_one_rollout_per_output_as_verl_does(v1_utils):
    rewards, values, mask, uid, keys = sessions_batch(42)
    config = algo_config(lam=0.8, beta=0.5)  # MAE's options: the other estimators refuse them
    # verl groups sessions only for grpo: its rloo (and so mpo_rloo) counts every output.
    want, _ = v1_advantages(v1_utils, "rloo", rewards, mask, uid, keys, algo_config())
    got, _ = v1_advantages(v1_utils, "mpo_rloo", rewards, mask, uid, keys, algo_config())
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    # The MAE family and mpo_gae: each output its own trajectory, as called directly.
    for name in ("mpo_mae_grpo", "mpo_mae_rloo", "mpo_mae", "mpo_gae"):
        config = algo_config() if name == "mpo_gae" else algo_config(lam=0.8, beta=0.5)
        fn = core_algos.get_adv_estimator_fn(name)
        critic = name in plugin.CRITIC_ESTIMATORS
        want, want_ret = fn(rewards, mask, config, uid, **({"values": values} if critic else {}))
        got, returns = v1_advantages(v1_utils, name, rewards, mask, uid, keys, config, values if critic else None)
        torch.testing.assert_close(got, want, msg=name)
        torch.testing.assert_close(returns, want_ret, msg=name)


def test_v1_trainer_mpo_mae_grpo_is_grpo_only_on_one_output_sessions(v1_utils):
    rewards, _, mask, uid, keys = sessions_batch(43)
    config = algo_config(lam=1.0, beta=0.0)
    outcome = torch.zeros_like(rewards)  # an outcome reward, where MAE at lam=1, beta=0 is GRPO
    outcome[torch.arange(len(keys)), torch.from_numpy(last_llm_token(mask.numpy()))] = rewards.sum(-1)
    grpo, _ = v1_advantages(v1_utils, "grpo", outcome, mask, uid, keys, config)
    mae_grpo, _ = v1_advantages(v1_utils, "mpo_mae_grpo", outcome, mask, uid, keys, config)
    assert not torch.allclose(mae_grpo, grpo.float(), atol=1e-3)  # the documented gap
    one_output = [f"{key}_0" for key in keys]  # every row its own session
    grpo, _ = v1_advantages(v1_utils, "grpo", outcome, mask, uid, one_output, config)
    mae_grpo, _ = v1_advantages(v1_utils, "mpo_mae_grpo", outcome, mask, uid, one_output, config)
    torch.testing.assert_close(mae_grpo, grpo.float(), rtol=1e-5, atol=1e-5)


def test_v1_session_grouping_refuses_to_pass_off_verls_grpo(v1_utils, monkeypatch):
    # If verl's grouping reached an unhooked compute_advantage it would have run verl's grpo.
    ray_trainer = sys.modules["verl.trainer.ppo.ray_trainer"]
    monkeypatch.setattr(v1_utils, "compute_advantage", ray_trainer.compute_advantage.__wrapped__)
    rewards, _, mask, uid, keys = sessions_batch(44)
    with pytest.raises(RuntimeError, match="'mpo_grpo' could not be grouped by session"):
        v1_advantages(v1_utils, "mpo_grpo", rewards, mask, uid, keys, algo_config())
    assert values_hook._SESSION_ESTIMATOR.get() is None


def test_a_fresh_process_hooks_the_v1_trainer_when_verl_imports_it():
    # Nothing but `import verl` loads the plug-in; its import hook patches ray_trainer and
    # then v1.utils as they execute, and leaves sys.meta_path once both are patched.
    pytest.importorskip("verl.trainer.ppo.ray_trainer")
    installed = [ep for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.name == "mpo_rs"]
    if not installed:
        pytest.skip("the installed mpo-rs metadata predates the entry point; rebuild the package")
    script = (
        "import sys, types, importlib\n"
        "import verl\n"
        "try:\n"
        "    import transfer_queue\n"
        "except ImportError:\n"
        "    from verl.trainer.ppo import core_algos\n"
        "    import os\n"
        "    pkg = types.ModuleType('verl.trainer.ppo.v1')\n"
        "    pkg.__path__ = [os.path.join(os.path.dirname(core_algos.__file__), 'v1')]\n"
        "    rb = types.ModuleType('verl.trainer.ppo.v1.replay_buffer')\n"
        "    rb.DAPO_FILTERED_REWARD_COUNTS_KEY = '_dapo_filtered_reward_counts'\n"
        "    sys.modules[pkg.__name__], sys.modules[rb.__name__] = pkg, rb\n"
        "from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories as f\n"
        "from verl.trainer.ppo.v1 import utils\n"
        "assert f.__mpo_rs_values_hook__ and utils.compute_advantage.__mpo_rs_values_hook__\n"
        "assert not [x for x in sys.meta_path if type(x).__name__ == '_PatchAfterImport']\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", plugin.VALUES_HOOK_ENV)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
