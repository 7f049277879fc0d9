"""Integrations with the training and data stacks mpo_rs drops into.

Each submodule imports its framework, so nothing here is imported by ``import mpo_rs``:

* :mod:`mpo_rs.integrations.verl` -- a verl plug-in (the ``verl`` extra):
  advantage estimators and the ``mpo`` policy-loss mode, registered in verl's registries
  when the module is imported. verl imports it in every process through the
  ``verl.plugins`` entry point.
* :mod:`mpo_rs.integrations.trl` -- ``MPOGRPOTrainer``, TRL's ``GRPOTrainer`` with MPO's
  per-token advantages and turn-ratio loss (the ``trl`` extra).
* :mod:`mpo_rs.integrations.openrlhf` -- an OpenRLHF experience maker (advantages and
  returns) and ``MPOPolicyLoss`` (the ``openrlhf`` extra).
* :mod:`mpo_rs.integrations.ray` -- advantages over a ``ray.data.Dataset`` of rollout
  rows (the ``ray`` extra), for logs larger than one machine.

See ``docs/integrations.md``.
"""
