-- Argo CD health of a DeploymentPolicy (resource.customizations.health.nodegate.io_DeploymentPolicy).
-- A policy is configuration: Healthy once the operator has read its latest spec (Ready=True),
-- Degraded while the spec cannot be used (Stalled=True), Progressing until the operator has seen it.
local hs = {}

local function verdict(status, message)
  hs.status = status
  hs.message = message
  return hs
end

local waiting = "Waiting for the NodeGate operator to read the policy"
if obj.status == nil or obj.status.conditions == nil then
  return verdict("Progressing", waiting)
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  return verdict("Progressing", "Waiting for the NodeGate operator to read generation " .. tostring(generation))
end
local ready = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    return verdict("Degraded", c.message or "The policy cannot be used")
  end
  if c.type == "Ready" then
    ready = c
  end
end
if ready ~= nil and ready.status == "True" then
  return verdict("Healthy", ready.message or "The operator read the policy")
end
return verdict("Progressing", waiting)
