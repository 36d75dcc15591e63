"""Pure admission rules: `review -> verdict`, no I/O (an import-linter contract keeps it so).

`decide.plan_lookups` says what a review needs to know about other objects, `decide.validate` and
`decide.mutate` judge it from those `Facts`. The aiohttp server in `gate.admission.server` is a thin
adapter around these functions.
"""
