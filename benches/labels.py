"""The case names the GAE suite records and the report looks up (no imports, so that
`report.py` does not import the suite and the suite does not import the report)."""

from __future__ import annotations

MPO_GAE = "mpo_rs.gae_advantages"
MPO_GAE_UNIT = "mpo_rs.gae_advantages (γ=λ=1)"
MPO_GAE_WHITENED = "mpo_rs.gae_advantages + whitening (numpy)"
MPO_MAE = "mpo_rs.mae_advantages"
FLOOR = "memory floor: copy 2 inputs to 2 new arrays"
BANDWIDTH_FLOOR = "memory floor: copy 2 inputs into 2 preallocated arrays"
