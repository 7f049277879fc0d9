"""The final run's pilot gates: each task's entry of the iteration that passed its gates
(docs/instrument.md), named as the instrument's configuration names the task.

    python docs/instrument/merge_gates.py > docs/instrument/gates.json
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (iteration, the task's name there, its name in the instrument's configuration)
SOURCES = (
    ("iteration-16", "search", "search"),
    ("iteration-23", "search", "search@think0"),
    ("iteration-6", "multi_hop", "multi_hop"),
    ("iteration-22", "key_door", "key_door"),
)

tasks = []
for iteration, name, renamed in SOURCES:
    payload = json.loads((HERE / iteration / "gates.json").read_text())
    (entry,) = [t for t in payload["tasks"] if t["task"] == name]
    tasks.append(dict(entry, task=renamed, iteration=iteration))
gates = json.loads((HERE / SOURCES[0][0] / "gates.json").read_text())["gates"]
print(json.dumps({"config": "pilot-gates", "gates": gates, "tasks": tasks}, indent=1))
