"""The operator: watches, reconcile, node operations, package Jobs, status, leader election."""
