"""What a reconcile returns (`gate.controller.result`): the earliest look at a key wins, as in the queue."""

from __future__ import annotations

from gate.controller.result import DONE, look, merged, replan
from gate.controller.triggers import GateKey, NodeKey


def test_results_merge_to_the_earliest_look_of_each_key_and_every_gate_to_plan() -> None:
    node = NodeKey("g", "n1")
    result = merged([look(node, 5.0), look(node), look(GateKey("g"), 2.5), replan(["g"]), DONE, replan(["h"])])
    assert result.looks == {node: 0.0, GateKey("g"): 2.5}
    assert result.replan == {"g", "h"}
    assert merged([]) == DONE and not DONE.looks and not DONE.replan
