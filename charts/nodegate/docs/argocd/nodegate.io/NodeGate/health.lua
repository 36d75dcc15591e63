-- Argo CD health of a NodeGate (resource.customizations.health.nodegate.io_NodeGate).
-- Reads the conditions the operator writes (docs/operations.md, "GitOps health"):
--   Stalled=True            -> Degraded    (a compartment stopped, nodes failed, the policy is missing)
--   Disabled or Paused=True -> Suspended   (a person stopped new work; running stages finish)
--   Reconciling=True        -> Progressing (nodes in progress or waiting; the removal running)
--   Ready=True              -> Healthy
-- and Progressing while the operator has not yet observed the latest spec (observedGeneration).
local hs = {}

local function verdict(status, message)
  hs.status = status
  hs.message = message
  return hs
end

local function conditions_of(o)
  local found = {}
  if o.status ~= nil and o.status.conditions ~= nil then
    for _, c in ipairs(o.status.conditions) do
      found[c.type] = c
    end
  end
  return found
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function say(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil or obj.status.conditions == nil then
  return verdict("Progressing", "Waiting for the NodeGate operator to report a status")
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  return verdict("Progressing", "Waiting for the NodeGate operator to act on generation " .. tostring(generation))
end

local c = conditions_of(obj)
if is_true(c.Stalled) then
  return verdict("Degraded", say(c.Stalled, "The rollout needs a person"))
end
if obj.metadata.deletionTimestamp ~= nil then
  return verdict("Progressing", say(c.Deleting, "The gate is being deleted"))
end
if is_true(c.Disabled) then
  return verdict("Suspended", say(c.Disabled, "The gate is disabled"))
end
if is_true(c.Paused) then
  local progress = ""
  if obj.status.progress ~= nil then
    progress = " (" .. obj.status.progress .. " nodes complete)"
  end
  return verdict("Suspended", "spec.paused is true: no new work starts" .. progress)
end
if is_true(c.Reconciling) then
  return verdict("Progressing", say(c.Reconciling, "The rollout is in progress"))
end
if is_true(c.Ready) then
  return verdict("Healthy", say(c.Ready, "Every matched node is complete"))
end
return verdict("Progressing", say(c.Ready, "The rollout is not complete"))
