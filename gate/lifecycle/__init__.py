"""Pure: the per-node package state machine, the dependency DAG, interrupt merging."""
