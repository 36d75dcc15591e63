-- Argo CD health of a DeploymentPolicy (resource.customizations.health.nodegate.io_DeploymentPolicy).
-- A policy is configuration: Healthy once the operator has read its latest spec (Ready=True),
-- Degraded while the spec cannot be used (Stalled=True), Progressing until the operator has seen it.
local hs = {}

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the NodeGate operator to read the policy"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the NodeGate operator to read generation " .. tostring(generation)
  return hs
end

local ready = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = c.message or "The policy cannot be used"
    return hs
  end
  if c.type == "Ready" then
    ready = c
  end
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "The operator read the policy"
  return hs
end
hs.status = "Progressing"
hs.message = "Waiting for the NodeGate operator to read the policy"
return hs
