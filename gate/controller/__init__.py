"""The operator: watches, reconcile, node operations, stage pods, status, leader election."""
