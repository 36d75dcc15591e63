"""Tools that tests and benchmarks use to judge NodeGate from the outside; never imported by NodeGate.

* `gate.testing.invariants`: the safety invariants of a rollout as a pure checker (events in,
  violations out), so recorded event sequences can be judged in unit tests;
* `gate.testing.watcher`: the checker fed by watches of its own on a real API server;
* `gate.testing.chaos`: the chaos harness (a rollout on a dev cluster while operators, the API server
  and etcd are killed and restarted) that `bench/chaos` and `tests/chaos` drive.

The import-linter contract puts this package above every other layer, so production code cannot
import it.
"""
