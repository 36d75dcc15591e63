"""The rollout engine: which nodes of a NodeGate start now. Pure: no I/O, no clock.

The operator calls `plan` on every reconcile with a snapshot and performs what it returns:

    result = plan(gate, policy, nodes, now=datetime.now(timezone.utc), gates=all_gates)
    for start in result.starts:        # one write per node: batch number, status, cordon
        begin(start.node, batch=start.batch)
    for node, wait in result.waits.items():
        label(node, wait.status, wait.message)
    gate.status.compartments = result.statuses()

Nothing here remembers anything between calls. The durable state is what the operator already
writes: per compartment `status.compartments` (batch, batchSize, consecutiveFailures, state), and per
node the batch number it was picked into (its `state.<gate>` annotation). A plan from that state
alone is the same after a restart, so a crash at any line is harmless. Write the statuses before the
nodes: if the node writes are lost, the next plan picks the same batch again (same nodes, same
number); if the status write is lost, the batch numbers on the nodes still hold the batch together,
and a status lost altogether is rebuilt by replaying the batches recorded on the nodes.

In a compartment status, `batch` is the batch running, or between batches the number the next batch
will get (it moves past a batch exactly when that batch is judged, which is what keeps a batch from
being judged twice); `batchSize` is that batch's size, planned until it is picked. `inProgress`
counts the nodes disrupted now (in flight, or failed and still cordoned), the figure the ceiling
bounds. `state` is `complete` once every node finished; failed ones show in `failed`.

Rules, in the order they apply:

**Compartments.** A gate with a DeploymentPolicy has the policy's compartments, in the order listed,
plus `__default__` (the policy's `default` budget and strategy) for the nodes no selector claims.
A node several selectors match belongs to the *first one listed*. A gate with `interruptionBudget`
and no policy has one compartment `__default__` with that budget and a fixed strategy whose batch is
the whole ceiling (so the budget alone sets the pace; failures are still bounded: batchThreshold 100,
failureThreshold 3, safetyLimit 50); with neither, the budget is 100%. The gate's nodes are those its
selector picks, minus those labelled `nodegate.io/ignore=true`, plus any it still holds (in flight or
disrupted) after their labels changed.

**Budget.** `ceiling = Budget.ceiling(matched)`: a percent of the compartment's nodes rounded down but
at least 1, or a count (at most matched; `count: 0` freezes the compartment). It is a hard ceiling
on nodes disrupted at once, whatever the strategy says: nodes in flight and failed nodes still
cordoned by NodeGate count against it, and a node counts from the moment it is picked.

**Batches are sticky.** A picked node stays in its batch until it finishes (complete or failed);
nothing new starts in a compartment while any of its nodes is in flight. When the last node of a
batch finishes, the batch is judged, and the next one is picked in the same step with size
`min(strategy size, ceiling - disrupted now, nodes ready to start)`. A batch is picked whole: it is
never topped up later, even when budget frees up while it runs.

**Soak** (a compartment whose policy entry carries `health`, `gate.lifecycle.soak`): a node whose
round went through soaks, serving, until it proved healthy. It holds no slot of the ceiling and is
not finished either: its batch is judged only once every node of it left the soak (passed, or failed
as `Unhealthy`). As nodes leave the budget before their batch is judged, such a batch is not capped
by the room: its planned size is kept, and it fills in pick order as slots free (while nodes of it
are in a round or soaking), never past its size nor the nodes there are; the ceiling still bounds
the nodes in a round at once. Waiting nodes say `batch-soaking` while only soaks hold the batch.

**Strategies** (sizes computed from the size the finished batch actually had; see
`gate.rollout.strategy`): fixed returns to initialBatch after a good batch, linear adds delta,
exponential multiplies by growthFactor. A batch is good when successes/size >= batchThreshold%.
After a failed batch while the compartment's progress (complete/matched) is below safetyLimit%, the
next batch shrinks: fixed halves, linear subtracts delta, exponential divides by growthFactor
(rounded down, never below 1). A failed batch at or above safetyLimit% keeps the size. A good batch
resets the run of failures; `failureThreshold` failed batches in a row stop the compartment (None:
never). A stopped compartment starts nothing until a person resumes it: `resume` clears the stop and
the run of failures (the operator calls it on `nodegate resume` or a spec change).
With `rollback` (`gate.lifecycle.rollback`) the first failed batch stops the compartment, whatever
`failureThreshold` says, and the status records `rollback: {batch}` while it stays stopped: its nodes
go back to the previous revision before a person decides.

**Windows.** With `windows` set, new nodes start only inside one (see `gate.rollout.window`: end
before start runs past midnight and belongs to the day it opens; wall-clock time in the window's
IANA zone; an unknown zone never opens). Running nodes always finish. A paused gate starts nothing.

**Across gates** (see `gate.rollout.priority`): only a strictly lower `priority` number goes first.
`sequencing: node`: a node waits while a higher-priority gate that selects it is not complete on it;
`sequencing: all`: the gate waits until every higher-priority gate is complete on all its nodes.
Equal priorities do not wait for each other.

**Protected pods.** A node where pods matching the gate's `podNonInterruptLabels` still run is not
picked, cordoned or counted against the budget: the planner takes the next node, so one long job
holds back its own node only (`Wait` reason `protected-pods`, status `blocked`, naming the pods).
When they end, the node is picked in its turn. With `cordonWhileProtected` the gate cordons such
nodes, so that no new job lands there, but only once every node free of protected pods has started,
and only within the budget left: a held node counts against the ceiling until it finishes, and
starts without taking more (`CompartmentPlan.hold`; `release` lets them go if the setting is turned
off).

**Order.** Within a compartment, nodes are picked by the SHA-256 of their name (see
`gate.rollout.order`): reproducible everywhere, the same for every gate, and spread across racks
and zones that node names usually encode.

**Why a node waits** (`Plan.waits`, most fundamental reason first): stopped, paused, priority,
protected-pods, outside-window, batch-running, batch-soaking, budget-full, queued. `stopped`, `priority` and
`protected-pods` make the node's status `blocked`; the others `waiting`.

`simulate` runs the same planner forward assuming every node succeeds: the batches `nodegate plan`
prints.
"""

from gate.rollout.compartment import CompartmentSpec, PolicyMismatch, assign_compartment, compartments_of
from gate.rollout.order import order_key
from gate.rollout.planner import (
    ClosedBatch,
    CompartmentPlan,
    Plan,
    Start,
    Wait,
    WaitReason,
    plan,
    resume,
)
from gate.rollout.simulate import SimulatedBatch, SimulatedCompartment, Simulation, simulate
from gate.rollout.snapshot import GateProgress, NodeSnapshot
from gate.rollout.strategy import BatchResult, close_batch, next_batch_size
from gate.rollout.window import window_contains, windows_open

__all__ = [
    "BatchResult",
    "ClosedBatch",
    "CompartmentPlan",
    "CompartmentSpec",
    "GateProgress",
    "NodeSnapshot",
    "Plan",
    "PolicyMismatch",
    "SimulatedBatch",
    "SimulatedCompartment",
    "Simulation",
    "Start",
    "Wait",
    "WaitReason",
    "assign_compartment",
    "close_batch",
    "compartments_of",
    "next_batch_size",
    "order_key",
    "plan",
    "resume",
    "simulate",
    "window_contains",
    "windows_open",
]
